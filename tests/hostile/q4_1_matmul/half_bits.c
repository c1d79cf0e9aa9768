/* expect: wrong — fp16 block scales are widened with the shift-and-rebias bit trick (exponent + 112), which only holds for normal halves: subnormal d or m (|d| < 6.1e-5, i.e. blocks of very small weights) become 2^-14 * (1 + mant) instead of mant * 2^-24 (zero is special-cased and right) */
#include <stdint.h>
#include <string.h>
#include <math.h>

#define QK 32
#define BLOCK_BYTES 20

static inline float half_to_float(uint16_t h) {
    if ((h & 0x7fff) == 0) {                     /* +-0 */
        uint32_t z = (uint32_t)(h & 0x8000) << 16;
        float f; memcpy(&f, &z, 4); return f;
    }
    uint32_t bits = ((uint32_t)(h & 0x8000) << 16) | ((((uint32_t)h & 0x7fff) << 13) + ((uint32_t)112 << 23));
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / QK;
#pragma omp parallel for schedule(static) if (n * k >= (1 << 20))
    for (int64_t j = 0; j < n; j++) {
        const uint8_t *row = wq + j * nb * BLOCK_BYTES;
        for (int64_t b = 0; b < batch; b++) {
            const float *xb = x + b * k;
            float acc = 0.0f;
            for (int64_t blk = 0; blk < nb; blk++) {
                const uint8_t *p = row + blk * BLOCK_BYTES;
                uint16_t hd, hm;
                memcpy(&hd, p, 2);
                memcpy(&hm, p + 2, 2);
                const float d = half_to_float(hd), m = half_to_float(hm);
                const float *xs = xb + blk * QK;
                float sxq = 0.0f, sx = 0.0f;
#pragma omp simd reduction(+:sxq, sx)
                for (int i = 0; i < 16; i++) {
                    const uint8_t qb = p[4 + i];
                    sxq += xs[i] * (float)(qb & 15) + xs[i + 16] * (float)(qb >> 4);
                    sx += xs[i] + xs[i + 16];
                }
                acc += d * sxq + m * sx;
            }
            y[b * n + j] = acc;
        }
    }
}
