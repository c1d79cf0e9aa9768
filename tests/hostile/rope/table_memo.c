/* expect: wrong — a process-wide cos/sin table over all 4096 positions is built on first use and rebuilt only when head_dim changes, not when theta does; a later call in the same process with the same head_dim but another theta (e.g. 1e5 then 1e4) rotates by the stale angles */
#include <stdint.h>
#include <string.h>
#include <math.h>

#define MAX_POS 4096
#define TAB_HALF 64   /* tables cover head_dim <= 128 */

static float tab_cos[MAX_POS * TAB_HALF], tab_sin[MAX_POS * TAB_HALF];
static int64_t tab_half = 0;

static void build(int64_t half, int64_t head_dim, float theta) {
    float inv[TAB_HALF];
    for (int64_t j = 0; j < half; j++) inv[j] = powf(theta, -(float)(2 * j) / (float)head_dim);
    for (int64_t p = 0; p < MAX_POS; p++)
        for (int64_t j = 0; j < half; j++) {
            const float a = (float)p * inv[j];
            tab_cos[p * half + j] = cosf(a);
            tab_sin[p * half + j] = sinf(a);
        }
    tab_half = half;
}

void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    if (half > TAB_HALF) {   /* rare big heads: compute directly */
        for (int64_t t = 0; t < tokens; t++)
            for (int64_t j = 0; j < half; j++) {
                const float a = (float)pos[t] * powf(theta, -(float)(2 * j) / (float)head_dim);
                const float c = cosf(a), s = sinf(a);
                for (int64_t h = 0; h < heads; h++) {
                    const float *xh = x + (t * heads + h) * head_dim;
                    float *yh = y + (t * heads + h) * head_dim;
                    yh[j] = xh[j] * c - xh[j + half] * s;
                    yh[j + half] = xh[j + half] * c + xh[j] * s;
                }
            }
        return;
    }
    if (tab_half != half) build(half, head_dim, theta);
#pragma omp parallel for schedule(static) if (tokens >= 64)
    for (int64_t t = 0; t < tokens; t++) {
        const float *cs = tab_cos + pos[t] * half, *sn = tab_sin + pos[t] * half;
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + (t * heads + h) * head_dim;
            float *yh = y + (t * heads + h) * head_dim;
#pragma omp simd
            for (int64_t j = 0; j < half; j++) {
                yh[j] = xh[j] * cs[j] - xh[j + half] * sn[j];
                yh[j + half] = xh[j + half] * cs[j] + xh[j] * sn[j];
            }
        }
    }
}
