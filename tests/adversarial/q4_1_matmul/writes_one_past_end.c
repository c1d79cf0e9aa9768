/* expect: wrong — correct values, but the blocked store loop writes one float past the end of y (a zeroed padding slot it "owns"): the guard zone after the output shows it */
#include <stdint.h>
#include <math.h>
static float half_to_float(const uint8_t *p) {
    const uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    const int e = (h >> 10) & 31, man = h & 1023;
    float v = e == 0 ? ldexpf((float)man, -24) : e == 31 ? (man ? NAN : INFINITY) : ldexpf((float)(man | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}
void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / 32;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < n; r++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < nb; j++) {
                const uint8_t *blk = wq + (r * nb + j) * 20;
                const float d = half_to_float(blk), m = half_to_float(blk + 2);
                const float *xb = x + b * k + j * 32;
                float dot = 0.0f, sx = 0.0f;
                for (int i = 0; i < 16; i++) {
                    dot += (float)(blk[4 + i] & 15) * xb[i] + (float)(blk[4 + i] >> 4) * xb[i + 16];
                    sx += xb[i] + xb[i + 16];
                }
                acc += d * dot + m * sx;
            }
            y[b * n + r] = acc;
        }
    y[batch * n] = 0.0f;  /* "padding" for a vector epilogue that never needed it */
}
