/* expect: wrong — the scale argument is ignored and 1/sqrt(head_dim) is used instead; right whenever the caller passes the standard scale, wrong for any other softmax scale (e.g. scale=1.0, 0.5, or a model-specific query_pre_attn_scalar) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static void attend(const float *q, const float *k, const float *v, float *out, int64_t seq, int64_t d, float scale, float *sc) {
    float m = -INFINITY;
    for (int64_t j = 0; j < seq; j++) {
        const float *kr = k + j * d;
        float s = 0.0f;
#pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < d; i++) s += q[i] * kr[i];
        s *= scale;
        sc[j] = s;
        m = s > m ? s : m;
    }
    float l = 0.0f;
    for (int64_t j = 0; j < seq; j++) { sc[j] = expf(sc[j] - m); l += sc[j]; }
    const float inv = 1.0f / l;
    for (int64_t i = 0; i < d; i++) out[i] = 0.0f;
    for (int64_t j = 0; j < seq; j++) {
        const float p = sc[j] * inv;
        const float *vr = v + j * d;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) out[i] += p * vr[i];
    }
}

void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads,
                      int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    const float sm_scale = 1.0f / sqrtf((float)head_dim);
    const int64_t group = heads / kv_heads;
#pragma omp parallel for collapse(2) schedule(static) if (batch * heads * seq >= 8192)
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            float *sc = malloc((size_t)seq * sizeof(float));
            const int64_t c = h / group;
            const int64_t kv = ((b * kv_heads + c) * seq) * head_dim;
            attend(q + (b * heads + h) * head_dim, k + kv, v + kv, out + (b * heads + h) * head_dim, seq, head_dim, sm_scale, sc);
            free(sc);
        }
}
