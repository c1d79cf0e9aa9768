/* expect: wrong -- sin/cos from low-order Taylor polynomials after reduction to [-pi, pi]: errors of order 1 near +-pi */
#include <stdint.h>
#include <math.h>
static void low_sincos(float a, float *s, float *c) {
    const float two_pi = 6.28318530718f;
    a -= two_pi * nearbyintf(a / two_pi);
    const float a2 = a * a;
    *s = a - a * a2 / 6.0f;
    *c = 1.0f - a2 / 2.0f + a2 * a2 / 24.0f;
}
void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t i = 0; i < half; i++) {
            float s, c;
            low_sincos((float)pos[t] * powf(theta, -2.0f * (float)i / (float)head_dim), &s, &c);
            for (int64_t h = 0; h < heads; h++) {
                const float *xh = x + (t * heads + h) * head_dim;
                float *yh = y + (t * heads + h) * head_dim;
                yh[i] = xh[i] * c - xh[i + half] * s;
                yh[i + half] = xh[i + half] * c + xh[i] * s;
            }
        }
}
