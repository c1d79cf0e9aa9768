/* expect: crashed -- writes through a null pointer */
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    volatile float *p = 0;
    *p = x[0];
}
