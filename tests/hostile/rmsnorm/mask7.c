/* expect: wrong — the hand-typed AVX2 tail-mask table has 6 lanes instead of 7 in its rem=7 entry, so when cols % 8 == 7 (cols=7, 15, 583, ...) the last column is left out of the sum of squares and its output is never written */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

static const int32_t tail_mask[8][8] __attribute__((aligned(32))) = {
    { 0,  0,  0,  0,  0,  0,  0,  0},
    {-1,  0,  0,  0,  0,  0,  0,  0},
    {-1, -1,  0,  0,  0,  0,  0,  0},
    {-1, -1, -1,  0,  0,  0,  0,  0},
    {-1, -1, -1, -1,  0,  0,  0,  0},
    {-1, -1, -1, -1, -1,  0,  0,  0},
    {-1, -1, -1, -1, -1, -1,  0,  0},
    {-1, -1, -1, -1, -1, -1,  0,  0},
};

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void norm_row(const float *x, const float *w, float *y, int64_t cols, float eps) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        __m256 v0 = _mm256_loadu_ps(x + c), v1 = _mm256_loadu_ps(x + c + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    for (; c + 8 <= cols; c += 8) {
        __m256 v = _mm256_loadu_ps(x + c);
        a0 = _mm256_fmadd_ps(v, v, a0);
    }
    const int64_t rem = cols - c;
    const __m256i m = _mm256_load_si256((const __m256i *)tail_mask[rem]);
    if (rem) {
        __m256 v = _mm256_maskload_ps(x + c, m);
        a1 = _mm256_fmadd_ps(v, v, a1);
    }
    const float inv = 1.0f / sqrtf(hsum(_mm256_add_ps(a0, a1)) / (float)cols + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (c = 0; c + 8 <= cols; c += 8)
        _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), vinv), _mm256_loadu_ps(w + c)));
    if (rem) {
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(x + c, m), vinv), _mm256_maskload_ps(w + c, m));
        _mm256_maskstore_ps(y + c, m, v);
    }
}

void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
#pragma omp parallel for schedule(static) if (rows >= 64)
    for (int64_t r = 0; r < rows; r++)
        norm_row(x + r * cols, w, y + r * cols, cols, eps);
}
