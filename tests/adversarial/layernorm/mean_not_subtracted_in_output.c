/* expect: wrong -- normalises by the right standard deviation but forgets to centre the output
   (x * inv instead of (x - mean) * inv): RMSNorm's formula with LayerNorm's variance */
#include <stdint.h>
#include <math.h>
void layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t cols,
               float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        double s = 0.0, ss = 0.0;
        for (int64_t c = 0; c < cols; c++) s += xr[c];
        const double mean = s / (double)cols;
        for (int64_t c = 0; c < cols; c++) ss += (xr[c] - mean) * (xr[c] - mean);
        const float inv = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c] + b[c];
    }
}
