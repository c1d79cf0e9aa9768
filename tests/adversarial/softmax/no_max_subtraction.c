/* expect: wrong -- skips the max subtraction: exp(x) overflows to inf on the 'large' rows (inf/inf = NaN) */
#include <stdint.h>
#include <math.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float s = 0.0f;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c]); s += yr[c]; }
        const float inv = 1.0f / s;
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
