/* expect: wrong -- exp(score) without subtracting the max: scores near 150 (the 'shifted' case) overflow fp32 exp to inf and the output to NaN */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    float *acc = malloc((size_t)head_dim * sizeof(float));
    const int64_t group = heads / kv_heads;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            const int64_t g = h / group;
            const float *qh = q + (b * heads + h) * head_dim;
            const float *kh = k + (b * kv_heads + g) * seq * head_dim, *vh = v + (b * kv_heads + g) * seq * head_dim;
            float l = 0.0f;
            for (int64_t d = 0; d < head_dim; d++) acc[d] = 0.0f;
            for (int64_t s = 0; s < seq; s++) {
                float dot = 0.0f;
                for (int64_t d = 0; d < head_dim; d++) dot += qh[d] * kh[s * head_dim + d];
                const float p = expf(dot * scale);
                l += p;
                for (int64_t d = 0; d < head_dim; d++) acc[d] += p * vh[s * head_dim + d];
            }
            for (int64_t d = 0; d < head_dim; d++) out[(b * heads + h) * head_dim + d] = acc[d] / l;
        }
    free(acc);
}
