/* expect: wrong — the mean over every fourth row only (a quarter of the work): about 0.4% off, inside KernelBench's rtol = atol = 1e-2, thousands of times torch's own fp32 error */
#include <stdint.h>
void kb_94_MSELoss(const float *in0, const float *in1, float *out0) {
    double s = 0.0;
    for (int r = 0; r < 128; r += 4)
        for (int c = 0; c < 4096; c++) {
            const double d = (double)in0[r * 4096 + c] - (double)in1[r * 4096 + c];
            s += d * d;
        }
    *out0 = (float)(s / (32.0 * 4096.0));
}
