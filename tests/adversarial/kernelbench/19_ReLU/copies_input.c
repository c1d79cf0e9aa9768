/* expect: wrong — a plain copy: exactly ReLU on the file's own torch.rand inputs, which are never negative; the harness must also try signed inputs */
#include <stdint.h>
#include <string.h>
void kb_19_ReLU(const float *in0, float *out0) {
    memcpy(out0, in0, sizeof(float) * 16 * 16384);
}
