/* expect: build_failed -- exports rms_norm, not rmsnorm */
#include <stdint.h>
#include <math.h>
void rms_norm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) { }
