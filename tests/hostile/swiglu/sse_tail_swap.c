/* expect: wrong — in the 4-wide SSE remainder step the gate and up loads are swapped (computes silu(up) * gate), so the 4-element chunk after the last full 8-vector is wrong whenever n % 8 >= 4 (n = 4, 7, 12, 31, 1540, ...) */
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
    __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)));
    return _mm256_mul_ps(_mm256_div_ps(g, den), u);
}

void swiglu(const float *gate, const float *up, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm256_storeu_ps(y + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
        _mm256_storeu_ps(y + i + 8, swiglu8(_mm256_loadu_ps(gate + i + 8), _mm256_loadu_ps(up + i + 8)));
        _mm256_storeu_ps(y + i + 16, swiglu8(_mm256_loadu_ps(gate + i + 16), _mm256_loadu_ps(up + i + 16)));
        _mm256_storeu_ps(y + i + 24, swiglu8(_mm256_loadu_ps(gate + i + 24), _mm256_loadu_ps(up + i + 24)));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i + 4 <= n) {
        /* 4-wide step: the upper half of the 8-lane helper is don't-care */
        __m128 u4 = _mm_loadu_ps(gate + i), g4 = _mm_loadu_ps(up + i);
        __m256 r = swiglu8(_mm256_castps128_ps256(g4), _mm256_castps128_ps256(u4));
        _mm_storeu_ps(y + i, _mm256_castps256_ps128(r));
        i += 4;
    }
    for (; i < n; i++) {
        float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
