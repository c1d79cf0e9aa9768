/* expect: timed_out -- never returns */
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    volatile int64_t i = 0;
    while (cols > 0) i++;
}
