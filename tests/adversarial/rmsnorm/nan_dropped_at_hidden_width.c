/* expect: wrong — a fast path for the benchmark's exact shapes (1, 8 or 128 rows of 576) "sanitises" non-finite inputs out of the sum of squares (so one NaN cannot poison a row); the reference propagates NaN to the whole row. Special values are only tried at edge and stress shapes, where the general path is right */
#include <stdint.h>
#include <math.h>
static void general(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
}
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    if (cols != 576 || (rows != 1 && rows != 8 && rows != 128)) { general(x, w, y, rows, cols, eps); return; }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * 576;
        float acc[8] = {0};
        for (int64_t c = 0; c < 576; c += 8)
            for (int k = 0; k < 8; k++) {
                const float v = isfinite(xr[c + k]) ? xr[c + k] : 0.0f;  /* "robust" */
                acc[k] += v * v;
            }
        const float ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        const float inv = 1.0f / sqrtf(ss / 576.0f + eps);
        for (int64_t c = 0; c < 576; c++) y[r * 576 + c] = xr[c] * inv * w[c];
    }
}
