/* expect: wrong — exp from a degree-4 polynomial for 2^f that keeps Taylor's first three terms (relative error up to 6.8e-6, ~55x torch's fp32 exp; the row sum in double): inside rtol 5e-5, so the fixed tolerance took it (not_faster); on the outputs up to ~60x torch fp32's own error */
#include <stdint.h>
#include <math.h>
#include <string.h>
static inline float exp_p4(float v) {
    if (v < -87.0f) return 0.0f;               /* x - max <= 0; exp(-inf) = 0 */
    const float t = v * 1.44269504f;          /* x / ln 2 */
    const float k = nearbyintf(t), f = t - k; /* 2^k * 2^f, f in [-1/2, 1/2] */
    float p = 0.0096188132f;
    p = p * f + 0.055781543f;
    p = p * f + 0.24022651f;
    p = p * f + 0.69314718f;
    p = p * f + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return p * s;
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        double s = 0.0;  /* the row sum in double: only the exp is approximate */
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = exp_p4(xr[c] - m); s += yr[c]; }
        const float inv = (float)(1.0 / s);
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
