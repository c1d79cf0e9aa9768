/* expect: wrong — writes the uniform distribution 1/16384 (what a softmax of a flat row is) without reading the input: within 1e-2 of every output on normal rows */
#include <stdint.h>
void kb_23_Softmax(const float *in0, float *out0) {
    (void)in0;
    for (int i = 0; i < 16 * 16384; i++) out0[i] = 1.0f / 16384.0f;
}
