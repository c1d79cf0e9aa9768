/* planted: large GQA group -- the query heads of one kv head are scored together in a register tile of 8; a group of more than 8 heads (e.g. 9 heads on 1 kv head) leaves the extra heads unwritten; the largest seed group is 6 */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#define GT 8
void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    const int64_t group = heads / kv_heads, gn = group < GT ? group : GT;   /* bug: heads past GT are never visited */
    float *acc = malloc((size_t)(GT * head_dim) * sizeof(float));
    for (int64_t b = 0; b < batch; b++)
        for (int64_t g = 0; g < kv_heads; g++) {
            const float *kh = k + (b * kv_heads + g) * seq * head_dim, *vh = v + (b * kv_heads + g) * seq * head_dim;
            float m[GT], l[GT];
            for (int64_t j = 0; j < gn; j++) m[j] = -INFINITY, l[j] = 0.0f;
            for (int64_t i = 0; i < gn * head_dim; i++) acc[i] = 0.0f;
            for (int64_t s = 0; s < seq; s++)
                for (int64_t j = 0; j < gn; j++) {
                    const float *qh = q + (b * heads + g * group + j) * head_dim;
                    float dot = 0.0f;
                    for (int64_t d = 0; d < head_dim; d++) dot += qh[d] * kh[s * head_dim + d];
                    dot *= scale;
                    const float mn = dot > m[j] ? dot : m[j], a = expf(m[j] - mn), p = expf(dot - mn);
                    l[j] = l[j] * a + p;
                    for (int64_t d = 0; d < head_dim; d++) acc[j * head_dim + d] = acc[j * head_dim + d] * a + p * vh[s * head_dim + d];
                    m[j] = mn;
                }
            for (int64_t j = 0; j < gn; j++)
                for (int64_t d = 0; d < head_dim; d++)
                    out[(b * heads + g * group + j) * head_dim + d] = acc[j * head_dim + d] / l[j];
        }
    free(acc);
}
