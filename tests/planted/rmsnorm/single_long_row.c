/* planted: rows==1 -- a split-row fast path for a single row of >= 1024 columns drops the last chunk */
#include <stdint.h>
#include <math.h>
static void norm_rows(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
}
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    if (rows != 1 || cols < 1024) { norm_rows(x, w, y, rows, cols, eps); return; }
    const int64_t chunk = 256, nchunks = cols / chunk;   /* bug: the partial last chunk is lost */
    float ss = 0.0f;
    for (int64_t k = 0; k < nchunks; k++)
        for (int64_t c = k * chunk; c < (k + 1) * chunk; c++) ss += x[c] * x[c];
    const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
    for (int64_t c = 0; c < cols; c++) y[c] = x[c] * inv * w[c];
}
