/* expect: wrong — never reads w: tuned on a freshly initialised model, where RMSNorm's weight is torch.ones (KernelBench's "weights left at their initial values"); the bundled problem draws w per case */
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    (void)w;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv;
    }
}
