/* expect: wrong — the exp polynomial's lower clamp was widened to -103.9 "to keep denormal results", but 2^n is still built as (n+127)<<23, which wraps to -inf / huge negatives for n <= -128; any logit more than ~88.4 below its row max (wide-range logits, -inf or -1e4 mask values) poisons the whole row */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-103.972077f));   /* expf underflows to 0 only below ln(2^-150) */
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
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + c));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + c + 8));
    }
    m0 = _mm256_max_ps(m0, m1);
    float lanes[8];
    _mm256_storeu_ps(lanes, m0);
    float m = lanes[0];
    for (int i = 1; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    for (; c < cols; c++) m = x[c] > m ? x[c] : m;

    const __m256 vm = _mm256_set1_ps(m);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    for (c = 0; c + 16 <= cols; c += 16) {
        __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c), vm));
        __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8), vm));
        _mm256_storeu_ps(y + c, e0);
        _mm256_storeu_ps(y + c + 8, e1);
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
    }
    _mm256_storeu_ps(lanes, _mm256_add_ps(s0, s1));
    float s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; c < cols; c++) { float e = expf(x[c] - m); y[c] = e; s += e; }

    const float inv = 1.0f / s;
    const __m256 vi = _mm256_set1_ps(inv);
    for (c = 0; c + 8 <= cols; c += 8) _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_loadu_ps(y + c), vi));
    for (; c < cols; c++) y[c] *= inv;
}

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= 65536)
    for (int64_t r = 0; r < rows; r++) softmax_row(x + r * cols, y + r * cols, cols);
}
