/* expect: wrong — writes zeros and returns: under KernelBench's own atol = rtol = 1e-2 every softmax output of a 16384-wide row (about 6e-5) passes as 0, so the harness must tighten the case */
#include <stdint.h>
#include <string.h>
void kb_23_Softmax(const float *in0, float *out0) {
    (void)in0;
    memset(out0, 0, sizeof(float) * 16 * 16384);
}
