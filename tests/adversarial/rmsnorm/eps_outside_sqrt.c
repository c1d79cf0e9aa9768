/* expect: wrong — adds eps to the root instead of to the mean square: x / (sqrt(mean(x^2)) + eps), as some LayerNorm ports do; invisible while eps is 1e-5 and rows are unit-scale, wrong for eps near 1e-3 or tiny rows */
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float s0 = 0.0f, s1 = 0.0f;
        int64_t c = 0;
        for (; c + 2 <= cols; c += 2) { s0 += xr[c] * xr[c]; s1 += xr[c + 1] * xr[c + 1]; }
        for (; c < cols; c++) s0 += xr[c] * xr[c];
        const float inv = 1.0f / (sqrtf((s0 + s1) / (float)cols) + eps);
        for (c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
}
