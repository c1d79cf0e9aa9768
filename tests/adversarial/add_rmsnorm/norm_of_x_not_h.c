/* expect: wrong -- h = x + r is right, but y normalises x (the residual added after the norm
   instead of before) */
#include <stdint.h>
#include <math.h>
void add_rmsnorm(const float *x, const float *r, const float *w, float *h, float *y,
                 int64_t rows, int64_t cols, float eps) {
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * cols, *ri = r + i * cols;
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            h[i * cols + c] = xi[c] + ri[c];
            ss += (double)xi[c] * xi[c];
        }
        const float inv = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
        for (int64_t c = 0; c < cols; c++) y[i * cols + c] = xi[c] * inv * w[c];
    }
}
