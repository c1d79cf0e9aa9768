/* Scalar helpers shared by the native sources. Each library is built as one translation unit
 * with this text in front of it (library.source: decode.c; qlinear.source: qlinear.c, then
 * qstep.c), so the same function serves both without a header or an include path. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* IEEE half -> float, exactly (zero, subnormals, infinities and NaN included) */
static inline float sf_half(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    union { uint32_t u; float f; } v;
    if (e == 0x1F) v.u = sign | 0x7F800000u | (m << 13);
    else if (e) v.u = sign | ((e + 112) << 23) | (m << 13);
    else { v.f = (float)m * 5.9604644775390625e-8f; v.u |= sign; } /* zero, subnormal: m * 2^-24 */
    return v.f;
}

/* exp(x) as 2^n * p(r) (Cephes' polynomial), |rel err| < 2e-7 on [-87, 88]; plain arithmetic
 * so that loops over it vectorise. */
static inline float sf_exp(float x) {
    x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
    const float n = nearbyintf(x * 1.44269504f);
    const float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    float p = 1.98756912e-4f;
    p = p * r + 1.39819994e-3f;
    p = p * r + 8.33345205e-3f;
    p = p * r + 4.16657962e-2f;
    p = p * r + 1.66666657e-1f;
    p = p * r + 5.0e-1f;
    p = p * r * r + r + 1.f;
    union { float f; int32_t i; } u = {p};
    u.i += (int32_t)n << 23;
    return u.f;
}

/* RMSNorm of one row: y = x / sqrt(mean(x^2) + eps) * w (w NULL: no weight); y may be x */
static inline void sf_rms_norm(const float *x, const float *w, float *y, int64_t n, float eps) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.f / sqrtf(ss / (float)n + eps);
    if (w)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * r;
}

