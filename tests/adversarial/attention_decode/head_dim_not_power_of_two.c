/* expect: wrong — the vectorised q.k path for head_dim a multiple of 16 runs over the largest power of two within it (it was written for 64, 128 and 256): at head_dim 80 (Phi-2), 96 (Phi-3 mini, GPT-NeoX) and 112 (MPT-30B) the last 16, 32 or 48 dimensions never reach the scores. Right wherever head_dim is a power of two or not a multiple of 16, which is every head_dim the seed cases had before the model shapes */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>

void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads,
                      int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    const int64_t group = heads / kv_heads;
    int64_t dots = head_dim;
    if (head_dim % 16 == 0) {
        dots = 16;
        while (dots * 2 <= head_dim) dots *= 2;
    }
    double *p = malloc((size_t)seq * sizeof(double));
    double *acc = malloc((size_t)head_dim * sizeof(double));
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            const int64_t c = h / group;
            const float *qh = q + (b * heads + h) * head_dim;
            const float *kc = k + (b * kv_heads + c) * seq * head_dim, *vc = v + (b * kv_heads + c) * seq * head_dim;
            double m = -INFINITY, l = 0.0;
            for (int64_t s = 0; s < seq; s++) {
                double dot = 0.0;
                for (int64_t d = 0; d < dots; d++) dot += (double)qh[d] * kc[s * head_dim + d];
                p[s] = dot * scale;
                m = p[s] > m ? p[s] : m;
            }
            for (int64_t s = 0; s < seq; s++) { p[s] = exp(p[s] - m); l += p[s]; }
            for (int64_t d = 0; d < head_dim; d++) acc[d] = 0.0;
            for (int64_t s = 0; s < seq; s++)
                for (int64_t d = 0; d < head_dim; d++) acc[d] += p[s] * vc[s * head_dim + d];
            for (int64_t d = 0; d < head_dim; d++) out[(b * heads + h) * head_dim + d] = (float)(acc[d] / l);
        }
    free(p);
    free(acc);
}
