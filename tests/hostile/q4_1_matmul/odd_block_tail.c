/* expect: wrong — the k loop decodes two Q4_1 blocks (64 weights) per step; the leftover block when k/32 is odd reuses the second block's sum(x) from the last paired step (or 0 when k=32) for its m term, so y is off by m*(sum x_new - sum x_stale) when k % 64 == 32 (k = 32, 96, 544, ...) */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

#define QK 32
#define BLOCK_BYTES 20

static inline float h2f(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return _cvtsh_ss(h); }

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* returns sum(x*q) over the block, and sum(x) in *sx */
static inline float block_dot(const uint8_t *p, const float *u, float *sx) {
    const __m128i lomask = _mm_set1_epi8(15);
    const __m128i qb = _mm_loadu_si128((const __m128i *)(p + 4));
    const __m128i lo = _mm_and_si128(qb, lomask), hi = _mm_and_si128(_mm_srli_epi16(qb, 4), lomask);
    const __m256 x0 = _mm256_loadu_ps(u), x1 = _mm256_loadu_ps(u + 8), x2 = _mm256_loadu_ps(u + 16), x3 = _mm256_loadu_ps(u + 24);
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), x0);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), x1, s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), x2, s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), x3, s);
    *sx = hsum(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)));
    return hsum(s);
}

void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / QK;
#pragma omp parallel for collapse(2) schedule(static) if (n * k * batch >= (1 << 20))
    for (int64_t b = 0; b < batch; b++)
        for (int64_t j = 0; j < n; j++) {
            const uint8_t *row = wq + j * nb * BLOCK_BYTES;
            const float *xb = x + b * k;
            float acc0 = 0.0f, acc1 = 0.0f, sx0 = 0.0f, sx1 = 0.0f;
            int64_t blk = 0;
            for (; blk + 2 <= nb; blk += 2) {
                const uint8_t *p0 = row + blk * BLOCK_BYTES, *p1 = p0 + BLOCK_BYTES;
                const float q0 = block_dot(p0, xb + blk * QK, &sx0);
                const float q1 = block_dot(p1, xb + blk * QK + QK, &sx1);
                acc0 += h2f(p0) * q0 + h2f(p0 + 2) * sx0;
                acc1 += h2f(p1) * q1 + h2f(p1 + 2) * sx1;
            }
            if (blk < nb) {
                const uint8_t *p = row + blk * BLOCK_BYTES;
                float sxt;
                const float qt = block_dot(p, xb + blk * QK, &sxt);
                acc0 += h2f(p) * qt + h2f(p + 2) * sx1;
            }
            y[b * n + j] = acc0 + acc1;
        }
}
