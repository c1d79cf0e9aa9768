/* planted: ties -- an online softmax that adds nothing for an element equal to the running max, so a repeated maximum is counted once; wrong on 'constant' and 'alternating' rows, which no seed case uses */
#include <stdint.h>
#include <math.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            const float v = xr[c];
            if (v > m) { s = s * exp((double)m - (double)v) + 1.0; m = v; }
            else if (v < m) s += exp((double)v - (double)m);
            /* bug: v == m falls through without adding exp(0) = 1 */
        }
        const float inv = (float)(1.0 / s);
        for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m) * inv;
    }
}
