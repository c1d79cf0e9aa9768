/* expect: wrong — rows longer than 8192 are split at the largest power of two (two passes that each fit L2), and the second pass runs whole tiles of 1024 columns only: k = 11008 (Llama 2 7B's and Qwen2.5 3B's down projection: 8192 + 2816) loses its last 768 columns, and so do 8960, 13824, 18944 and others. Right for k up to 8192 and for 16384, the only longer k the seed cases had before the intermediates of the model shapes */
#include <stdint.h>
#include <string.h>

#define QK 32
#define BLOCK_BYTES 34

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

static double blocks_dot(const uint8_t *wrow, const float *xr, int64_t j0, int64_t j1) {
    double acc = 0.0;
    for (int64_t j = j0; j < j1; j++) {
        const uint8_t *blk = wrow + j * BLOCK_BYTES;
        const float *xb = xr + j * QK;
        double qx = 0.0;
        for (int t = 0; t < QK; t++) qx += (double)(int8_t)blk[2 + t] * xb[t];
        acc += (double)h2f(blk) * qx;
    }
    return acc;
}

void q8_0_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / QK;
    int64_t split = k, rest = 0;
    if (k > 8192) {
        split = 8192;
        while (split * 2 <= k) split *= 2;
        rest = ((k - split) / 1024) * 1024;  /* whole tiles only */
    }
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *wrow = wq + i * nb * BLOCK_BYTES;
            const float *xr = x + b * k;
            const double first = blocks_dot(wrow, xr, 0, split / QK);
            const double second = blocks_dot(wrow, xr, split / QK, (split + rest) / QK);
            y[b * n + i] = (float)(first + second);
        }
}
