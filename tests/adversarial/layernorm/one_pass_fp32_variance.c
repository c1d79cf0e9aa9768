/* expect: wrong -- var = E[x^2] - E[x]^2 from one pass of fp32 sums: fine on rows centred near
   zero, off by ~1e-3 on rows whose mean is tens of standard deviations away (the `offset` dist) */
#include <stdint.h>
#include <math.h>
void layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t cols,
               float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float s1[8] = {0}, s2[8] = {0};
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8)
            for (int i = 0; i < 8; i++) { s1[i] += xr[c + i]; s2[i] += xr[c + i] * xr[c + i]; }
        for (; c < cols; c++) { s1[0] += xr[c]; s2[0] += xr[c] * xr[c]; }
        float t1 = 0.0f, t2 = 0.0f;
        for (int i = 0; i < 8; i++) { t1 += s1[i]; t2 += s2[i]; }
        const float mean = t1 / (float)cols, var = fmaxf(t2 / (float)cols - mean * mean, 0.0f);
        const float inv = 1.0f / sqrtf(var + eps);
        for (c = 0; c < cols; c++) y[r * cols + c] = (xr[c] - mean) * inv * w[c] + b[c];
    }
}
