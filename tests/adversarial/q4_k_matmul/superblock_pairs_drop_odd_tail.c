/* expect: wrong -- two super-blocks per iteration (512 columns, the scales of both decoded
   together) and no tail loop: an odd number of super-blocks loses its last 256 columns. Right on
   every timed shape (k = 2048 and 8192) and on any even count; wrong for k = 256, 768, 1280,
   2304 and the like (Gemma 3 1B's 1152 is not a K-quant row at all, but 6912 / 256 = 27 is) */
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

static void scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static double superblock(const uint8_t *bp, const float *xb) {
    const double d = h2f(bp), dmin = h2f(bp + 2);
    double acc = 0.0;
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
    return acc;
}

void q4_k_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / 256;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *row = wq + i * nb * 144;
            const float *xr = x + b * k;
            double acc = 0.0;
            for (int64_t blk = 0; blk + 2 <= nb; blk += 2)
                acc += superblock(row + blk * 144, xr + blk * 256) + superblock(row + (blk + 1) * 144, xr + (blk + 1) * 256);
            y[b * n + i] = (float)acc;
        }
}
