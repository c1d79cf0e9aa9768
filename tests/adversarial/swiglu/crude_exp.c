/* expect: wrong -- sigmoid from a bit-trick exp (Schraudolph, ~4% error): far beyond rtol 1e-5 */
#include <stdint.h>
#include <math.h>
#include <string.h>
static inline float fast_exp(float v) {
    if (v < -87.0f) return 0.0f;
    if (v > 88.0f) return INFINITY;
    int32_t i = (int32_t)(12102203.0f * v) + 1064866805;
    float f; memcpy(&f, &i, 4);
    return f;
}
void swiglu(const float *gate, const float *up, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = gate[i] / (1.0f + fast_exp(-gate[i])) * up[i];
}
