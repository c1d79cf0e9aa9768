/* expect: build_failed -- a missing semicolon */
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    float ss = 0.0f
    y[0] = ss;
}
