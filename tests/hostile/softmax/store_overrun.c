/* expect: wrong — the normalise pass runs whole 8-float vectors up to cols rounded up, so when cols % 8 != 0 each row writes up to 7 floats past its end; inner rows are repaired by the next row, but the last row writes past the end of y (cols=7, 17, 1001, ...) */
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

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        int64_t c = 0;
        __m256 vm = _mm256_set1_ps(-INFINITY);
        for (; c + 8 <= cols; c += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(xr + c));
        float lanes[8];
        _mm256_storeu_ps(lanes, vm);
        for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
        for (; c < cols; c++) m = xr[c] > m ? xr[c] : m;

        vm = _mm256_set1_ps(m);
        __m256 vs = _mm256_setzero_ps();
        for (c = 0; c + 8 <= cols; c += 8) vs = _mm256_add_ps(vs, exp8(_mm256_sub_ps(_mm256_loadu_ps(xr + c), vm)));
        _mm256_storeu_ps(lanes, vs);
        float s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
        for (; c < cols; c++) s += expf(xr[c] - m);

        /* recompute exp rather than re-reading a y scratch pass: one read stream instead of two */
        const __m256 vi = _mm256_set1_ps(1.0f / s);
        for (c = 0; c < cols; c += 8)
            _mm256_storeu_ps(yr + c, _mm256_mul_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(xr + c), vm)), vi));
    }
}
