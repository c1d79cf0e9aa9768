/* planted: long context -- two-pass softmax over a fixed stack buffer of 1056 scores; a longer KV cache is silently truncated to its first 1056 keys; the longest seed context is 1031 */
#include <stdint.h>
#include <math.h>
#define MAXSEQ 1056
void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    const int64_t group = heads / kv_heads, n = seq < MAXSEQ ? seq : MAXSEQ;   /* bug: drops keys past MAXSEQ */
    float sc[MAXSEQ];
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            const int64_t g = h / group;
            const float *qh = q + (b * heads + h) * head_dim;
            const float *kh = k + (b * kv_heads + g) * seq * head_dim, *vh = v + (b * kv_heads + g) * seq * head_dim;
            float *o = out + (b * heads + h) * head_dim;
            float m = -INFINITY;
            for (int64_t s = 0; s < n; s++) {
                float dot = 0.0f;
                for (int64_t d = 0; d < head_dim; d++) dot += qh[d] * kh[s * head_dim + d];
                sc[s] = dot * scale;
                m = sc[s] > m ? sc[s] : m;
            }
            double l = 0.0;
            for (int64_t s = 0; s < n; s++) { sc[s] = expf(sc[s] - m); l += sc[s]; }
            for (int64_t d = 0; d < head_dim; d++) {
                double acc = 0.0;
                for (int64_t s = 0; s < n; s++) acc += (double)sc[s] * vh[s * head_dim + d];
                o[d] = (float)(acc / l);
            }
        }
}
