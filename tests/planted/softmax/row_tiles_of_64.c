/* planted: many rows -- from 128 rows up, rows are processed in tiles of 64 and a partial last tile is dropped (rows % 64 != 0 stay unwritten); no seed case has more than 72 rows */
#include <stdint.h>
#include <math.h>
static void softmax_row(const float *xr, float *yr, int64_t cols) {
    float m = -INFINITY;
    double s = 0.0;
    for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
    for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
    const float inv = (float)(1.0 / s);
    for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (rows < 128) {
        for (int64_t r = 0; r < rows; r++) softmax_row(x + r * cols, y + r * cols, cols);
        return;
    }
    const int64_t tiles = rows / 64;   /* bug: should round up */
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t r = t * 64; r < (t + 1) * 64; r++) softmax_row(x + r * cols, y + r * cols, cols);
}
