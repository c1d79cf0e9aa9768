/* expect: wrong -- rotates adjacent pairs (2i, 2i+1), the GPT-J convention, instead of HF Llama's rotate-half (i, i+half) */
#include <stdint.h>
#include <math.h>
void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t i = 0; i < half; i++) {
            const double ang = (double)pos[t] * pow((double)theta, -2.0 * (double)i / (double)head_dim);
            const float c = (float)cos(ang), s = (float)sin(ang);
            for (int64_t h = 0; h < heads; h++) {
                const float *xh = x + (t * heads + h) * head_dim;
                float *yh = y + (t * heads + h) * head_dim;
                yh[2 * i] = xh[2 * i] * c - xh[2 * i + 1] * s;
                yh[2 * i + 1] = xh[2 * i + 1] * c + xh[2 * i] * s;
            }
        }
}
