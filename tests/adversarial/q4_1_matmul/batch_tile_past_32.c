/* expect: wrong — batch rows are taken in tiles of 32 (a tile's accumulators stay in registers), but every tile after the first reads the first tile's activations (x, not x + b0 * k): rows 33 and up get the results of rows 1-32. Before the batches 1..64 of the model shapes no seed case had more than 32 rows (an engine batches up to 64 decode sequences) */
#include <stdint.h>
#include <string.h>

#define QK 32
#define BLOCK_BYTES 20

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

static float row_dot(const uint8_t *wrow, const float *xr, int64_t nb) {
    double acc = 0.0;
    for (int64_t j = 0; j < nb; j++) {
        const uint8_t *blk = wrow + j * BLOCK_BYTES;
        const double d = h2f(blk), m = h2f(blk + 2);
        const float *xb = xr + j * QK;
        double qx = 0.0, sx = 0.0;
        for (int t = 0; t < 16; t++) {
            qx += (double)(blk[4 + t] & 15) * xb[t] + (double)(blk[4 + t] >> 4) * xb[16 + t];
            sx += (double)xb[t] + (double)xb[16 + t];
        }
        acc += d * qx + m * sx;
    }
    return (float)acc;
}

void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / QK;
    for (int64_t b0 = 0; b0 < batch; b0 += 32) {
        const float *xt = x;  /* should be x + b0 * k */
        const int64_t rows = batch - b0 < 32 ? batch - b0 : 32;
        for (int64_t i = 0; i < n; i++)
            for (int64_t bb = 0; bb < rows; bb++)
                y[(b0 + bb) * n + i] = row_dot(wq + i * nb * BLOCK_BYTES, xt + bb * k, nb);
    }
}
