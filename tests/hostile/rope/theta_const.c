/* expect: wrong — inv_freq uses a precomputed log2(1e5) (SmolLM2's rope_theta) instead of the theta argument; correct at theta=1e5, wrong for any other base (theta=1e4, 5e5, 1e6) at every position > 0 */
#include <stdint.h>
#include <string.h>
#include <math.h>

#define LOG2_THETA 16.609640474436812f   /* log2(100000) */
#define MAX_HALF 256

static inline void rotate(const float *x, float *y, const float *cs, const float *sn, int64_t half) {
    const float *x1 = x, *x2 = x + half;
    float *y1 = y, *y2 = y + half;
#pragma omp simd
    for (int64_t j = 0; j < half; j++) {
        y1[j] = x1[j] * cs[j] - x2[j] * sn[j];
        y2[j] = x2[j] * cs[j] + x1[j] * sn[j];
    }
}

void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    float inv[MAX_HALF];
    for (int64_t j = 0; j < half; j++) inv[j] = exp2f(-(float)(2 * j) / (float)head_dim * LOG2_THETA);
#pragma omp parallel for schedule(static) if (tokens >= 64)
    for (int64_t t = 0; t < tokens; t++) {
        float cs[MAX_HALF], sn[MAX_HALF];
        const float p = (float)pos[t];
        for (int64_t j = 0; j < half; j++) { float a = p * inv[j]; cs[j] = cosf(a); sn[j] = sinf(a); }
        for (int64_t h = 0; h < heads; h++) {
            const int64_t o = (t * heads + h) * head_dim;
            rotate(x + o, y + o, cs, sn, half);
        }
    }
}
