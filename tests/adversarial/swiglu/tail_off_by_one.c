/* expect: wrong -- blocks of 8, then a remainder loop that stops one short: the last element of a ragged length stays poisoned */
#include <stdint.h>
#include <math.h>
void swiglu(const float *gate, const float *up, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] = gate[i + k] / (1.0f + expf(-gate[i + k])) * up[i + k];
    for (; i < n - 1; i++) y[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
