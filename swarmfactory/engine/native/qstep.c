/* A whole engine step of a decoder-only model on GGUF block weights, in one C call.
 *
 * Built as the tail of qlinear.c (qstep.py joins the two sources): the matrix products are
 * qlinear.c's (rows_dot on the stored blocks of any of its types, activations quantised to 8
 * bits per call by its quantize_row, so every product has qlinear's numerics and error bound),
 * and this file adds the rest of a step, as engine/models/decoder.py computes it: RMSNorm,
 * q|k|v (+ biases), per-head q/k RMSNorm, RoPE from the model's own tables, the KV-cache write
 * (a ring for sliding-window layers), grouped-query attention over the cache (a window where the
 * layer has one), the output projection, RMSNorm of the attention and FFN outputs (Gemma's
 * sandwich norms), the gated FFN (SiLU or GELU-tanh), residuals, the final norm and the head.
 * Where decode.c computes the plain llama step on its own packed Q4_1/Q8_0 layout, this one
 * covers what the architecture hooks of decoder.py describe (llama, qwen2, qwen3, gemma3) on
 * every block type qlinear runs.
 *
 * One OpenMP region per step with a barrier between phases: the rows of each weight are split
 * statically between the threads, attention by (row, head). Rows are (slot, position, token):
 * decode tokens and prompt tokens alike. Every row's K/V is written before any row attends, and
 * a row attends to its own position and those before it (within its layer's window), so the
 * prompt tokens of one sequence in one call get causal attention.
 *
 * Batch invariance: each output element is computed by one thread with the same operations
 * whatever the batch, the thread count or the other rows (rows_dot computes each output the same
 * way in any group of weight rows and pass of activation rows; the small ops are per row).
 */

#include <omp.h>

enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

/* One weight: its parts stacked along the output (qlinear's QPart), and an optional bias. */
typedef struct {
    const QPart *parts;
    int64_t n_parts, rows, cols;
    const float *bias; /* [rows] or NULL */
} QMat;

/* Per layer: the norms (NULL where the architecture has none), its window and RoPE set. */
typedef struct {
    const float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffn_norm; /* [dim] */
    const float *q_norm, *k_norm;                                       /* [head_dim] */
    int64_t window;   /* positions a query sees, its own included; 0: all */
    int64_t capacity; /* positions its cache keeps per slot (< max_len: a ring, p at p % capacity) */
    int64_t rope;     /* which RoPE table set */
    float *kv;        /* [2, slots, n_kv, capacity, head_dim] fp32 */
} QLayer;

typedef struct {
    int64_t n_layers, dim, n_heads, n_kv, head_dim, ffn, vocab, max_b, slots, max_len, n_pos;
    float eps, scale;
    int act, threads;
    const QMat *mats;      /* 4 per layer (qkv, o, gate|up, down), then the head */
    const QLayer *layers;
    const float *out_norm; /* [dim] */
    const float *cos, *sin; /* [n_rope_sets, n_pos, head_dim]: x*cos + rotate_half(x)*sin (signed) */
    /* scratch */
    float *x, *h, *qkv, *att, *gu, *ff, *tmp, *scores;
    unsigned char *alone; /* [max_b] per row of a step: the only row of its slot (a decode row) */
    float *xtmp; /* [threads, qx_scratch(max_b, kmax)]: external kernels' scratch (NULL: no part has one) */
    int64_t kmax;
    Act32 a32;
    Act256 a256;
} QModel;

/* ---------------------------------------------------------------------------------------- */

/* gate activation times up, one row of n */
static void gated(int act, const float *g, const float *u, float *f, int64_t n) {
    if (act == ACT_GELU_TANH) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const float x = g[i], z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            /* tanh(z) = 1 - 2 / (exp(2z) + 1), exact at both ends (exp saturates) */
            const float t = 1.f - 2.f / (sf_exp(2.f * z) + 1.f);
            f[i] = 0.5f * x * (1.f + t) * u[i];
        }
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) f[i] = g[i] / (1.f + sf_exp(-g[i])) * u[i];
    }
}

/* This thread's share of y[M, rows] = act @ W^T (+ bias), rows split evenly, then a barrier.
 * The activations were quantised by q_quantize for W's cols. */
static void q_matmul(const QModel *Q, const QMat *W, int64_t M, float *y, int64_t ldy) {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    /* on whole groups of 8 rows, as the packed kernel computes them */
    const int64_t n0 = (W->rows * t / nt) & ~(int64_t)7, n1 = t + 1 == nt ? W->rows : (W->rows * (t + 1) / nt) & ~(int64_t)7;
    float *out = Q->tmp + (int64_t)t * Q->max_b * ROW_GROUP;
    int64_t base = 0;
    for (int64_t p = 0; p < W->n_parts; p++) {
        const QPart *P = W->parts + p;
        const int64_t lo = n0 > base ? n0 : base, hi = n1 < base + P->rows ? n1 : base + P->rows;
        if (Q->xtmp && qx_active(P)) { /* the factory's kernel for this part's type (QExt) */
            QxSlot S = qx_slot(Q->xtmp + (int64_t)t * qx_scratch(Q->max_b, Q->kmax), M, W->cols);
            if (lo < hi) qx_begin(&S, P->type, &Q->a32, &Q->a256, M, W->cols);
            ext_part(P, base, lo, hi, W->cols, &Q->a32, &Q->a256, M, &S, y, 0, ldy, W->bias);
            if (lo < hi) qx_end(P, &S, &Q->a32, &Q->a256, M, W->cols);
            base += P->rows;
            continue;
        }
        if (lo < hi)
            own_rows(P, lo - base, hi - base, W->cols, &Q->a32, &Q->a256, M, out, y, 0, ldy, lo,
                     W->bias ? W->bias + base : NULL);
        base += P->rows;
    }
#pragma omp barrier
}

/* row m of the activations for a weight of K columns (both block sizes where K allows) */
static void q_quantize(QModel *Q, const float *x, int64_t K, int64_t m) {
    Act32 a32 = Q->a32;
    Act256 a256 = Q->a256;
    if (K % 256) a256.q = NULL;
    quantize_row(x, K, m, &a32, &a256);
}

/* rotate-half RoPE of one head in place from a table row: x*c + [x_hi, x_lo]*s */
static void q_rope(float *x, const float *c, const float *s, int64_t D) {
    const int64_t h = D / 2;
    for (int64_t i = 0; i < h; i++) {
        const float a = x[i], b = x[i + h];
        x[i] = a * c[i] + b * s[i];
        x[i + h] = b * c[i + h] + a * s[i + h];
    }
}

/* Query heads q[0 .. nh) (D apart) of one kv head against positions lo..p of its cache (entry
 * t % cap), out[h * D ..]. Each K and V row is read once for all nh heads (a decode row of a
 * grouped-query model read them once per head: 4x the traffic for Gemma 3's 4 heads per kv
 * head). Each head's result comes from the same operations whatever nh is, and a row's from the
 * same whatever other rows a step holds. scores: nh * (p - lo + 1) floats.
 *
 * The SIMD build computes a score as 8 lane sums of q[i] k[i] over i = lane mod 8 (one FMA chain
 * each, in order of i), added by one fixed tree ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), then the
 * elements past the last multiple of 8 in order, and each output element as its terms added in
 * order of position, one FMA each. Two ways to get the same numbers: with the cache in L2/L3
 * (a prompt's rows, a few decode rows), 8 keys at a time with their 8 sums reduced together, one
 * lane per key (attend_dot8), and 4 positions per load and store of the output; with `stream`
 * (a decode row among enough others that their caches come from memory), one key and one
 * position at a time (attend_dot1), which reads the cache in order: 1.3-1.4x faster there, 0.6x
 * in cache (head size 64, 2026-12-07). A tile of a prompt's rows per task (each K/V row read once
 * for up to 8 rows) measured within the machine's noise of one row at a time, and is not kept. */
#if SF_SIMD
INLINE __m256 attend_dot8(const float *q, const float *const *kp, int64_t D8) {
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0, p4 = p0, p5 = p0, p6 = p0, p7 = p0;
    for (int64_t i = 0; i < D8; i += 8) {
        const __m256 x = _mm256_loadu_ps(q + i);
        p0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp[0] + i), p0);
        p1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp[1] + i), p1);
        p2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp[2] + i), p2);
        p3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp[3] + i), p3);
        p4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp[4] + i), p4);
        p5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp[5] + i), p5);
        p6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp[6] + i), p6);
        p7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp[7] + i), p7);
    }
    /* lanes l: [p_l lanes 0..3 summed as (0+1)+(2+3)] then [4..7] in the upper half */
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(p0, p1), _mm256_hadd_ps(p2, p3));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(p4, p5), _mm256_hadd_ps(p6, p7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* attend_dot8's scores of one key for query heads h < n (n <= 4, D apart) into s[h]: the same
 * chain and tree per head, one key at a time (the cache read in order: faster where it streams
 * from memory), the heads' chains side by side */
INLINE void attend_dot1(const float *q, int64_t D, int64_t n, const float *k, int64_t D8, float *s) {
    const float *q1 = q + (n > 1 ? D : 0), *q2 = q + (n > 2 ? 2 * D : 0), *q3 = q + (n > 3 ? 3 * D : 0);
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
    for (int64_t i = 0; i < D8; i += 8) {
        const __m256 x = _mm256_loadu_ps(k + i);
        p0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), x, p0);
        p1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i), x, p1);
        p2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i), x, p2);
        p3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i), x, p3);
    }
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(p0, p1), _mm256_hadd_ps(p2, p3));
    float t[4];
    _mm_storeu_ps(t, _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
    for (int64_t h = 0; h < n; h++) s[h] = t[h];
}

/* a score from its lanes' sum t: the elements past the last multiple of 8 added in order, scaled */
INLINE float attend_rest(const float *q, const float *k, int64_t D8, int64_t D, float t, float scale) {
    for (int64_t i = D8; i < D; i++) t += q[i] * k[i];
    return t * scale;
}

/* out[h * D ..] for heads h < nh = the positions j < len (entry (first + j) mod cap of v)
 * weighted by w[h * len + j], scaled by inv[h]: each element summed over the positions in
 * order, 4 positions per load and store of the output (4 consecutive V rows read together) */
INLINE void attend_pv(const float *w, int64_t len, int64_t nh, const float *v, int64_t first, int64_t cap,
                      int64_t D, const float *inv, float *out, int stream) {
    const int64_t D8 = D & ~(int64_t)7;
    for (int64_t i = 0; i < nh * D; i++) out[i] = 0.f;
    int64_t j = 0, e = first;
    for (; j + 4 <= len && !stream; j += 4) {
        const float *v0 = v + e * D;
        e = e + 1 == cap ? 0 : e + 1;
        const float *v1 = v + e * D;
        e = e + 1 == cap ? 0 : e + 1;
        const float *v2 = v + e * D;
        e = e + 1 == cap ? 0 : e + 1;
        const float *v3 = v + e * D;
        e = e + 1 == cap ? 0 : e + 1;
        for (int64_t h = 0; h < nh; h++) {
            const float *wh = w + h * len + j;
            const __m256 w0 = _mm256_broadcast_ss(wh), w1 = _mm256_broadcast_ss(wh + 1);
            const __m256 w2 = _mm256_broadcast_ss(wh + 2), w3 = _mm256_broadcast_ss(wh + 3);
            float *o = out + h * D;
            for (int64_t i = 0; i < D8; i += 8) {
                __m256 a = _mm256_loadu_ps(o + i);
                a = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + i), a);
                a = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + i), a);
                a = _mm256_fmadd_ps(w2, _mm256_loadu_ps(v2 + i), a);
                a = _mm256_fmadd_ps(w3, _mm256_loadu_ps(v3 + i), a);
                _mm256_storeu_ps(o + i, a);
            }
            for (int64_t i = D8; i < D; i++) {
                float a = o[i];
                a = fmaf(wh[0], v0[i], a);
                a = fmaf(wh[1], v1[i], a);
                a = fmaf(wh[2], v2[i], a);
                a = fmaf(wh[3], v3[i], a);
                o[i] = a;
            }
        }
    }
    for (; j < len; j++, e = e + 1 == cap ? 0 : e + 1) {
        const float *v0 = v + e * D;
        for (int64_t h = 0; h < nh; h++) {
            const __m256 w0 = _mm256_broadcast_ss(w + h * len + j);
            float *o = out + h * D;
            for (int64_t i = 0; i < D8; i += 8)
                _mm256_storeu_ps(o + i, _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + i), _mm256_loadu_ps(o + i)));
            for (int64_t i = D8; i < D; i++) o[i] = fmaf(w[h * len + j], v0[i], o[i]);
        }
    }
    for (int64_t h = 0; h < nh; h++)
        for (int64_t i = 0; i < D; i++) out[h * D + i] *= inv[h];
}
#endif

static void q_attend(const float *q, int64_t nh, const float *k, const float *v, int64_t lo, int64_t p, int64_t cap,
                     int64_t D, float scale, float *scores, float *out, int stream) {
    const int64_t len = p - lo + 1, first = lo % cap; /* position lo + j at entry (first + j) mod cap */
#if SF_SIMD
    const int64_t D8 = D & ~(int64_t)7;
    if (stream) /* one key at a time: the same scores */
        for (int64_t j = 0, e = first; j < len; j++, e = e + 1 == cap ? 0 : e + 1) {
            const float *kt = k + e * D;
            for (int64_t h0 = 0; h0 < nh; h0 += 4) {
                const int64_t n = nh - h0 < 4 ? nh - h0 : 4;
                float x[4];
                attend_dot1(q + h0 * D, D, n, kt, D8, x);
                for (int64_t h = h0; h < h0 + n; h++)
                    scores[h * len + j] = attend_rest(q + h * D, kt, D8, D, x[h - h0], scale);
            }
        }
    else
        for (int64_t j = 0, e = first; j < len; j += 8) {
            const int64_t n = len - j < 8 ? len - j : 8;
            const float *kp[8];
            for (int64_t l = 0; l < 8; l++) {
                kp[l] = l < n ? k + e * D : kp[0]; /* lanes past the last key repeat the first, unused */
                if (l < n) e = e + 1 == cap ? 0 : e + 1;
            }
            for (int64_t h = 0; h < nh; h++) {
                float x[8];
                _mm256_storeu_ps(x, attend_dot8(q + h * D, kp, D8));
                for (int64_t l = 0; l < n; l++)
                    scores[h * len + j + l] = attend_rest(q + h * D, kp[l], D8, D, x[l], scale);
            }
        }
#else
    (void)stream;
    for (int64_t j = 0, e = first; j < len; j++, e = e + 1 == cap ? 0 : e + 1) {
        const float *kt = k + e * D;
        for (int64_t h = 0; h < nh; h++) {
            const float *qh = q + h * D;
            float s = 0.f;
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < D; i++) s += qh[i] * kt[i];
            scores[h * len + j] = s * scale;
        }
    }
#endif
    float inv[nh];
    for (int64_t h = 0; h < nh; h++) {
        float *sc = scores + h * len, mx = -INFINITY, sum = 0.f;
        for (int64_t j = 0; j < len; j++) mx = sc[j] > mx ? sc[j] : mx;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < len; j++) {
            const float e = sf_exp(sc[j] - mx);
            sc[j] = e;
            sum += e;
        }
        inv[h] = 1.f / sum;
    }
#if SF_SIMD
    attend_pv(scores, len, nh, v, first, cap, D, inv, out, stream);
#else
    for (int64_t h = 0; h < nh; h++)
        for (int64_t i = 0; i < D; i++) out[h * D + i] = 0.f;
    for (int64_t j = 0, e = first; j < len; j++, e = e + 1 == cap ? 0 : e + 1) {
        const float *vt = v + e * D;
        for (int64_t h = 0; h < nh; h++) {
            const float w = scores[h * len + j];
            float *o = out + h * D;
#pragma omp simd
            for (int64_t i = 0; i < D; i++) o[i] += w * vt[i];
        }
    }
    for (int64_t h = 0; h < nh; h++)
        for (int64_t i = 0; i < D; i++) out[h * D + i] *= inv[h];
#endif
}

/* Query heads per attention task for `rows` rows of `kv` kv heads with `g` query heads each:
 * all g together (each K/V row read once for them) where that gives each of the `nt` threads
 * two tasks, else one (q_attend's result for a head is the same either way). */
static int64_t attend_heads(int64_t rows, int64_t kv, int64_t g, int nt) { return rows * kv >= 2 * nt ? g : 1; }

/* K and V bytes of one layer that the decode rows of a step read, above which q_attend streams
 * them (their caches no longer stay in L3 between steps): between 12.6 MB (8 rows of SmolLM2's
 * 1024 positions, faster in blocks) and 25 MB (16 rows, faster streamed) on a Zen 4 (32 MB L3).
 * Only speed depends on it: q_attend's numbers are the same either way. */
#define ATTEND_STREAM_BYTES (16ll << 20)

/* whether decode rows reading `positions` positions of `kv` kv heads of head size D stream */
static int attend_streams(int64_t positions, int64_t kv, int64_t D) {
    return positions * kv * D * 2 * (int64_t)sizeof(float) > ATTEND_STREAM_BYTES;
}

/* the first position a row at p sees in a layer of this window (0: all) */
static int64_t attend_lo(int64_t p, int64_t window) { return window && p + 1 > window ? p + 1 - window : 0; }

static void q_step(QModel *Q, int64_t B, const float *x_in, const int64_t *slot, const int64_t *pos,
                   int64_t n_out, const int64_t *out_rows, float *logits) {
    const int64_t D = Q->head_dim, H = Q->n_heads, KV = Q->n_kv, dim = Q->dim, F = Q->ffn;
    const int64_t G = H / KV, QKV = (H + 2 * KV) * D, ATT = H * D, S = Q->slots;
    memcpy(Q->x, x_in, sizeof(float) * B * dim);
    for (int64_t b = 0; b < B; b++) /* a decode row: no other row of its slot next to it */
        Q->alone[b] = !(b && slot[b - 1] == slot[b]) && !(b + 1 < B && slot[b + 1] == slot[b]);
#pragma omp parallel num_threads(Q->threads)
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *scores = Q->scores + (int64_t)tid * Q->max_len * (Q->n_heads / Q->n_kv);
        for (int64_t l = 0; l < Q->n_layers; l++) {
            const QMat *W = Q->mats + 4 * l;
            const QLayer *L = Q->layers + l;
            const int64_t cap = L->capacity;
            const float *cos = Q->cos + L->rope * Q->n_pos * D, *sin = Q->sin + L->rope * Q->n_pos * D;
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                sf_rms_norm(Q->x + b * dim, L->attn_norm, Q->h + b * dim, dim, Q->eps);
                q_quantize(Q, Q->h + b * dim, dim, b);
            }
            q_matmul(Q, &W[0], B, Q->qkv, QKV);
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                float *row = Q->qkv + b * QKV;
                for (int64_t hh = 0; hh < H + KV; hh++) {
                    float *x = row + hh * D;
                    if (L->q_norm) sf_rms_norm(x, hh < H ? L->q_norm : L->k_norm, x, D, Q->eps);
                    q_rope(x, cos + pos[b] * D, sin + pos[b] * D, D);
                }
                for (int64_t p = 0; p < 2; p++)
                    for (int64_t g = 0; g < KV; g++)
                        memcpy(L->kv + (((p * S + slot[b]) * KV + g) * cap + pos[b] % cap) * D,
                               row + (H + p * KV + g) * D, sizeof(float) * D);
            }
            int64_t streamed = 0; /* positions the decode rows read from this layer's cache */
            for (int64_t b = 0; b < B; b++)
                if (Q->alone[b]) streamed += pos[b] + 1 - attend_lo(pos[b], L->window);
            const int stream = attend_streams(streamed, KV, D);
            const int64_t nh = attend_heads(B, KV, G, nt), per = H / nh;
            for (int64_t task = tid; task < B * per; task += nt) {
                const int64_t b = task / per, hh = task % per * nh, g = hh / G, p = pos[b];
                const int64_t lo = attend_lo(p, L->window);
                const float *k = L->kv + ((0 * S + slot[b]) * KV + g) * cap * D;
                const float *v = L->kv + ((1 * S + slot[b]) * KV + g) * cap * D;
                q_attend(Q->qkv + b * QKV + hh * D, nh, k, v, lo, p, cap, D, Q->scale, scores,
                         Q->att + b * ATT + hh * D, stream && Q->alone[b]);
            }
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) q_quantize(Q, Q->att + b * ATT, ATT, b);
            q_matmul(Q, &W[1], B, Q->h, dim);
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                float *x = Q->x + b * dim, *a = Q->h + b * dim;
                if (L->post_attn_norm) sf_rms_norm(a, L->post_attn_norm, a, dim, Q->eps);
                for (int64_t i = 0; i < dim; i++) x[i] += a[i];
                sf_rms_norm(x, L->ffn_norm, a, dim, Q->eps);
                q_quantize(Q, a, dim, b);
            }
            q_matmul(Q, &W[2], B, Q->gu, 2 * F);
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                const float *g = Q->gu + b * 2 * F;
                gated(Q->act, g, g + F, Q->ff + b * F, F);
                q_quantize(Q, Q->ff + b * F, F, b);
            }
            q_matmul(Q, &W[3], B, Q->h, dim);
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                float *x = Q->x + b * dim, *y = Q->h + b * dim;
                if (L->post_ffn_norm) sf_rms_norm(y, L->post_ffn_norm, y, dim, Q->eps);
                for (int64_t i = 0; i < dim; i++) x[i] += y[i];
            }
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n_out; i++) {
            sf_rms_norm(Q->x + out_rows[i] * dim, Q->out_norm, Q->h + i * dim, dim, Q->eps);
            q_quantize(Q, Q->h + i * dim, dim, i);
        }
        if (n_out) q_matmul(Q, &Q->mats[4 * Q->n_layers], n_out, logits, Q->vocab);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* API                                                                                       */

void sf_qstep_free(QModel *Q) {
    if (!Q) return;
    free(Q->x); free(Q->h); free(Q->qkv); free(Q->att); free(Q->gu); free(Q->ff); free(Q->tmp); free(Q->xtmp);
    free(Q->scores); free(Q->alone);
    free(Q->a32.q); free(Q->a32.d); free(Q->a32.s); free(Q->a32.isum);
    free(Q->a256.q); free(Q->a256.d); free(Q->a256.bsums);
    free(Q);
}

/* The model's arrays (mats, layers and what they point to, out_norm, cos, sin) must outlive it
 * (qstep.py keeps them). Returns NULL for dimensions it cannot run (a weight's columns not a
 * multiple of its blocks, a weight of the wrong size, an odd head size, heads not a multiple of
 * kv heads, a RoPE table shorter than max_len) or when memory runs out. */
QModel *sf_qstep_new(int64_t n_layers, int64_t dim, int64_t n_heads, int64_t n_kv, int64_t head_dim,
                     int64_t ffn, int64_t vocab, float eps, float scale, int act, int64_t max_b, int64_t slots,
                     int64_t max_len, int64_t n_pos, const QMat *mats, const QLayer *layers,
                     const float *out_norm, const float *cos, const float *sin, int threads) {
    const int64_t QKV = (n_heads + 2 * n_kv) * head_dim, ATT = n_heads * head_dim;
    if (n_layers < 1 || head_dim % 2 || n_kv < 1 || n_heads % n_kv || n_pos < max_len || max_b < 1 || !out_norm ||
        !cos || !sin ||
        (act != ACT_SILU && act != ACT_GELU_TANH))
        return NULL;
    const int64_t want[5][2] = {{QKV, dim}, {dim, ATT}, {2 * ffn, dim}, {dim, ffn}, {vocab, dim}};
    int has_ext = 0;
    for (int64_t i = 0; i <= 4 * n_layers; i++) {
        const QMat *W = mats + i;
        const int64_t *rc = want[i == 4 * n_layers ? 4 : i % 4];
        int64_t rows = 0;
        for (int64_t p = 0; p < W->n_parts; p++) {
            const int64_t t = W->parts[p].type, bs = block_bytes(t);
            if (!bs || W->cols % elems(t) || W->parts[p].row_bytes < W->cols / elems(t) * bs || !W->parts[p].data)
                return NULL;
            has_ext |= W->parts[p].ext && W->parts[p].ext->fn;
            rows += W->parts[p].rows;
        }
        if (rows != W->rows || W->rows != rc[0] || W->cols != rc[1]) return NULL;
    }
    for (int64_t l = 0; l < n_layers; l++)
        if (layers[l].capacity < 1 || layers[l].capacity > max_len || !layers[l].kv || !layers[l].attn_norm ||
            !layers[l].ffn_norm || (!layers[l].q_norm) != (!layers[l].k_norm) || layers[l].window < 0)
            return NULL;
    QModel *Q = calloc(1, sizeof(QModel));
    if (!Q) return NULL;
    *Q = (QModel){n_layers, dim, n_heads, n_kv, head_dim, ffn, vocab, max_b, slots, max_len, n_pos, eps, scale,
                  act, threads > 0 ? threads : 1, mats, layers, out_norm, cos, sin};
    int64_t k = dim > ATT ? dim : ATT;
    k = k > ffn ? k : ffn;
    Q->kmax = k;
    const int64_t wide = dim > ATT ? dim : ATT;
    Q->x = malloc(sizeof(float) * max_b * dim);
    Q->h = malloc(sizeof(float) * max_b * wide);
    Q->qkv = malloc(sizeof(float) * max_b * QKV);
    Q->att = malloc(sizeof(float) * max_b * ATT);
    Q->gu = malloc(sizeof(float) * max_b * 2 * ffn);
    Q->ff = malloc(sizeof(float) * max_b * ffn);
    Q->tmp = malloc(sizeof(float) * Q->threads * max_b * ROW_GROUP);
    Q->scores = malloc(sizeof(float) * Q->threads * max_len * (n_heads / n_kv));
    Q->alone = malloc((size_t)max_b);
    if (has_ext && !(Q->xtmp = malloc(sizeof(float) * Q->threads * qx_scratch(max_b, k)))) {
        sf_qstep_free(Q);
        return NULL;
    }
    Q->a32 = (Act32){malloc((size_t)(max_b * k)), malloc(sizeof(float) * max_b * (k / 32 + 1)),
                     malloc(sizeof(float) * max_b * (k / 32 + 1)), malloc(sizeof(int32_t) * max_b * (k / 32 + 1))};
    Q->a256 = (Act256){malloc((size_t)(max_b * k)), malloc(sizeof(float) * max_b * (k / 256 + 1)),
                       malloc(sizeof(int16_t) * max_b * (k / 16 + 1))};
    if (!Q->x || !Q->h || !Q->qkv || !Q->att || !Q->gu || !Q->ff || !Q->tmp || !Q->scores || !Q->alone || !Q->a32.q ||
        !Q->a32.d || !Q->a32.s || !Q->a32.isum || !Q->a256.q || !Q->a256.d || !Q->a256.bsums) {
        sf_qstep_free(Q);
        return NULL;
    }
    return Q;
}

/* external kernels of the model's weights dropped so far (QExt) */
static int64_t q_dropped(const QModel *Q) {
    int64_t c = 0;
    for (int64_t i = 0; i <= 4 * Q->n_layers; i++) c += qx_dropped(Q->mats[i].parts, Q->mats[i].n_parts);
    return c;
}

/* One step over B rows. x_in: [B, dim] the rows' embeddings (already scaled where the model
 * scales them); slot/pos: each row's KV slot and the position of its token; out_rows: the n_out
 * rows whose logits are wanted, written in that order to logits [n_out, vocab]. Returns 0; 1
 * when a weight's external kernel (QExt) was dropped during the step, which then ran again on
 * the engine's own kernels; -1 for bad arguments, including more rows of one slot than a ring
 * layer can hold at once (a row must not overwrite an entry another row of the call still
 * reads). */
int sf_qstep(QModel *Q, int64_t B, const float *x_in, const int64_t *slot, const int64_t *pos,
             int64_t n_out, const int64_t *out_rows, float *logits) {
    if (B < 1 || B > Q->max_b || n_out < 0 || n_out > B) return -1;
    for (int64_t b = 0; b < B; b++)
        if (slot[b] < 0 || slot[b] >= Q->slots || pos[b] < 0 || pos[b] >= Q->max_len) return -1;
    for (int64_t i = 0; i < n_out; i++)
        if (out_rows[i] < 0 || out_rows[i] >= B) return -1;
    int64_t room = Q->max_len; /* the fewest positions any layer keeps beyond what its queries see */
    for (int64_t l = 0; l < Q->n_layers; l++) {
        const QLayer *L = Q->layers + l;
        if (L->capacity < Q->max_len) {
            const int64_t r = L->window ? L->capacity - L->window + 1 : 0;
            room = r < room ? r : room;
        }
    }
    if (room < Q->max_len) /* rows of one slot span at most `room` positions */
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < B; c++)
                if (slot[c] == slot[b] && pos[c] - pos[b] >= room) return -1;
    if (!Q->xtmp) {
        q_step(Q, B, x_in, slot, pos, n_out, out_rows, logits);
        return 0;
    }
    const int64_t dropped = q_dropped(Q);
    q_step(Q, B, x_in, slot, pos, n_out, out_rows, logits);
    if (q_dropped(Q) == dropped) return 0;
    q_step(Q, B, x_in, slot, pos, n_out, out_rows, logits); /* on the engine's own kernels */
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* The block step's own element ops, over the kernel problems' layouts                       */
/*                                                                                          */
/* What the engine runs today for RMSNorm, residual add + RMSNorm, the gated activations,   */
/* RoPE (from the model's tables) and decode attention, as the kernel factory's yardstick  */
/* for those problems (problems/suites/cpu: rmsnorm, add_rmsnorm, swiglu, geglu, rope,      */
/* attention_decode, and the problems derived from a model): a candidate must beat the      */
/* engine's own code, not only torch. Each runs `iters` calls in C (no Python between      */
/* them, as the harness's driver calls a candidate), rows split statically over `threads`. */

void sf_op_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps, int threads,
                   int64_t iters) {
    for (int64_t it = 0; it < iters; it++) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows > 1)
        for (int64_t r = 0; r < rows; r++) sf_rms_norm(x + r * cols, w, y + r * cols, cols, eps);
    }
}

/* the residual add and the norm after it, as q_step computes them (h = x + r, y = norm(h)) */
void sf_op_add_rmsnorm(const float *x, const float *r, const float *w, float *h, float *y, int64_t rows,
                       int64_t cols, float eps, int threads, int64_t iters) {
    for (int64_t it = 0; it < iters; it++) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows > 1)
        for (int64_t b = 0; b < rows; b++) {
            float *hb = h + b * cols;
            const float *xb = x + b * cols, *rb = r + b * cols;
            for (int64_t i = 0; i < cols; i++) hb[i] = xb[i] + rb[i];
            sf_rms_norm(hb, w, y + b * cols, cols, eps);
        }
    }
}

/* act: 0 SiLU, 1 GELU-tanh (gated); n elements cut into one stretch per thread */
void sf_op_gated(int act, const float *g, const float *u, float *y, int64_t n, int threads, int64_t iters) {
    for (int64_t it = 0; it < iters; it++) {
        const int nt = threads > 1 && n >= 4096 ? threads : 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            const int t = omp_get_thread_num(), k = omp_get_num_threads();
            const int64_t lo = n * t / k, hi = n * (t + 1) / k;
            gated(act, g + lo, u + lo, y + lo, hi - lo);
        }
    }
}

/* y = RoPE(x) for x [tokens, heads, D] at positions pos, from the tables [n_pos, D] (cos, and
 * sin with the sign of rotate_half folded in, models/rope.py) */
void sf_op_rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t D,
                const float *cos, const float *sin, int threads, int64_t iters) {
    for (int64_t it = 0; it < iters; it++) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && tokens > 1)
        for (int64_t t = 0; t < tokens; t++) {
            memcpy(y + t * heads * D, x + t * heads * D, sizeof(float) * heads * D);
            for (int64_t hh = 0; hh < heads; hh++) q_rope(y + (t * heads + hh) * D, cos + pos[t] * D, sin + pos[t] * D, D);
        }
    }
}

/* out [batch, heads, D] = attention of q [batch, heads, D] over k, v [batch, kv_heads, seq, D],
 * as the step attends (attend_heads query heads per task); heads a multiple of kv_heads;
 * scratch: threads x seq x (heads / kv_heads) floats */
void sf_op_attention(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads,
                     int64_t kv_heads, int64_t seq, int64_t D, float scale, float *scratch, int threads,
                     int64_t iters) {
    const int64_t G = heads / kv_heads;
    const int stream = attend_streams(batch * seq, kv_heads, D);
    for (int64_t it = 0; it < iters; it++) {
#pragma omp parallel num_threads(threads) if (threads > 1 && batch * heads > 1)
        {
            const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
            float *scores = scratch + (int64_t)tid * seq * G;
            const int64_t nh = attend_heads(batch, kv_heads, G, nt), per = heads / nh;
            for (int64_t task = tid; task < batch * per; task += nt) {
                const int64_t b = task / per, hh = task % per * nh, c = hh / G;
                const float *kb = k + (b * kv_heads + c) * seq * D, *vb = v + (b * kv_heads + c) * seq * D;
                q_attend(q + (b * heads + hh) * D, nh, kb, vb, 0, seq - 1, seq, D, scale, scores,
                         out + (b * heads + hh) * D, stream);
            }
        }
    }
}
