/* expect: wrong — ignores the scale argument and recomputes the "usual" 1/sqrt(head_dim) itself: right for Llama-style models, wrong for any model with a configured score scale (Gemma, muP) */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads,
                      int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    (void)scale;
    const float s = 1.0f / sqrtf((float)head_dim);  /* "scale is always 1/sqrt(d)" */
    const int64_t group = heads / kv_heads;
    float *p = malloc(sizeof(float) * (size_t)seq);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            const float *qh = q + (b * heads + h) * head_dim;
            const int64_t kvh = h / group;
            const float *kb = k + ((b * kv_heads + kvh) * seq) * head_dim;
            const float *vb = v + ((b * kv_heads + kvh) * seq) * head_dim;
            float m = -INFINITY;
            for (int64_t t = 0; t < seq; t++) {
                float d = 0.0f;
                for (int64_t i = 0; i < head_dim; i++) d += qh[i] * kb[t * head_dim + i];
                p[t] = d * s;
                m = p[t] > m ? p[t] : m;
            }
            float sum = 0.0f;
            for (int64_t t = 0; t < seq; t++) { p[t] = expf(p[t] - m); sum += p[t]; }
            float *o = out + (b * heads + h) * head_dim;
            for (int64_t i = 0; i < head_dim; i++) o[i] = 0.0f;
            for (int64_t t = 0; t < seq; t++) {
                const float w = p[t] / sum;
                for (int64_t i = 0; i < head_dim; i++) o[i] += w * vb[t * head_dim + i];
            }
        }
    free(p);
}
