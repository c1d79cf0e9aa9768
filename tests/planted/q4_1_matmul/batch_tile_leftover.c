/* planted: batch tail -- rows of x are processed in tiles of 8 sharing each decoded block; after the tiles only ONE leftover row is computed, so batch > 8 with batch % 8 >= 2 leaves rows unwritten; seed batches are 1-5, 8 and 9 */
#include <stdint.h>
#include <math.h>
static float half_to_float(const uint8_t *p) {
    const uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    const int e = (h >> 10) & 31, man = h & 1023;
    float v = e == 0 ? ldexpf((float)man, -24) : e == 31 ? (man ? NAN : INFINITY) : ldexpf((float)(man | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}
#define BT 8
static void rows_tile(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t b0, int64_t cnt) {
    const int64_t nb = k / 32;
    for (int64_t r = 0; r < n; r++) {
        double acc[BT] = {0};
        for (int64_t j = 0; j < nb; j++) {
            const uint8_t *blk = wq + (r * nb + j) * 20;
            const float d = half_to_float(blk), m = half_to_float(blk + 2);
            for (int64_t b = 0; b < cnt; b++) {
                const float *xb = x + (b0 + b) * k + j * 32;
                float sq = 0.0f, sx = 0.0f;
                for (int i = 0; i < 16; i++) {
                    sq += xb[i] * (float)(blk[4 + i] & 15) + xb[i + 16] * (float)(blk[4 + i] >> 4);
                    sx += xb[i] + xb[i + 16];
                }
                acc[b] += (double)d * sq + (double)m * sx;
            }
        }
        for (int64_t b = 0; b < cnt; b++) y[(b0 + b) * n + r] = (float)acc[b];
    }
}
void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    const int64_t tile = batch < BT ? batch : BT;
    int64_t b0 = 0;
    for (; b0 + tile <= batch; b0 += tile) rows_tile(wq, x, y, n, k, b0, tile);
    if (b0 < batch) rows_tile(wq, x, y, n, k, b0, 1);   /* bug: should be batch - b0 rows */
}
