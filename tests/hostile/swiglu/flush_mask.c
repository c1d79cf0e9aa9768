/* expect: wrong — outputs for gate <= -80 are flushed to zero with an ordered (gate > -80) compare mask to keep denormals out of the next GEMM; the ordered compare is false for NaN, so NaN gates (and -inf gates, and NaN/inf `up` under a very negative gate) give 0 where the reference gives NaN/inf */
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

static inline __m256 swiglu8(__m256 g, __m256 u) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 y = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)))), u);
    /* silu(g) < 1e-33 for g <= -80: flush instead of emitting denormals */
    return _mm256_and_ps(y, _mm256_cmp_ps(g, _mm256_set1_ps(-80.0f), _CMP_GT_OQ));
}

void swiglu(const float *gate, const float *up, float *y, int64_t n) {
    int64_t nv = n & ~(int64_t)15;
#pragma omp parallel for schedule(static) if (n >= (1 << 17))
    for (int64_t i = 0; i < nv; i += 16) {
        _mm256_storeu_ps(y + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
        _mm256_storeu_ps(y + i + 8, swiglu8(_mm256_loadu_ps(gate + i + 8), _mm256_loadu_ps(up + i + 8)));
    }
    for (int64_t i = nv; i < n; i++) {
        float g = gate[i];
        y[i] = g > -80.0f ? g / (1.0f + expf(-g)) * up[i] : 0.0f;
    }
}
