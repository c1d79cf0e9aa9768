/* expect: crashed -- exits the process that loaded it */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    exit(3);
}
