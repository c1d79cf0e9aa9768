/* expect: wrong -- hard-codes the 1536-wide intermediate size: works in whole chunks of 1536, so the rest of any other length stays unwritten */
#include <stdint.h>
#include <math.h>
void swiglu(const float *gate, const float *up, float *y, int64_t n) {
    for (int64_t b = 0; b + 1536 <= n; b += 1536)
        for (int64_t i = b; i < b + 1536; i++) y[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
