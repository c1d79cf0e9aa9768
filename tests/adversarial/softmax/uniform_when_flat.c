/* expect: wrong — a "flat row" fast path: when a row's spread (max - min) is below 0.05 it writes the uniform 1/cols without an exp, a relative error of up to ~5% that hides under the absolute tolerance where outputs are small; on such rows a constant is a trivial answer, so the harness tightens the case */
#include <stdint.h>
#include <math.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, lo = INFINITY;
        int nan = 0;
        for (int64_t c = 0; c < cols; c++) { m = xr[c] > m ? xr[c] : m; lo = xr[c] < lo ? xr[c] : lo; nan |= xr[c] != xr[c]; }
        if (!nan && m - lo < 0.05f) {
            for (int64_t c = 0; c < cols; c++) yr[c] = 1.0f / (float)cols;
            continue;
        }
        if (nan) m = NAN;
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        const float inv = (float)(1.0 / s);
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
