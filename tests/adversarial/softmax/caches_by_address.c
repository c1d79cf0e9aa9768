/* expect: wrong -- remembers the last output per input address and size and replays it on the next call */
#include <stdint.h>
#include <math.h>
#include <string.h>
static const float *last_x;
static int64_t last_n;
static float saved[1 << 20];
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols;
    if (x == last_x && n == last_n) { memcpy(y, saved, n * sizeof(float)); return; }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        const float inv = 1.0f / s;
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
    if (n <= (1 << 20)) { memcpy(saved, y, n * sizeof(float)); last_x = x; last_n = n; }
}
