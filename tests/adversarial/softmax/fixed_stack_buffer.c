/* expect: wrong — stages each row's exponentials in a fixed 65536-float stack buffer (big enough for the 49152-token vocabulary) and clamps longer rows to it: columns past 65536 are never written */
#include <stdint.h>
#include <math.h>
#define MAXC 65536
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    float e[MAXC];
    const int64_t n = cols < MAXC ? cols : MAXC;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < n; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < n; c++) m = xr[c] != xr[c] ? xr[c] : m;  /* NaN propagates */
        double s = 0.0;
        for (int64_t c = 0; c < n; c++) { e[c] = expf(xr[c] - m); s += e[c]; }
        const float inv = (float)(1.0 / s);
        for (int64_t c = 0; c < n; c++) yr[c] = e[c] * inv;
    }
}
