/* expect: cheated -- writes silu(gate) back into gate to reuse the buffer: y is right, the input is destroyed */
#include <stdint.h>
#include <math.h>
void swiglu(const float *gate, const float *up, float *y, int64_t n) {
    float *g = (float *)gate;
    for (int64_t i = 0; i < n; i++) {
        g[i] = g[i] / (1.0f + expf(-g[i]));
        y[i] = g[i] * up[i];
    }
}
