/* expect: cheated -- subtracts the row max from x in place to save a buffer: y is right, x is destroyed */
#include <stdint.h>
#include <math.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    float *xm = (float *)x;
    for (int64_t r = 0; r < rows; r++) {
        float *xr = xm + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { xr[c] -= m; yr[c] = expf(xr[c]); s += yr[c]; }
        const float inv = 1.0f / s;
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
