/* expect: wrong — sigmoid is computed as e/(1+e) with e = exp(g) (saves the negate), which is inf/inf = NaN once g > ~88.7; large positive gates (g >= 89, e.g. |gate| ~ 1e2..1e4) give NaN where the reference gives g*up */
#include <stdint.h>
#include <math.h>

void swiglu(const float *gate, const float *up, float *y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= (1 << 17))
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        const float e = expf(g);
        y[i] = g * (e / (1.0f + e)) * up[i];
    }
}
