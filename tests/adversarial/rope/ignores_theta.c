/* expect: wrong — ignores the theta argument and bakes in Llama 2's base 10000 (a real, common default): right only when a case happens to draw theta = 1e4 */
#include <stdint.h>
#include <math.h>
#define CHUNK 1024
#define ROPE_BASE 10000.0
void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    (void)theta;  /* "every Llama uses 10000" */
    const int64_t half = head_dim / 2;
    float inv[CHUNK], cs[CHUNK], sn[CHUNK];
    for (int64_t i0 = 0; i0 < half; i0 += CHUNK) {
        const int64_t n = half - i0 < CHUNK ? half - i0 : CHUNK;
        for (int64_t j = 0; j < n; j++)
            inv[j] = (float)pow(ROPE_BASE, -2.0 * (double)(i0 + j) / (double)head_dim);
        for (int64_t t = 0; t < tokens; t++) {
            const float p = (float)pos[t];
            for (int64_t j = 0; j < n; j++) { cs[j] = cosf(p * inv[j]); sn[j] = sinf(p * inv[j]); }
            for (int64_t h = 0; h < heads; h++) {
                const float *x1 = x + (t * heads + h) * head_dim + i0, *x2 = x1 + half;
                float *y1 = y + (t * heads + h) * head_dim + i0, *y2 = y1 + half;
                for (int64_t j = 0; j < n; j++) {
                    y1[j] = x1[j] * cs[j] - x2[j] * sn[j];
                    y2[j] = x2[j] * cs[j] + x1[j] * sn[j];
                }
            }
        }
    }
}
