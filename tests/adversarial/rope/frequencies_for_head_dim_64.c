/* expect: wrong -- hard-codes head_dim 64 in the frequencies (theta^(-2i/64)): right only for SmolLM2's heads */
#include <stdint.h>
#include <math.h>
void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t i = 0; i < half; i++) {
            const double ang = (double)pos[t] * pow((double)theta, -2.0 * (double)i / 64.0);
            const float c = (float)cos(ang), s = (float)sin(ang);
            for (int64_t h = 0; h < heads; h++) {
                const float *xh = x + (t * heads + h) * head_dim;
                float *yh = y + (t * heads + h) * head_dim;
                yh[i] = xh[i] * c - xh[i + half] * s;
                yh[i + half] = xh[i + half] * c + xh[i] * s;
            }
        }
}
