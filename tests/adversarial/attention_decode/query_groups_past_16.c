/* expect: wrong — a KV head's keys and values are read once for a tile of up to 16 of its query heads, and only the first tile is run: with more than 16 query heads per KV head (Falcon 7B's 71 on one, StarCoder's 48 on one) the heads past the 16th of each group are never written. Right for groups of up to 16; before the model shapes the seed cases had at most 10 */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>

void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads,
                      int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    const int64_t group = heads / kv_heads;
    const int64_t tile = group < 16 ? group : 16;  /* one tile of query heads per KV head */
    double *p = malloc((size_t)seq * sizeof(double));
    double *acc = malloc((size_t)head_dim * sizeof(double));
    for (int64_t b = 0; b < batch; b++)
        for (int64_t c = 0; c < kv_heads; c++) {
            const float *kc = k + (b * kv_heads + c) * seq * head_dim, *vc = v + (b * kv_heads + c) * seq * head_dim;
            for (int64_t g = 0; g < tile; g++) {
                const int64_t h = c * group + g;
                const float *qh = q + (b * heads + h) * head_dim;
                double m = -INFINITY, l = 0.0;
                for (int64_t s = 0; s < seq; s++) {
                    double dot = 0.0;
                    for (int64_t d = 0; d < head_dim; d++) dot += (double)qh[d] * kc[s * head_dim + d];
                    p[s] = dot * scale;
                    m = p[s] > m ? p[s] : m;
                }
                for (int64_t s = 0; s < seq; s++) { p[s] = exp(p[s] - m); l += p[s]; }
                for (int64_t d = 0; d < head_dim; d++) acc[d] = 0.0;
                for (int64_t s = 0; s < seq; s++)
                    for (int64_t d = 0; d < head_dim; d++) acc[d] += p[s] * vc[s * head_dim + d];
                for (int64_t d = 0; d < head_dim; d++) out[(b * heads + h) * head_dim + d] = (float)(acc[d] / l);
            }
        }
    free(p);
    free(acc);
}
