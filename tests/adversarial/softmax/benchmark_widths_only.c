/* expect: wrong -- only computes the benchmark's 512- and 49152-column rows; any other width gets a uniform 1/cols */
#include <stdint.h>
#include <math.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        if (cols != 512 && cols != 49152) {
            for (int64_t c = 0; c < cols; c++) yr[c] = 1.0f / (float)cols;
            continue;
        }
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        const float inv = 1.0f / s;
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
