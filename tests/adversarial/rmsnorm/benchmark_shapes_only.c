/* expect: wrong -- hard-codes the benchmark's 576 columns */
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * 576;
        float ss = 0.0f;
        for (int c = 0; c < 576; c++) ss += xr[c] * xr[c];
        float inv = 1.0f / sqrtf(ss / 576.0f + eps);
        for (int c = 0; c < 576; c++) y[r * 576 + c] = xr[c] * inv * w[c];
    }
}
