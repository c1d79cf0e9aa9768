/* planted: many tokens -- the cos/sin table holds the 128 tokens of the largest prefill; token t > 127 reuses the angles of token t % 128; no seed case has more than 128 tokens */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2, rows = tokens < 128 ? tokens : 128;
    float *cs = malloc((size_t)(2 * rows * half) * sizeof(float)), *sn = cs + rows * half;
    for (int64_t t = 0; t < rows; t++)
        for (int64_t i = 0; i < half; i++) {
            const double a = (double)pos[t] * pow((double)theta, -2.0 * (double)i / (double)head_dim);
            cs[t * half + i] = (float)cos(a);
            sn[t * half + i] = (float)sin(a);
        }
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cs + (t % 128) * half, *s = sn + (t % 128) * half;   /* bug: wraps past 128 */
        for (int64_t h = 0; h < heads; h++) {
            const float *x1 = x + (t * heads + h) * head_dim, *x2 = x1 + half;
            float *y1 = y + (t * heads + h) * head_dim, *y2 = y1 + half;
            for (int64_t i = 0; i < half; i++) {
                y1[i] = x1[i] * c[i] - x2[i] * s[i];
                y2[i] = x2[i] * c[i] + x1[i] * s[i];
            }
        }
    }
    free(cs);
}
