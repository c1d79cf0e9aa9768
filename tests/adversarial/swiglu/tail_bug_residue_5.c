/* expect: wrong — the bundled vectorised kernel (16 + 8 wide), with its scalar tail sized from a hand-typed table that has a typo at remainder 5 (4 instead of 5): when n % 8 == 5 (13, 29, 37, 101, ...) element n-1 is never written. The seed widths only leave remainders 0, 1, 3 and 7 */
#include <stdint.h>
#include <string.h>
#include <math.h>

/* exp by Cody-Waite reduction and Cephes' degree-6 polynomial (~1 ulp); 0 below -86.5 (where
 * e^x < 3e-38), +inf above ~88.72; 2^n is built as 2^(n-1) * 2 so n = 128 fits */
static inline float exp_s(float x) {
    if (x != x) return x;  /* NaN in, NaN out: a NaN input must reach the result */
    if (!(x >= -86.5f)) return 0.0f;
    if (x > 89.0f) x = 89.0f;
    int32_t ni = (int32_t)(x * 1.44269504088896341f + 126.5f) - 126;
    float n = (float)ni;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t e = (ni + 126) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    return p * s * 2.0f;
}

static inline float silu_mul_s(float g, float u) {
    return g * u / (1.0f + exp_s(-g));
}

typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
static inline vf ld(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf splat(float a) { return (vf){0} + a; }
static inline vf sel(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
static inline vf exp_v(vf x) {
    vi nan = x != x;  /* NaN lanes come out NaN, as expf gives */
    vf x0 = x;
    vi keep = x >= -86.5f;
    x = sel(x > 89.0f, splat(89.0f), x);
    x = sel(keep, x, splat(-86.5f));
    vi ni = __builtin_convertvector(x * 1.44269504088896341f + 126.5f, vi) - 126;
    vf n = __builtin_convertvector(ni, vf);
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    vi e = (ni + 126) << 23;
    return sel(nan, x0, (vf)((vi)(p * (vf)e * 2.0f) & keep));
}

static inline vf silu_mul_v(vf g, vf u) {
    return g * u / (1.0f + exp_v(-g));
}

static const int tail_count[8] = {0, 1, 2, 3, 4, 4, 6, 7};

static void swiglu_range(const float *gate, const float *up, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        st(y + i + 0, silu_mul_v(ld(gate + i + 0), ld(up + i + 0)));
        st(y + i + 8, silu_mul_v(ld(gate + i + 8), ld(up + i + 8)));
    }
    for (; i + 8 <= n; i += 8) st(y + i, silu_mul_v(ld(gate + i), ld(up + i)));
    for (int k = 0; k < tail_count[n - i]; k++) y[i + k] = silu_mul_s(gate[i + k], up[i + k]);
}

void swiglu(const float *gate, const float *up, float *y, int64_t n) {
    swiglu_range(gate, up, y, n);
}
