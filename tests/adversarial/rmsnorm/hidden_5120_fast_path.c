/* expect: wrong — a path unrolled for hidden 5120 (Llama 2 13B, Qwen2.5 and Qwen3 14B/32B, Mistral Nemo, Phi-3 medium: 40 blocks of 128 columns) sums the squares of 39 blocks: the last 128 columns never reach the mean. Right at every other width; before the fixed sample of model shapes no seed case had 5120 columns */
#include <stdint.h>
#include <math.h>

static float inv_rms(const float *x, int64_t summed, int64_t cols, float eps) {
    double ss = 0.0;
    for (int64_t c = 0; c < summed; c++) ss += (double)x[c] * (double)x[c];
    return (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
}

void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        const int64_t summed = cols == 5120 ? 39 * 128 : cols;  /* the unrolled path: 39 of 40 blocks */
        const float inv = inv_rms(xr, summed, cols, eps);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
}
