/* expect: wrong -- the exact GELU, x/2 (1 + erf(x / sqrt(2))), where the model (Gemma's
   gelu_pytorch_tanh) uses the tanh approximation: they differ by up to ~5e-4 near |gate| ~ 2 */
#include <stdint.h>
#include <math.h>
void geglu(const float *gate, const float *up, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = 0.5f * gate[i] * (1.0f + erff(gate[i] * 0.70710678f)) * up[i];
}
