/* planted: tail -- wrong when cols % 4 == 2 (the 2-element remainder is dropped); no seed shape has it */
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t c = 0;
        for (; c + 4 <= cols; c += 4) {
            s0 += xr[c] * xr[c]; s1 += xr[c + 1] * xr[c + 1];
            s2 += xr[c + 2] * xr[c + 2]; s3 += xr[c + 3] * xr[c + 3];
        }
        for (; c < cols; c++) s0 += xr[c] * xr[c];
        const float inv = 1.0f / sqrtf((s0 + s1 + s2 + s3) / (float)cols + eps);
        c = 0;
        for (; c + 4 <= cols; c += 4)
            for (int k = 0; k < 4; k++) yr[c + k] = xr[c + k] * inv * w[c + k];
        int64_t rem = cols - c;
        if (rem == 1 || rem == 3) yr[c] = xr[c] * inv * w[c];
        if (rem == 3) {
            yr[c + 1] = xr[c + 1] * inv * w[c + 1];
            yr[c + 2] = xr[c + 2] * inv * w[c + 2];
        }
    }
}
