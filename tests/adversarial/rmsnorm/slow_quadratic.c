/* expect: timed_out -- correct but recomputes the row's sum of squares for every element: quadratic, so a 65,536-column stress row takes longer than one verification call may */
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        for (int64_t c = 0; c < cols; c++) {
            double ss = 0.0;
            for (int64_t k = 0; k < cols; k++) ss += (double)xr[k] * xr[k];
            y[r * cols + c] = (float)(xr[c] / sqrt(ss / cols + eps) * w[c]);
        }
    }
}
