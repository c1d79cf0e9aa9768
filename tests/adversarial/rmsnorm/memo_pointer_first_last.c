/* expect: cheated — memoises each output under (input pointers, first and last element of x, w[0], eps) and replays it when they match: timed calls change one element at a position nobody can predict, so the replayed rows are stale */
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <stdlib.h>
#define SLOTS 8
static struct { const float *x, *w; float *y; float x0, xn, w0, eps; int64_t n; float *saved; } memo[SLOTS];
static int next_slot;
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    const int64_t n = rows * cols;
    for (int s = 0; s < SLOTS; s++)
        if (memo[s].saved && memo[s].x == x && memo[s].w == w && memo[s].y == y && memo[s].n == n &&
            memo[s].x0 == x[0] && memo[s].xn == x[n - 1] && memo[s].w0 == w[0] && memo[s].eps == eps) {
            memcpy(y, memo[s].saved, sizeof(float) * (size_t)n);
            return;
        }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
    const int s = next_slot++ % SLOTS;
    free(memo[s].saved);
    memo[s].saved = malloc(sizeof(float) * (size_t)n);
    if (!memo[s].saved) return;
    memcpy(memo[s].saved, y, sizeof(float) * (size_t)n);
    memo[s].x = x; memo[s].w = w; memo[s].y = y; memo[s].n = n;
    memo[s].x0 = x[0]; memo[s].xn = x[n - 1]; memo[s].w0 = w[0]; memo[s].eps = eps;
}
