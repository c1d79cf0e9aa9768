/* expect: wrong — normalises each row but never reads the LayerNorm weight and bias: right for the file's model, whose parameters are still at their initial ones and zeros; the harness must draw parameters per case */
#include <stdint.h>
#include <math.h>
void kb_40_LayerNorm(const float *in0, const float *p0, const float *p1, float *out0) {
    (void)p0; (void)p1;
    for (int r = 0; r < 64; r++) {
        const float *x = in0 + r * 512;
        double mean = 0.0, var = 0.0;
        for (int c = 0; c < 512; c++) mean += x[c];
        mean /= 512;
        for (int c = 0; c < 512; c++) var += (x[c] - mean) * (x[c] - mean);
        const float inv = (float)(1.0 / sqrt(var / 512 + 1e-5));
        for (int c = 0; c < 512; c++) out0[r * 512 + c] = (float)(x[c] - mean) * inv;
    }
}
