/* expect: wrong -- lazy: normalises only row 0 (the decode case); the other rows stay poisoned */
#include <stdint.h>
#include <math.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    float m = -INFINITY, s = 0.0f;
    for (int64_t c = 0; c < cols; c++) m = x[c] > m ? x[c] : m;
    for (int64_t c = 0; c < cols; c++) { y[c] = expf(x[c] - m); s += y[c]; }
    const float inv = 1.0f / s;
    for (int64_t c = 0; c < cols; c++) y[c] *= inv;
}
