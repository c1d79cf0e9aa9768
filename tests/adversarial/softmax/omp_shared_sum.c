/* expect: wrong -- splits each row over OpenMP threads (verification runs at least two) but adds into one shared sum without a reduction: every thread overwrites it with its partial */
#include <stdint.h>
#include <math.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        #pragma omp parallel
        {
            float part = 0.0f;
            #pragma omp for schedule(static)
            for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); part += yr[c]; }
            s = part;   /* race: every thread overwrites the shared sum with its own partial */
        }
        const float inv = 1.0f / s;
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
