/* expect: wrong — the max pass loads whole 8-float vectors up to cols rounded up ("extra lanes only feed a max"), reading up to 7 floats past the row when cols % 8 != 0: past the end of x on the last row (NaN there, or any value far above the row, turns the row into NaN or underflowed zeros), and the next row's head on the others (cols=7, 17, 1001 with a following row ~100 larger) */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365448f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static void softmax_row(const float *x, float *y, int64_t cols) {
    /* max: over-reading the row by < 8 lanes is harmless for a max */
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (int64_t c = 0; c < cols; c += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + c));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float m = _mm_cvtss_f32(h);

    const __m256 vmax = _mm256_set1_ps(m);
    __m256 vs = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c), vmax));
        _mm256_storeu_ps(y + c, e);
        vs = _mm256_add_ps(vs, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vs);
    float s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; c < cols; c++) { y[c] = expf(x[c] - m); s += y[c]; }
    const float inv = 1.0f / s;
    const __m256 vi = _mm256_set1_ps(inv);
    for (c = 0; c + 8 <= cols; c += 8) _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_loadu_ps(y + c), vi));
    for (; c < cols; c++) y[c] *= inv;
}

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= 65536)
    for (int64_t r = 0; r < rows; r++) softmax_row(x + r * cols, y + r * cols, cols);
}
