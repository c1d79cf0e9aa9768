/* expect: wrong -- keeps the cos/sin table between calls, keyed by the address of pos: new positions in the same buffer get stale angles */
#include <stdint.h>
#include <math.h>
#define TABLE (1 << 18)
static const int64_t *cached_pos;
static int64_t cached_tokens, cached_half;
static float cos_t[TABLE], sin_t[TABLE];
void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    if (tokens * half > TABLE) return;
    if (pos != cached_pos || tokens != cached_tokens || half != cached_half) {
        for (int64_t t = 0; t < tokens; t++)
            for (int64_t i = 0; i < half; i++) {
                const double ang = (double)pos[t] * pow((double)theta, -2.0 * (double)i / (double)head_dim);
                cos_t[t * half + i] = (float)cos(ang);
                sin_t[t * half + i] = (float)sin(ang);
            }
        cached_pos = pos; cached_tokens = tokens; cached_half = half;
    }
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + (t * heads + h) * head_dim;
            float *yh = y + (t * heads + h) * head_dim;
            for (int64_t i = 0; i < half; i++) {
                const float c = cos_t[t * half + i], s = sin_t[t * half + i];
                yh[i] = xh[i] * c - xh[i + half] * s;
                yh[i + half] = xh[i + half] * c + xh[i] * s;
            }
        }
}
