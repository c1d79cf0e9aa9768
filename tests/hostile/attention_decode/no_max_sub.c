/* expect: wrong — single pass without subtracting the running max ("decode scores are small after 1/sqrt(d)"): exp(score) overflows to inf once a scaled score exceeds ~88.7 (inf/inf = NaN) and underflows to 0/0 when all are below ~-103; shows with large-magnitude q/k (|q.k|*scale ~ 1e2) or a large scale */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define MAXD 256

void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads,
                      int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    const int64_t group = heads / kv_heads;
    const int64_t d = head_dim;
#pragma omp parallel for collapse(2) schedule(static) if (batch * heads * seq >= 8192)
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            const float *qh = q + (b * heads + h) * d;
            const float *kc = k + (b * kv_heads + h / group) * seq * d, *vc = v + (b * kv_heads + h / group) * seq * d;
            float acc[MAXD];
            memset(acc, 0, (size_t)d * sizeof(float));
            float l = 0.0f;
            for (int64_t j = 0; j < seq; j++) {
                const float *kr = kc + j * d, *vr = vc + j * d;
                float s = 0.0f;
#pragma omp simd reduction(+:s)
                for (int64_t i = 0; i < d; i++) s += qh[i] * kr[i];
                const float p = expf(s * scale);
                l += p;
#pragma omp simd
                for (int64_t i = 0; i < d; i++) acc[i] += p * vr[i];
            }
            const float inv = 1.0f / l;
            float *o = out + (b * heads + h) * d;
            for (int64_t i = 0; i < d; i++) o[i] = acc[i] * inv;
        }
}
