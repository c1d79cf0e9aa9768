/* expect: wrong — the row max uses _mm256_max_ps(v, m), which keeps m when v is NaN, and the exp polynomial clamps its argument with max_ps first, turning NaN into -87.3; a NaN (or +inf) logit is silently dropped and the row comes out finite where the reference gives NaN */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <immintrin.h>

static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365448f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626f));
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

static inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void softmax_row(const float *x, float *y, int64_t cols) {
    int64_t c = 0;
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    for (; c + 16 <= cols; c += 16) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + c), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + c + 8), m1);
    }
    for (; c + 8 <= cols; c += 8) m0 = _mm256_max_ps(_mm256_loadu_ps(x + c), m0);
    float m = hmax(_mm256_max_ps(m0, m1));
    for (; c < cols; c++) m = fmaxf(x[c], m);

    const __m256 vm = _mm256_set1_ps(m);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    for (c = 0; c + 16 <= cols; c += 16) {
        __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c), vm));
        __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8), vm));
        _mm256_storeu_ps(y + c, e0); _mm256_storeu_ps(y + c + 8, e1);
        s0 = _mm256_add_ps(s0, e0); s1 = _mm256_add_ps(s1, e1);
    }
    for (; c + 8 <= cols; c += 8) {
        __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c), vm));
        _mm256_storeu_ps(y + c, e0);
        s0 = _mm256_add_ps(s0, e0);
    }
    float s = hsum(_mm256_add_ps(s0, s1));
    if (c < cols) {
        float buf[8];
        int64_t rem = cols - c;
        for (int i = 0; i < 8; i++) buf[i] = i < rem ? x[c + i] : -INFINITY;
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(buf), vm));
        _mm256_storeu_ps(buf, e);
        for (int64_t i = 0; i < rem; i++) { y[c + i] = buf[i]; s += buf[i]; }
    }
    const __m256 vi = _mm256_set1_ps(1.0f / s);
    for (c = 0; c + 8 <= cols; c += 8) _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_loadu_ps(y + c), vi));
    for (; c < cols; c++) y[c] *= 1.0f / s;
}

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= 65536)
    for (int64_t r = 0; r < rows; r++) softmax_row(x + r * cols, y + r * cols, cols);
}
