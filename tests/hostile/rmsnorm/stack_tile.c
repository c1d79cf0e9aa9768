/* expect: wrong — each row is staged in a fixed 8192-float aligned stack tile; rows longer than 8192 columns (e.g. cols=16384 or 65536) overflow the tile and smash the stack (crash or garbage) */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

#define TILE 8192  /* hidden sizes up to 8192 */

static void norm_row(const float *xr, const float *w, float *y, int64_t cols, float eps) {
    float tile[TILE] __attribute__((aligned(64)));
    memcpy(tile, xr, (size_t)cols * sizeof(float));   /* aligned, cache-hot copy for both passes */
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        __m256 v0 = _mm256_load_ps(tile + c), v1 = _mm256_load_ps(tile + c + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    for (; c + 8 <= cols; c += 8) {
        __m256 v = _mm256_load_ps(tile + c);
        a0 = _mm256_fmadd_ps(v, v, a0);
    }
    a0 = _mm256_add_ps(a0, a1);
    float lanes[8];
    _mm256_storeu_ps(lanes, a0);
    float ss = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; c < cols; c++) ss += tile[c] * tile[c];
    const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    c = 0;
    for (; c + 8 <= cols; c += 8)
        _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(tile + c), vinv), _mm256_loadu_ps(w + c)));
    for (; c < cols; c++) y[c] = tile[c] * inv * w[c];
}

void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++)
        norm_row(x + r * cols, w, y + r * cols, cols, eps);
}
