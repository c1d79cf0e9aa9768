/* planted: rows -- wrong when rows > 1024 (rows past a fixed table of 1024 are never written); the largest seed shape has 512 rows */
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    float inv[1024];
    const int64_t n = rows > 1024 ? 1024 : rows;
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * cols;
        double ss = 0.0;  /* exact enough for any row length: the planted bug is elsewhere */
        for (int64_t c = 0; c < cols; c++) ss += (double)xr[c] * xr[c];
        inv[r] = 1.0f / sqrtf(ss / (float)cols + eps);
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < cols; c++)
            y[r * cols + c] = x[r * cols + c] * inv[r] * w[c];
}
