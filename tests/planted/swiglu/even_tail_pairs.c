/* planted: tail -- blocks of 8, then the remainder in pairs with `i + 2 < n` (should be <=): a remainder of 2, 4 or 6 loses its last pair; every seed length is odd or a multiple of 8 */
#include <stdint.h>
#include <math.h>
static inline float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
void swiglu(const float *gate, const float *up, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] = silu_mul(gate[i + k], up[i + k]);
    for (; i + 2 < n; i += 2) {
        y[i] = silu_mul(gate[i], up[i]);
        y[i + 1] = silu_mul(gate[i + 1], up[i + 1]);
    }
    if (n & 1) y[n - 1] = silu_mul(gate[n - 1], up[n - 1]);
}
