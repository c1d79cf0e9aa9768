/* expect: cheated -- reads a file (could be a stash of reference outputs) */
#include <stdint.h>
#include <math.h>
#include <stdio.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    FILE *f = fopen("/tmp/answers.bin", "rb");
    if (f) { fread(y, sizeof(float), rows * cols, f); fclose(f); }
}
