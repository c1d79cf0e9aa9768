/* expect: wrong — HF's angles (fp32 pos * inv_freq) with cos/sin rounded through fp16 tables (2^-11 relative): inside the fixed atol of 1e-3 x the pair's norm, so it was taken (faster); hundreds to thousands of times torch fp32's own error */
#include <stdint.h>
#include <math.h>
void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t i = 0; i < half; i++) {
            const float inv = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
            const float a = (float)pos[t] * inv;
            const float c = (float)(_Float16)cosf(a), s = (float)(_Float16)sinf(a);
            for (int64_t h = 0; h < heads; h++) {
                const float *xh = x + (t * heads + h) * head_dim;
                float *yh = y + (t * heads + h) * head_dim;
                yh[i] = xh[i] * c - xh[i + half] * s;
                yh[i + half] = xh[i + half] * c + xh[i] * s;
            }
        }
}
