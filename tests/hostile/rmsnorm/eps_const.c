/* expect: wrong — the eps argument is ignored and Llama's 1e-5 is baked in; shows when eps is far from 1e-5 (e.g. eps=1e-3 on unit-variance rows) or when rows are small-valued (mean(x^2) ~ 1e-4 with eps=1e-6) */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

#define RMS_EPS 1e-5f  /* Llama / SmolLM2 config value */

static void norm_row(const float *x, const float *w, float *y, int64_t cols) {
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
    a0 = _mm256_add_ps(a0, a1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    float ss = _mm_cvtss_f32(s);
    for (; c < cols; c++) ss += x[c] * x[c];
    const float inv = 1.0f / sqrtf(ss / (float)cols + RMS_EPS);
    const __m256 vinv = _mm256_set1_ps(inv);
    c = 0;
    for (; c + 8 <= cols; c += 8)
        _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), vinv), _mm256_loadu_ps(w + c)));
    for (; c < cols; c++) y[c] = x[c] * inv * w[c];
}

void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
#pragma omp parallel for schedule(static) if (rows >= 64)
    for (int64_t r = 0; r < rows; r++)
        norm_row(x + r * cols, w, y + r * cols, cols);
}
