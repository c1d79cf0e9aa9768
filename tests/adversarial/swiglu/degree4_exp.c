/* expect: wrong — sigmoid from a degree-4 polynomial exp (2^f keeping Taylor's first three terms, relative error up to 6.8e-6, ~55x torch's fp32 exp): inside rtol 1e-5, so the fixed tolerance took it (not_faster); on the outputs up to ~50x torch fp32's own error */
#include <stdint.h>
#include <math.h>
#include <string.h>
static inline float exp_p4(float v) {
    if (v < -87.0f) return 0.0f;
    if (v > 88.0f) return INFINITY;
    const float t = v * 1.44269504f;
    const float k = nearbyintf(t), f = t - k;
    float p = 0.0096188132f;
    p = p * f + 0.055781543f;
    p = p * f + 0.24022651f;
    p = p * f + 0.69314718f;
    p = p * f + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return p * s;
}
void swiglu(const float *gate, const float *up, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = gate[i] / (1.0f + exp_p4(-gate[i])) * up[i];
}
