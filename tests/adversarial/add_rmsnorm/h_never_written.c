/* expect: wrong -- y is right, but the new residual h is never written (a fused kernel that
   forgot its second output): the poisoned h shows it */
#include <stdint.h>
#include <math.h>
void add_rmsnorm(const float *x, const float *r, const float *w, float *h, float *y,
                 int64_t rows, int64_t cols, float eps) {
    (void)h;
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * cols, *ri = r + i * cols;
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) ss += (double)(xi[c] + ri[c]) * (xi[c] + ri[c]);
        const float inv = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
        for (int64_t c = 0; c < cols; c++) y[i * cols + c] = (xi[c] + ri[c]) * inv * w[c];
    }
}
