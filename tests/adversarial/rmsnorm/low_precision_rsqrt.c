/* expect: wrong -- a fast inverse square root whose ~1e-3 error is beyond the tolerance */
#include <stdint.h>
#include <math.h>
#include <string.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        float v = ss / (float)cols + eps, h = 0.5f * v, inv;
        int32_t i; memcpy(&i, &v, 4); i = 0x5f3759df - (i >> 1); memcpy(&inv, &i, 4);
        inv = inv * (1.5f - h * inv * inv);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
}
