/* expect: wrong — online softmax over 64-key blocks; the per-key path for the last seq % 64 keys rescales the running sum when a key beats the running max but forgets to rescale the output accumulator; shows when seq % 64 != 0 (or seq < 64) and a key in that tail out-scores every earlier key — e.g. seq=17, 100, 1000 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define KB 64
#define MAXD 256

static void attend(const float *q, const float *k, const float *v, float *out, int64_t seq, int64_t d, float scale) {
    float acc[MAXD], sc[KB];
    float m = -INFINITY, l = 0.0f;
    memset(acc, 0, (size_t)d * sizeof(float));
    int64_t j0 = 0;
    for (; j0 + KB <= seq; j0 += KB) {
        float bm = -INFINITY;
        for (int jj = 0; jj < KB; jj++) {
            const float *kr = k + (j0 + jj) * d;
            float s = 0.0f;
#pragma omp simd reduction(+:s)
            for (int64_t i = 0; i < d; i++) s += q[i] * kr[i];
            sc[jj] = s * scale;
            bm = sc[jj] > bm ? sc[jj] : bm;
        }
        const float mn = bm > m ? bm : m;
        const float alpha = expf(m - mn);
        l *= alpha;
        for (int64_t i = 0; i < d; i++) acc[i] *= alpha;
        for (int jj = 0; jj < KB; jj++) {
            const float p = expf(sc[jj] - mn);
            const float *vr = v + (j0 + jj) * d;
            l += p;
#pragma omp simd
            for (int64_t i = 0; i < d; i++) acc[i] += p * vr[i];
        }
        m = mn;
    }
    for (int64_t j = j0; j < seq; j++) {   /* ragged tail, key by key */
        const float *kr = k + j * d, *vr = v + j * d;
        float s = 0.0f;
#pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < d; i++) s += q[i] * kr[i];
        s *= scale;
        if (s > m) {
            l *= expf(m - s);
            m = s;
        }
        const float p = expf(s - m);
        l += p;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) acc[i] += p * vr[i];
    }
    const float inv = 1.0f / l;
    for (int64_t i = 0; i < d; i++) out[i] = acc[i] * inv;
}

void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads,
                      int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    const int64_t group = heads / kv_heads;
#pragma omp parallel for collapse(2) schedule(static) if (batch * heads * seq >= 8192)
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            const int64_t kv = (b * kv_heads + h / group) * seq * head_dim;
            attend(q + (b * heads + h) * head_dim, k + kv, v + kv, out + (b * heads + h) * head_dim, seq, head_dim, scale);
        }
}
