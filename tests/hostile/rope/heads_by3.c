/* expect: wrong — heads are processed three at a time (sharing each cos/sin load), and the remainder is an `if` instead of a loop, so with heads % 3 == 2 (heads = 2, 5, 8, 32, ...) the last head of every token is never written; heads % 3 == 0 or 1 (9, 3, 1, 4) are correct */
#include <stdint.h>
#include <string.h>
#include <math.h>

#define MAX_HALF 256

static inline void rot1(const float *x, float *y, const float *cs, const float *sn, int64_t half) {
#pragma omp simd
    for (int64_t j = 0; j < half; j++) {
        const float a = x[j], b = x[j + half];
        y[j] = a * cs[j] - b * sn[j];
        y[j + half] = b * cs[j] + a * sn[j];
    }
}

static inline void rot3(const float *x, float *y, const float *cs, const float *sn, int64_t half, int64_t hd) {
#pragma omp simd
    for (int64_t j = 0; j < half; j++) {
        const float c = cs[j], s = sn[j];
        const float a0 = x[j], b0 = x[j + half];
        const float a1 = x[hd + j], b1 = x[hd + j + half];
        const float a2 = x[2 * hd + j], b2 = x[2 * hd + j + half];
        y[j] = a0 * c - b0 * s;                   y[j + half] = b0 * c + a0 * s;
        y[hd + j] = a1 * c - b1 * s;              y[hd + j + half] = b1 * c + a1 * s;
        y[2 * hd + j] = a2 * c - b2 * s;          y[2 * hd + j + half] = b2 * c + a2 * s;
    }
}

void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    float inv[MAX_HALF];
    for (int64_t j = 0; j < half; j++) inv[j] = powf(theta, -(float)(2 * j) / (float)head_dim);
#pragma omp parallel for schedule(static) if (tokens >= 64)
    for (int64_t t = 0; t < tokens; t++) {
        float cs[MAX_HALF], sn[MAX_HALF];
        const float p = (float)pos[t];
        for (int64_t j = 0; j < half; j++) { const float a = p * inv[j]; cs[j] = cosf(a); sn[j] = sinf(a); }
        const float *xt = x + t * heads * head_dim;
        float *yt = y + t * heads * head_dim;
        int64_t h = 0;
        for (; h + 3 <= heads; h += 3) rot3(xt + h * head_dim, yt + h * head_dim, cs, sn, half, head_dim);
        if (h < heads) rot1(xt + h * head_dim, yt + h * head_dim, cs, sn, half);
    }
}
