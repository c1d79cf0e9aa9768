/* expect: wrong -- a half-to-float conversion that flushes subnormal fp16 values to zero. The
   format holds them and the quantiser writes them: d = max_scale / 63 falls below fp16's smallest
   normal (6.1e-5) for rows of small weights (k >= 4096 here, weights ~ 1/sqrt(k)), and the
   `special` dist has blocks with d or dmin = 3e-6; a min of 3e-6 * 63 on every weight of a
   sub-block adds up. Right on short rows of ordinary blocks */
#include <stdint.h>
#include <string.h>

static float h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu, b;
    float f;
    if (ex == 0) return sign ? -0.0f : 0.0f;
    b = sign | (ex == 31 ? 0x7f800000u | (man << 13) : ((ex + 112) << 23) | (man << 13));
    memcpy(&f, &b, sizeof f);
    return f;
}

static void scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

void q4_k_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / 256;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n; i++) {
            double acc = 0.0;
            for (int64_t blk = 0; blk < nb; blk++) {
                const uint8_t *bp = wq + (i * nb + blk) * 144;
                const float *xb = x + b * k + blk * 256;
                const double d = h2f(bp), dmin = h2f(bp + 2);
                for (int s = 0; s < 8; s++) {
                    int sc, m;
                    scale_min(s, bp + 4, &sc, &m);
                    const uint8_t *q = bp + 16 + 32 * (s / 2);
                    double t = 0.0, xs = 0.0;
                    for (int l = 0; l < 32; l++) {
                        const int v = s & 1 ? q[l] >> 4 : q[l] & 15;
                        t += v * (double)xb[32 * s + l];
                        xs += xb[32 * s + l];
                    }
                    acc += (double)(float)(d * sc) * t - (double)(float)(dmin * m) * xs;
                }
            }
            y[b * n + i] = (float)acc;
        }
}
