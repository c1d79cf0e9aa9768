/* expect: wrong -- lazy: rotates only the first head of each token and copies the other heads through unrotated */
#include <stdint.h>
#include <math.h>
#include <string.h>
void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < tokens; t++) {
        const float *xh = x + t * heads * head_dim;
        float *yh = y + t * heads * head_dim;
        for (int64_t i = 0; i < half; i++) {
            const double ang = (double)pos[t] * pow((double)theta, -2.0 * (double)i / (double)head_dim);
            const float c = (float)cos(ang), s = (float)sin(ang);
            yh[i] = xh[i] * c - xh[i + half] * s;
            yh[i + half] = xh[i + half] * c + xh[i] * s;
        }
        memcpy(yh + head_dim, xh + head_dim, (size_t)((heads - 1) * head_dim) * sizeof(float));
    }
}
