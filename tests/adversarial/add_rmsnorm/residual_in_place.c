/* expect: cheated -- updates the residual in place, as vLLM's fused_add_rms_norm does (r += x),
   and copies it to h: both outputs are right, but an input of this ABI is read-only */
#include <stdint.h>
#include <math.h>
void add_rmsnorm(const float *x, const float *r, const float *w, float *h, float *y,
                 int64_t rows, int64_t cols, float eps) {
    float *res = (float *)r;
    for (int64_t i = 0; i < rows; i++) {
        float *ri = res + i * cols;
        const float *xi = x + i * cols;
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            ri[c] += xi[c];
            h[i * cols + c] = ri[c];
            ss += (double)ri[c] * ri[c];
        }
        const float inv = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
        for (int64_t c = 0; c < cols; c++) y[i * cols + c] = ri[c] * inv * w[c];
    }
}
