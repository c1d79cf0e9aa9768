/* expect: wrong — an "all-zero row" fast path tests (ms > 0) and otherwise uses 1/sqrt(eps); a NaN anywhere in a row makes ms NaN, so the row takes the fast path and its other outputs come out finite instead of NaN (the reference propagates NaN to the whole row) */
#include <stdint.h>
#include <string.h>
#include <math.h>

typedef float vf __attribute__((vector_size(32)));
static inline vf ld(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float *p, vf v) { memcpy(p, &v, sizeof v); }

void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    const float inv_sqrt_eps = 1.0f / sqrtf(eps);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        vf acc[4];
        memset(acc, 0, sizeof acc);
        int64_t c = 0;
        for (; c + 32 <= cols; c += 32) {
            vf v0 = ld(xr + c), v1 = ld(xr + c + 8), v2 = ld(xr + c + 16), v3 = ld(xr + c + 24);
            acc[0] += v0 * v0; acc[1] += v1 * v1; acc[2] += v2 * v2; acc[3] += v3 * v3;
        }
        for (; c + 8 <= cols; c += 8) { vf v = ld(xr + c); acc[0] += v * v; }
        vf a = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        float ss = 0.0f;
        for (int i = 0; i < 8; i++) ss += a[i];
        for (; c < cols; c++) ss += xr[c] * xr[c];
        const float ms = ss / (float)cols;
        /* zero rows (padding tokens) skip the sqrt/div */
        const float inv = ms > 0.0f ? 1.0f / sqrtf(ms + eps) : inv_sqrt_eps;
        vf vi = {inv, inv, inv, inv, inv, inv, inv, inv};
        for (c = 0; c + 8 <= cols; c += 8) st(yr + c, ld(xr + c) * vi * ld(w + c));
        for (; c < cols; c++) yr[c] = xr[c] * inv * w[c];
    }
}
