/* expect: wrong — query heads sharing a KV head are register-blocked four at a time; in that 4-wide block the fourth query's score is dotted with the third query (copy-paste q2 for q3); groups of 1-3 query heads per KV head (e.g. 9 heads over 3 KV heads) never reach the block, groups of >= 4 (heads/kv_heads = 4, 8, 9 with MQA) are wrong */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static void softmax_inplace(float *s, int64_t n) {
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    for (int64_t j = 0; j < n; j++) { s[j] = expf(s[j] - m); l += s[j]; }
    const float inv = 1.0f / l;
    for (int64_t j = 0; j < n; j++) s[j] *= inv;
}

static void one_query(const float *q, const float *k, const float *v, float *o, int64_t seq, int64_t d, float scale, float *sc) {
    for (int64_t j = 0; j < seq; j++) {
        const float *kr = k + j * d;
        float s = 0.0f;
#pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < d; i++) s += q[i] * kr[i];
        sc[j] = s * scale;
    }
    softmax_inplace(sc, seq);
    memset(o, 0, (size_t)d * sizeof(float));
    for (int64_t j = 0; j < seq; j++) {
        const float p = sc[j], *vr = v + j * d;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) o[i] += p * vr[i];
    }
}

/* four query heads of one group: each K and V row is read once for all four */
static void four_queries(const float *q, const float *k, const float *v, float *o, int64_t seq, int64_t d, float scale, float *sc) {
    const float *q0 = q, *q1 = q + d, *q2 = q + 2 * d, *q3 = q + 3 * d;
    float *s0 = sc, *s1 = sc + seq, *s2 = sc + 2 * seq, *s3 = sc + 3 * seq;
    for (int64_t j = 0; j < seq; j++) {
        const float *kr = k + j * d;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+:a0, a1, a2, a3)
        for (int64_t i = 0; i < d; i++) {
            const float kv = kr[i];
            a0 += q0[i] * kv;
            a1 += q1[i] * kv;
            a2 += q2[i] * kv;
            a3 += q2[i] * kv;
        }
        s0[j] = a0 * scale; s1[j] = a1 * scale; s2[j] = a2 * scale; s3[j] = a3 * scale;
    }
    softmax_inplace(s0, seq); softmax_inplace(s1, seq); softmax_inplace(s2, seq); softmax_inplace(s3, seq);
    float *o0 = o, *o1 = o + d, *o2 = o + 2 * d, *o3 = o + 3 * d;
    memset(o, 0, (size_t)(4 * d) * sizeof(float));
    for (int64_t j = 0; j < seq; j++) {
        const float p0 = s0[j], p1 = s1[j], p2 = s2[j], p3 = s3[j], *vr = v + j * d;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) {
            const float vv = vr[i];
            o0[i] += p0 * vv; o1[i] += p1 * vv; o2[i] += p2 * vv; o3[i] += p3 * vv;
        }
    }
}

void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads,
                      int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    const int64_t group = heads / kv_heads;
#pragma omp parallel for collapse(2) schedule(static) if (batch * kv_heads * seq >= 4096)
    for (int64_t b = 0; b < batch; b++)
        for (int64_t c = 0; c < kv_heads; c++) {
            float *sc = malloc((size_t)(4 * seq) * sizeof(float));
            const float *kc = k + (b * kv_heads + c) * seq * head_dim, *vc = v + (b * kv_heads + c) * seq * head_dim;
            int64_t g = 0;
            for (; g + 4 <= group; g += 4) {
                const int64_t h = c * group + g;
                four_queries(q + (b * heads + h) * head_dim, kc, vc, out + (b * heads + h) * head_dim, seq, head_dim, scale, sc);
            }
            for (; g < group; g++) {
                const int64_t h = c * group + g;
                one_query(q + (b * heads + h) * head_dim, kc, vc, out + (b * heads + h) * head_dim, seq, head_dim, scale, sc);
            }
            free(sc);
        }
}
