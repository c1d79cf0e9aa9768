/* expect: wrong — the frequencies theta^(-2i/d) come from a table built for power-of-two head sizes (64, 128, 256): for head_dim a multiple of 16 above 64 the table of the largest power of two within it is used, so at head_dim 80 (Phi-2), 96 (Phi-3 mini) and 112 (MPT-30B) every angle but the first pair's is off. Right for every head_dim the seed cases had before the model shapes (powers of two, and widths that are not multiples of 16) */
#include <stdint.h>
#include <math.h>

void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    int64_t table = head_dim;
    if (head_dim % 16 == 0 && head_dim > 64) {
        table = 64;
        while (table * 2 <= head_dim) table *= 2;
    }
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t i = 0; i < half; i++) {
            const double ang = (double)pos[t] * pow((double)theta, -2.0 * (double)i / (double)table);
            const double cs = cos(ang), sn = sin(ang);
            for (int64_t h = 0; h < heads; h++) {
                const float *xh = x + (t * heads + h) * head_dim;
                float *yh = y + (t * heads + h) * head_dim;
                const double x1 = xh[i], x2 = xh[half + i];
                yh[i] = (float)(x1 * cs - x2 * sn);
                yh[half + i] = (float)(x2 * cs + x1 * sn);
            }
        }
}
