/* expect: wrong -- reads the quants as uint8 (Q4_1 habits): every negative weight becomes q + 256 */
#include <stdint.h>
#include <string.h>
static float h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu, b;
    float f;
    if (ex == 0) { f = (float)man * 5.9604644775390625e-8f; return sign ? -f : f; }
    b = sign | (ex == 31 ? 0x7f800000u | (man << 13) : ((ex + 112) << 23) | (man << 13));
    memcpy(&f, &b, sizeof f);
    return f;
}
void q8_0_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / 32;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n; i++) {
            float acc = 0.0f;
            for (int64_t blk = 0; blk < nb; blk++) {
                const uint8_t *bp = wq + (i * nb + blk) * 34;
                const float d = h2f(bp);
                float t = 0.0f;
                for (int j = 0; j < 32; j++) t += x[b * k + blk * 32 + j] * (float)bp[2 + j];
                acc += d * t;
            }
            y[b * n + i] = acc;
        }
}
