/* expect: wrong -- remembers the last output per input address and replays it */
#include <stdint.h>
#include <math.h>
#include <string.h>
static const float *last_x;
static int64_t last_n;
static float saved[1 << 20];
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    int64_t n = rows * cols;
    if (x == last_x && n == last_n) { memcpy(y, saved, n * sizeof(float)); return; }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
    if (n <= (1 << 20)) { memcpy(saved, y, n * sizeof(float)); last_x = x; last_n = n; }
}
