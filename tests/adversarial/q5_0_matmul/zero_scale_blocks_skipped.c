/* expect: wrong -- blocks whose scale is zero (or -0.0) are skipped as contributing nothing, so a
   NaN among their 32 activations never reaches y: the reference's row is NaN (0 * NaN), this
   kernel's is a number. Right on every case without special values */
#include <stdint.h>
#include <string.h>

static float h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu, b;
    float f;
    if (ex == 0) {
        f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    b = sign | (ex == 31 ? 0x7f800000u | (man << 13) : ((ex + 112) << 23) | (man << 13));
    memcpy(&f, &b, sizeof f);
    return f;
}

void q5_0_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / 32;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n; i++) {
            double acc = 0.0;
            for (int64_t blk = 0; blk < nb; blk++) {
                const uint8_t *bp = wq + (i * nb + blk) * 22;
                const float d = h2f(bp);
                if (d == 0.0f) continue;
                const float *xb = x + b * k + blk * 32;
                uint32_t qh;
                memcpy(&qh, bp + 2, sizeof qh);
                double t = 0.0;
                for (int l = 0; l < 16; l++) {
                    const int lo = (bp[6 + l] & 15) | (((qh >> l) & 1) << 4);
                    const int hi = (bp[6 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4);
                    t += (lo - 16) * (double)xb[l] + (hi - 16) * (double)xb[l + 16];
                }
                acc += d * t;
            }
            y[b * n + i] = (float)acc;
        }
}
