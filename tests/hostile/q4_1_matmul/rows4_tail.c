/* expect: wrong — output rows are computed four at a time (x block loaded once for four weight rows); the leftover rows when n % 4 != 0 go through a one-row path that reads d and m from swapped offsets (m at byte 0, d at byte 2), so the last n % 4 outputs are wrong (n = 1, 5, 6, 7, 577, ...) */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

#define QK 32
#define BLOCK_BYTES 20

static inline float h2f(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return _cvtsh_ss(h); }

static inline float dot_q(const uint8_t *qs, const float *u) {
    float s = 0.0f;
#pragma omp simd reduction(+:s)
    for (int i = 0; i < 16; i++) s += u[i] * (float)(qs[i] & 15) + u[i + 16] * (float)(qs[i] >> 4);
    return s;
}

void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / QK, rb = nb * BLOCK_BYTES;
    const int64_t n4 = n & ~(int64_t)3;
#pragma omp parallel for collapse(2) schedule(static) if (n * k * batch >= (1 << 20))
    for (int64_t b = 0; b < batch; b++)
        for (int64_t j = 0; j < n4; j += 4) {
            const float *xb = x + b * k;
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
            for (int64_t blk = 0; blk < nb; blk++) {
                const float *u = xb + blk * QK;
                float sx = 0.0f;
#pragma omp simd reduction(+:sx)
                for (int i = 0; i < QK; i++) sx += u[i];
                const uint8_t *p0 = wq + j * rb + blk * BLOCK_BYTES, *p1 = p0 + rb, *p2 = p1 + rb, *p3 = p2 + rb;
                a0 += h2f(p0) * dot_q(p0 + 4, u) + h2f(p0 + 2) * sx;
                a1 += h2f(p1) * dot_q(p1 + 4, u) + h2f(p1 + 2) * sx;
                a2 += h2f(p2) * dot_q(p2 + 4, u) + h2f(p2 + 2) * sx;
                a3 += h2f(p3) * dot_q(p3 + 4, u) + h2f(p3 + 2) * sx;
            }
            float *yb = y + b * n + j;
            yb[0] = a0; yb[1] = a1; yb[2] = a2; yb[3] = a3;
        }
    for (int64_t b = 0; b < batch; b++)
        for (int64_t j = n4; j < n; j++) {
            const float *xb = x + b * k;
            float a = 0.0f;
            for (int64_t blk = 0; blk < nb; blk++) {
                const uint8_t *p = wq + j * rb + blk * BLOCK_BYTES;
                const float *u = xb + blk * QK;
                float sx = 0.0f;
                for (int i = 0; i < QK; i++) sx += u[i];
                const float m = h2f(p), d = h2f(p + 2);
                a += d * dot_q(p + 4, u) + m * sx;
            }
            y[b * n + j] = a;
        }
}
