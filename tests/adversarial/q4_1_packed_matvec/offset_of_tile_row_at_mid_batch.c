/* expect: wrong — a path for mid-size batches (6 to 15 rows, between the one-row loop and the 16-row tile) takes the rows four at a time and adds the offset term m * xs of a tile's first row to all four: rows 2-4 of each tile are off. Before the batches 1..64 of the model shapes the seed cases had batches 1-5, 16-33 and 64, never 6-15 */
#include <stdint.h>
#include <string.h>

#define QK 32
#define ROWS 8
#define REC 160

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

/* weight row i of block j against activation row b: the integer dot product, d and m */
static int32_t qdot(const uint8_t *rec, int r, const int8_t *xq) {
    int32_t s = 0;
    for (int kk = 0; kk < 4; kk++)
        for (int t = 0; t < 4; t++) {
            const uint8_t byte = rec[kk * 32 + r * 4 + t];
            s += (int32_t)(byte & 15) * xq[4 * kk + t] + (int32_t)(byte >> 4) * xq[16 + 4 * kk + t];
        }
    return s;
}

void q4_1_packed_matvec(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, float *y,
                        int64_t n, int64_t k, int64_t batch) {
    const int64_t nb = k / QK;
    const int mid = batch >= 6 && batch <= 15;
    for (int64_t i = 0; i < n; i++) {
        const int64_t g = i / ROWS;
        const int r = (int)(i % ROWS);
        for (int64_t b = 0; b < batch; b++) {
            const int64_t bo = mid ? b - b % 4 : b;  /* the tile's first row, on the mid-size path */
            double acc = 0.0;
            for (int64_t j = 0; j < nb; j++) {
                const uint8_t *rec = w + (g * nb + j) * REC;
                const double d = h2f(rec + 128 + 2 * r), m = h2f(rec + 144 + 2 * r);
                acc += (double)xd[b * nb + j] * d * (double)qdot(rec, r, xq + b * k + j * QK)
                       + m * (double)xs[bo * nb + j];
            }
            y[b * n + i] = (float)acc;
        }
    }
}
