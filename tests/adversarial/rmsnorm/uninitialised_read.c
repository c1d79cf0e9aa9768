/* expect: wrong -- accumulates into malloc'd memory it never clears */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    float *acc = malloc(16 * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        for (int64_t c = 0; c < cols; c++) acc[c % 16] += xr[c] * xr[c];
        float ss = 0.0f;
        for (int k = 0; k < 16; k++) { ss += acc[k]; acc[k] = 0.0f; }
        float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
    free(acc);
}
