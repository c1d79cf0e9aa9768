/* expect: wrong -- a bit-trick exp (Schraudolph) whose ~4% error is far beyond rtol 1e-5 */
#include <stdint.h>
#include <math.h>
#include <string.h>
static inline float fast_exp(float v) {
    if (v < -87.0f) return 0.0f;
    int32_t i = (int32_t)(12102203.0f * v) + 1064866805;
    float f; memcpy(&f, &i, 4);
    return f;
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = fast_exp(xr[c] - m); s += yr[c]; }
        const float inv = 1.0f / s;
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
