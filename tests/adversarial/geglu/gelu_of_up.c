/* expect: wrong -- gate and up swapped: gelu_tanh(up) * gate */
#include <stdint.h>
#include <math.h>
void geglu(const float *gate, const float *up, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float u = up[i], z = 0.7978845608f * (u + 0.044715f * u * u * u);
        y[i] = 0.5f * u * (1.0f + tanhf(z)) * gate[i];
    }
}
