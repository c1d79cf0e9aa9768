/* expect: wrong — the inv_freq table is filled 8 entries at a time with no remainder loop, so when head_dim/2 is not a multiple of 8 (head_dim = 2, 4, 34, 36, 72, 100, ...) the last few frequencies are uninitialised stack memory and those output columns are garbage (correct at head_dim 64, 128) */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

#define MAX_HALF 256

void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    float inv[MAX_HALF] __attribute__((aligned(32)));
    const float l2t = log2f(theta);
    /* 8 at a time so exp2f vectorises */
    for (int64_t j = 0; j + 8 <= half; j += 8)
        for (int l = 0; l < 8; l++) inv[j + l] = exp2f(-(float)(2 * (j + l)) / (float)head_dim * l2t);

    for (int64_t t = 0; t < tokens; t++) {
        float cs[MAX_HALF] __attribute__((aligned(32))), sn[MAX_HALF] __attribute__((aligned(32)));
        const float p = (float)pos[t];
        for (int64_t j = 0; j < half; j++) { const float a = p * inv[j]; cs[j] = cosf(a); sn[j] = sinf(a); }
        for (int64_t h = 0; h < heads; h++) {
            const float *x1 = x + (t * heads + h) * head_dim, *x2 = x1 + half;
            float *y1 = y + (t * heads + h) * head_dim, *y2 = y1 + half;
            int64_t j = 0;
            for (; j + 8 <= half; j += 8) {
                __m256 a = _mm256_loadu_ps(x1 + j), b = _mm256_loadu_ps(x2 + j);
                __m256 c = _mm256_load_ps(cs + j), s = _mm256_load_ps(sn + j);
                _mm256_storeu_ps(y1 + j, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
                _mm256_storeu_ps(y2 + j, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
            }
            for (; j < half; j++) {
                y1[j] = x1[j] * cs[j] - x2[j] * sn[j];
                y2[j] = x2[j] * cs[j] + x1[j] * sn[j];
            }
        }
    }
}
