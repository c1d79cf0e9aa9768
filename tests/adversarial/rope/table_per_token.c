/* expect: correct -- a plain correct kernel: frequencies once per call, one fp32 angle (as HF computes it) and one sin/cos per (token, frequency) shared by every head; HF's eager rotary runs about ten torch ops */
#include <stdint.h>
#include <math.h>
#define CHUNK 1024
void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    float inv[CHUNK], cs[CHUNK], sn[CHUNK];
    for (int64_t i0 = 0; i0 < half; i0 += CHUNK) {
        const int64_t n = half - i0 < CHUNK ? half - i0 : CHUNK;
        for (int64_t j = 0; j < n; j++)
            inv[j] = (float)pow((double)theta, -2.0 * (double)(i0 + j) / (double)head_dim);
        for (int64_t t = 0; t < tokens; t++) {
            const float p = (float)pos[t];
            for (int64_t j = 0; j < n; j++) {
                const float a = p * inv[j];
                cs[j] = cosf(a);
                sn[j] = sinf(a);
            }
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
