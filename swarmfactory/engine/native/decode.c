/* Native decode step for Llama-family models with 4/8-bit block weights (GGUF Q4_1, Q8_0).
 *
 * One call computes a whole decode step for B sequences (one token each): every layer's
 * RMSNorm, q|k|v projection, rotate-half RoPE, KV-cache write, grouped-query attention over the
 * cache, output projection, SwiGLU MLP and residuals, then the final norm and the output head.
 * Torch runs the same step as ~1,400 small ops; here it is one OpenMP region with a barrier
 * between phases, so per-op dispatch cost disappears and the step is bound by reading weights.
 *
 * Matrix-vector products run on integers, as llama.cpp does: activations are quantised per
 * block of 32 to int8 with an fp32 scale (Q8), weights stay 4-bit (Q4_1: w = d*q + m) or 8-bit
 * (Q8_0: w = d*q), and each block's dot product is exact in int32 (llama.cpp's Q8_1 scheme).
 *
 * Batch invariance: every output element (row, sequence) is computed by one thread with the
 * same sequence of operations whatever B and the thread count are, so a sequence's logits do
 * not depend on what else is in the batch.
 *
 * Prompt tokens are rows too: a row is (slot, position, token), every row's K/V is written to
 * the cache before any row attends, and a row attends to positions 0..its own, so the prompt
 * tokens of one sequence in one call get causal attention. A step may therefore mix decode
 * rows and prompt chunks; only the rows named in out_rows go through the output head.
 *
 * ISA: AVX-512 VNNI (256-bit), AVX-VNNI, AVX2 or portable C, whichever the compiler flags
 * target (native/__init__.py builds each path with explicit flags; sf_isa() names the one
 * built).
 *
 * External kernel: a model (sf_model_new) or a call of sf_linear given an Ext with a kernel of
 * the factory's q4_1_packed_matvec problem (a separate shared object, found by pointer) runs
 * its Q4_1 matrices on that kernel instead of matmul_groups. Every call of it is audited: one
 * random row group of its output, for every batch row, is recomputed here and compared (see
 * Ext). At the first mismatch the kernel is dropped for good, the step is re-run on the
 * built-in loop and sf_decode says so (returns 1).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SF_ISA "avx512vnni"
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(__AVXVNNI__)
#define SF_ISA "avxvnni"
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#else
#define SF_ISA "avx2"
#endif
#define SF_SIMD 1
/* rows (sequences, prompt tokens) per pass over a row group: the group's unpacked weights are
 * reused for all of them. 16 also on AVX2, where the accumulators no longer fit in its 16
 * registers: measured 1.2-1.4x faster than 4 at 16-256 rows (same results). */
#define BMAX 16
#else
#define SF_ISA "portable"
#define SF_SIMD 0
#endif

enum { SF_Q4_1 = 0, SF_Q8_0 = 1 };

/* A weight matrix [rows, cols] as pack() in __init__.py lays it out: rows in groups of 8 (the
 * last group padded with zero rows), each group one contiguous run of records, one record per
 * block of 32 columns, so a thread's share of a matrix is a single sequential stream. Inside a
 * record the 8 rows are interleaved by quads of 4 elements: 32-bit lane r of a vector holds 4
 * consecutive elements of row r, so one vpdpbusd against a broadcast quad of activations adds
 * to all 8 rows' sums at once and a block needs no horizontal reduction.
 *   Q4_1 record (160 bytes): 4 vectors of 32 bytes; byte 4r+i of vector k is byte 4k+i of row
 *       r's GGUF block, so its low nibble is element 4k+i and its high nibble element 16+4k+i;
 *       then 8 fp16 d and 8 fp16 m (one per row).
 *   Q8_0 record (272 bytes): 8 vectors of 32 bytes; byte 4r+i of vector k is element 4k+i of
 *       row r stored as w + 128; then 8 fp16 d. */
typedef struct {
    int64_t type, rows, cols;
    const uint8_t *data;
} Mat;

#define ROWS 8
#define REC_Q4 160
#define REC_Q8 272

/* Activations of one row quantised for the integer dot products (Q8, one scale per 32). */
typedef struct {
    int8_t *q;   /* [K] */
    float *d;    /* [K/32] scale */
    float *s;    /* [K/32] d * sum(q): the Q4_1 offset term (see quantize_row) */
    int32_t *c;  /* [K/32] 128 * sum(q): the Q8_0 correction for the +128 storage */
} Act;

/* The factory's kernel (problems/suites/cpu/q4_1_packed_matvec.py): y [batch, n] = the Q4_1
 * records at w (n rows from the first) against quantised activations, every output computed
 * the same whatever batch and n are (batch invariance, as here). */
typedef void (*MatvecFn)(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs,
                         float *y, int64_t n, int64_t k, int64_t batch);

/* An external kernel and its audit, owned by the caller (library.py mirrors this layout).
 * The kernel was verified by the harness and checked at load on a few shapes; the audit checks
 * it on what it is actually given: after the first call at each batch size, and after a random
 * 1 in `share` of the others (drawn from `seed`, which the kernel cannot see coming), one row
 * group picked at random is recomputed with matmul_groups for every batch row, and each output
 * must be within the tolerance of audit_group. A step makes hundreds of calls; a kernel wrong
 * at some batch size, row count or position is caught in the first step that makes it wrong
 * with near certainty (each audited wrong call: probability (rows wrong) / (rows of the call)),
 * and that step is run again without it. */
typedef SfExt Ext; /* common.c: fn is a MatvecFn here */

typedef struct {
    int64_t n_layers, dim, n_heads, n_kv, head_dim, ffn, vocab, max_b, slots, max_len;
    float eps;
    int threads;
    const Mat *mats;       /* per layer: qkv, o, gate_up, down; then the output head */
    const float **norms;   /* per layer: attn_norm, ffn_norm; then the output norm */
    float **kv;            /* per layer: [2, slots, n_kv, max_len, head_dim] fp32 */
    const float *inv_freq; /* [head_dim / 2] */
    /* scratch */
    float *x, *h, *qkv, *att, *gu, *ff, *cs, *scores;
    Act a_dim, a_ffn;      /* B rows each */
    float *mv;             /* [threads, mv_len]: the external kernel's outputs (ext->fn set) */
    int64_t mv_len;
    Ext *ext;              /* NULL: the built-in loop only */
} Model;

/* ---------------------------------------------------------------------------------------- */
/* activation quantisation                                                                   */

static void quantize_row(const float *x, int64_t K, Act *a, int64_t b) {
    int8_t *q = a->q + b * K;
    float *d = a->d + b * (K / 32), *s = a->s + b * (K / 32);
    int32_t *c = a->c + b * (K / 32);
    for (int64_t j = 0; j < K / 32; j++) {
        const float *xb = x + 32 * j;
        float amax = 0.f;
#pragma omp simd reduction(max : amax)
        for (int t = 0; t < 32; t++) amax = fmaxf(amax, fabsf(xb[t]));
        float dj = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        int isum = 0;
#pragma omp simd reduction(+ : isum)
        for (int t = 0; t < 32; t++) {
            const int v = (int)nearbyintf(fminf(fmaxf(xb[t] * id, -127.f), 127.f));
            q[32 * j + t] = (int8_t)v;
            isum += v;
        }
        d[j] = dj;
        /* The offset term m * sum(x) uses the quantised sum, not the exact one: then the
         * rounding errors e_t enter as sum((d q_t + m) e_t) = sum(w_t e_t), weighted by the
         * centred weights, instead of by q_t in 0..15 (about twice the error, measured). */
        s[j] = dj * (float)isum;
        c[j] = 128 * isum;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* integer block dot products                                                                */

#if SF_SIMD
/* acc + 8 int32 lanes of sum_i u[4l+i] * s[4l+i] (u unsigned bytes, s signed bytes). */
static inline __m256i dot_q4(__m256i acc, __m256i u, __m256i s) {
#ifdef DPBUSD
    return DPBUSD(acc, u, s);
#else  /* u <= 15: the int16 pair sums of maddubs cannot saturate */
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* Q8_0 stored as w + 128. With VNNI the dot is taken on the stored bytes and 128 * sum(s) is
 * subtracted per block (Act.c); AVX2's maddubs would saturate on bytes up to 255, so it
 * recovers the signed weights and takes |w| * sign(s, w). Either way the result is exact. */
static inline __m256i dot_q8(__m256i acc, __m256i u, __m256i s) {
#ifdef DPBUSD
    return DPBUSD(acc, u, s);
#else
    const __m256i w = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(s, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

static inline __m256i quad(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

/* y[b][i] (+)= W[i] . x[b] for the row groups [g0, g1), every b < B. Each (row, b) sums its
 * blocks in order with the same operations whatever B is (batch invariance). */
static void matmul_groups(const Mat *W, const Act *a, int64_t B, int64_t g0, int64_t g1,
                          float *y, int64_t ldy, int accumulate) {
    const int64_t nb = W->cols / 32, K = W->cols;
    const int q4 = W->type == SF_Q4_1;
    const int64_t rec = q4 ? REC_Q4 : REC_Q8;
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *base = W->data + g * nb * rec;
        for (int64_t b0 = 0; b0 < B; b0 += BMAX) {
            const int nbb = (int)(B - b0 < BMAX ? B - b0 : BMAX);
            __m256 acc[BMAX];
            for (int bb = 0; bb < nbb; bb++) acc[bb] = _mm256_setzero_ps();
            for (int64_t j = 0; j < nb; j++) {
                const uint8_t *r = base + j * rec;
                __m256i w[8];
                for (int k = 0; k < (q4 ? 4 : 8); k++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(r + 32 * k));
                    if (q4) {
                        w[k] = _mm256_and_si256(v, low);
                        w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                    } else {
                        w[k] = v;
                    }
                }
                const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + (q4 ? 128 : 256))));
                for (int bb = 0; bb < nbb; bb++) {
                    const int64_t b = b0 + bb;
                    const int8_t *x = a->q + b * K + 32 * j;
                    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
                    if (q4) {
#ifdef DPBUSD
                        for (int k = 0; k < 4; k += 2) {
                            s0 = dot_q4(s0, w[k], quad(x + 4 * k));
                            s1 = dot_q4(s1, w[k + 1], quad(x + 4 * k + 4));
                            s0 = dot_q4(s0, w[k + 4], quad(x + 16 + 4 * k));
                            s1 = dot_q4(s1, w[k + 5], quad(x + 20 + 4 * k));
                        }
#else
                        /* maddubs gives int16 pair sums of at most 2 * 15 * 127; all 8 of a
                         * block add up to at most 30480, so they are summed in int16 and
                         * widened once (one madd per block instead of 8). */
                        __m256i p0 = _mm256_maddubs_epi16(w[0], quad(x));
                        __m256i p1 = _mm256_maddubs_epi16(w[1], quad(x + 4));
                        for (int k = 2; k < 8; k += 2) {
                            const int o = k < 4 ? 4 * k : 16 + 4 * (k - 4);
                            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(w[k], quad(x + o)));
                            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(w[k + 1], quad(x + o + 4)));
                        }
                        s0 = _mm256_madd_epi16(_mm256_add_epi16(p0, p1), _mm256_set1_epi16(1));
#endif
                    } else {
                        for (int k = 0; k < 8; k += 2) {
                            s0 = dot_q8(s0, w[k], quad(x + 4 * k));
                            s1 = dot_q8(s1, w[k + 1], quad(x + 4 * k + 4));
                        }
                    }
                    __m256i s = _mm256_add_epi32(s0, s1);
#ifdef DPBUSD
                    if (!q4) s = _mm256_sub_epi32(s, _mm256_set1_epi32(a->c[b * nb + j]));
#endif
                    const __m256 sc = _mm256_mul_ps(d8, _mm256_set1_ps(a->d[b * nb + j]));
                    acc[bb] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, acc[bb]);
                }
            }
            for (int bb = 0; bb < nbb; bb++) {
                const int64_t b = b0 + bb;
                __m256 v = acc[bb];
                if (q4) { /* the offset term, sum_j m_j * s_j: a second pass over the group (in L1) */
                    __m256 accm = _mm256_setzero_ps();
                    for (int64_t j = 0; j < nb; j++) {
                        const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(base + j * rec + 144)));
                        accm = _mm256_fmadd_ps(m8, _mm256_set1_ps(a->s[b * nb + j]), accm);
                    }
                    v = _mm256_add_ps(v, accm);
                }
                float out[ROWS];
                _mm256_storeu_ps(out, v);
                for (int r = 0; r < ROWS && ROWS * g + r < W->rows; r++) {
                    float *dst = y + b * ldy + ROWS * g + r;
                    *dst = accumulate ? *dst + out[r] : out[r];
                }
            }
        }
    }
}
#else
static void matmul_groups(const Mat *W, const Act *a, int64_t B, int64_t g0, int64_t g1,
                          float *y, int64_t ldy, int accumulate) {
    const int64_t nb = W->cols / 32, K = W->cols;
    const int q4 = W->type == SF_Q4_1;
    const int64_t rec = q4 ? REC_Q4 : REC_Q8;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *base = W->data + g * nb * rec;
        for (int r = 0; r < ROWS && ROWS * g + r < W->rows; r++) {
            for (int64_t b = 0; b < B; b++) {
                float acc = 0.f, accm = 0.f;
                for (int64_t j = 0; j < nb; j++) {
                    const uint8_t *rp = base + j * rec;
                    const int8_t *x = a->q + b * K + 32 * j;
                    int32_t s = 0;
                    uint16_t dh;
                    if (q4) {
                        for (int k = 0; k < 4; k++)
                            for (int i = 0; i < 4; i++) {
                                const uint8_t v = rp[32 * k + 4 * r + i];
                                s += (v & 0x0F) * x[4 * k + i] + (v >> 4) * x[16 + 4 * k + i];
                            }
                        uint16_t mh;
                        memcpy(&dh, rp + 128 + 2 * r, 2);
                        memcpy(&mh, rp + 144 + 2 * r, 2);
                        accm += sf_half(mh) * a->s[b * nb + j];
                    } else {
                        for (int k = 0; k < 8; k++)
                            for (int i = 0; i < 4; i++) s += ((int)rp[32 * k + 4 * r + i] - 128) * x[4 * k + i];
                        memcpy(&dh, rp + 256 + 2 * r, 2);
                    }
                    acc += (float)s * (sf_half(dh) * a->d[b * nb + j]);
                }
                float *dst = y + b * ldy + ROWS * g + r;
                *dst = accumulate ? *dst + acc + accm : acc + accm;
            }
        }
    }
}
#endif

/* Output floats of one external call, per thread: a thread's share runs in calls of at most
 * this many outputs into its scratch, then copied (or added) into y with y's row stride; after
 * them, 2 * ROWS * max_b floats for the audit (the recomputed group and its bounds) and the
 * guard zone. */
#define MV_SCRATCH(max_b) ((int64_t)(max_b) * ROWS * 66 + 16)

/* A keyed hash of the call's inputs (the B rows of quantised activations, scales and offset
 * terms): the same before and after every call, or the kernel wrote to its inputs (which the
 * other threads' calls share). Keyed with the secret seed, so a change cannot be made to hash
 * the same. Costs about 1 / (rows of the call) of the call. */
static uint64_t act_hash(const Ext *e, const Act *a, int64_t B, int64_t K) {
    uint64_t h = 0;
    const int64_t nq = B * K / 8, nb = B * K / 32;
    for (int64_t i = 0; i < nq; i++) {
        uint64_t w;
        memcpy(&w, a->q + 8 * i, 8);
        h += mix64(w ^ (e->seed + (uint64_t)i * 0x9e3779b97f4a7c15ULL));
    }
    for (int64_t i = 0; i < nb; i++) {
        uint32_t d, s;
        memcpy(&d, a->d + i, 4);
        memcpy(&s, a->s + i, 4);
        h += mix64((((uint64_t)d << 32) | s) ^ (e->seed * 3 + (uint64_t)i));
    }
    return h;
}

/* Recompute one row group g of the call (rows r0.. of W, n of them, outputs in out[b * n + i])
 * with matmul_groups and compare; 0 if every output is within the tolerance, else records the
 * first mismatch in e (once) and returns 1. The tolerance: the problem's, atol + rtol * |y|,
 * plus EXT_AUDIT_SCALE (common.c) times the output's magnitude bound sum_j |d_w xd| 15 sum|xq|
 * + |m_w xs| (per block j): on real activations the terms of an output reach far beyond it. */
static int audit_group(Ext *e, const Mat *W, const Act *a, int64_t B, int64_t g, int64_t r0, int64_t n,
                       const float *out, float *ref, float *bound) {
    const int64_t nb = W->cols / 32, rec = nb * REC_Q4, row0 = ROWS * g;
    const Mat one = {W->type, W->rows - row0 < ROWS ? W->rows - row0 : ROWS, W->cols, W->data + g * rec};
    matmul_groups(&one, a, B, 0, 1, ref, ROWS, 0);
    for (int64_t i = 0; i < B * ROWS; i++) bound[i] = 0.f;
    for (int64_t j = 0; j < nb; j++) {
        const uint8_t *rp = one.data + j * REC_Q4;
        float dw[ROWS], mw[ROWS];
        for (int r = 0; r < ROWS; r++) {
            uint16_t dh, mh;
            memcpy(&dh, rp + 128 + 2 * r, 2);
            memcpy(&mh, rp + 144 + 2 * r, 2);
            dw[r] = fabsf(sf_half(dh));
            mw[r] = fabsf(sf_half(mh));
        }
        for (int64_t b = 0; b < B; b++) {
            const int8_t *xq = a->q + b * W->cols + 32 * j;
            int32_t qa = 0;
            for (int i = 0; i < 32; i++) qa += xq[i] < 0 ? -xq[i] : xq[i];
            const float xd = fabsf(a->d[b * nb + j]) * 15.f * (float)qa, xs = fabsf(a->s[b * nb + j]);
            for (int r = 0; r < ROWS; r++) bound[b * ROWS + r] += dw[r] * xd + mw[r] * xs;
        }
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < one.rows; r++) {
            const float got = out[b * n + row0 - r0 + r], want = ref[b * ROWS + r];
            const float tol = e->atol + e->rtol * fabsf(want) + EXT_AUDIT_SCALE * bound[b * ROWS + r];
            if (!(fabsf(got - want) <= tol)) { /* NaN fails too */
                ext_fail(e, WRONG_OUTPUT, n, W->cols, B, row0 + r, b, got, want, EXT_AUDIT_SCALE * bound[b * ROWS + r]);
                return 1;
            }
        }
    return 0;
}

static void matmul_external(Ext *e, const Mat *W, const Act *a, int64_t B, int64_t g0, int64_t g1,
                            float *y, int64_t ldy, int accumulate, float *tmp, int64_t tmp_len) {
    const int64_t rec = (W->cols / 32) * REC_Q4;
    float *ref = tmp + tmp_len - 2 * ROWS * B, *bound = ref + ROWS * B;
    tmp_len -= 2 * ROWS * B + EXT_GUARD;
    const int64_t step = tmp_len / (ROWS * B) > 0 ? tmp_len / (ROWS * B) : 1;
    const uint64_t inputs = e->audit ? act_hash(e, a, B, W->cols) : 0;
    for (int64_t c0 = g0; c0 < g1; c0 += step) {
        const int64_t c1 = c0 + step < g1 ? c0 + step : g1;
        const int64_t r0 = ROWS * c0, n = (ROWS * c1 < W->rows ? ROWS * c1 : W->rows) - r0;
        if (__atomic_load_n(&e->bad, __ATOMIC_RELAXED)) { /* dropped: the rest of the step runs here */
            matmul_groups(W, a, B, c0, g1, y, ldy, accumulate);
            return;
        }
        ext_guard_fill(e, tmp + n * B);
        ((MatvecFn)e->fn)(W->data + c0 * rec, a->q, a->d, a->s, tmp, n, W->cols, B);
        int check;
        const uint64_t draw = ext_call(e, B, &check);
        if (e->audit) { /* every call: its inputs unchanged, nothing written past its outputs */
            const int past = ext_guard_written(e, tmp + n * B);
            const int changed = act_hash(e, a, B, W->cols) != inputs;
            if (changed || past) {
                ext_fail(e, changed ? CHANGED_INPUTS : WROTE_PAST_OUTPUT, n, W->cols, B, 0, 0, 0.f, 0.f, 0.f);
                matmul_groups(W, a, B, c0, g1, y, ldy, accumulate);
                return;
            }
        }
        if (check) {
            __atomic_fetch_add(&e->audited, 1, __ATOMIC_RELAXED);
            const int64_t g = c0 + (int64_t)((draw & 0xffffffffULL) % (uint64_t)(c1 - c0));
            if (audit_group(e, W, a, B, g, r0, n, tmp, ref, bound)) {
                matmul_groups(W, a, B, c0, g1, y, ldy, accumulate);
                return;
            }
        }
        for (int64_t b = 0; b < B; b++) {
            float *dst = y + b * ldy + r0;
            const float *src = tmp + b * n;
            for (int64_t r = 0; r < n; r++) dst[r] = accumulate ? dst[r] + src[r] : src[r];
        }
    }
}

/* This thread's share of a matmul (an equal run of row groups), then a barrier. ``scratch``:
 * MV_SCRATCH floats per thread (for the external kernel). */
static void matmul(const Mat *W, const Act *a, int64_t B, float *y, int64_t ldy, int accumulate,
                   Ext *e, float *scratch, int64_t scratch_len) {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t groups = (W->rows + ROWS - 1) / ROWS;
    const int64_t g0 = groups * t / nt, g1 = groups * (t + 1) / nt;
    if (g0 < g1) {
        if (e && e->fn && W->type == SF_Q4_1 && !__atomic_load_n(&e->bad, __ATOMIC_RELAXED))
            matmul_external(e, W, a, B, g0, g1, y, ldy, accumulate, scratch + t * scratch_len, scratch_len);
        else
            matmul_groups(W, a, B, g0, g1, y, ldy, accumulate);
    }
#pragma omp barrier
}

/* ---------------------------------------------------------------------------------------- */
/* small ops                                                                                 */

static inline float silu(float g) { return g / (1.f + sf_exp(-g)); }

/* One query head against its cached keys and values: out[D]. Inlined with D a constant for
 * the common head sizes, so the accumulators live in registers. */
static inline __attribute__((always_inline)) void attend_d(
    const int64_t D, const float *q, const float *k, const float *v, int64_t len, float scale,
    float *scores, float *out) {
    float mx = -INFINITY;
    for (int64_t t = 0; t < len; t++) {
        const float *kt = k + t * D;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < D; i++) s += q[i] * kt[i];
        s *= scale;
        scores[t] = s;
        mx = s > mx ? s : mx;
    }
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < len; t++) {
        const float e = sf_exp(scores[t] - mx);
        scores[t] = e;
        sum += e;
    }
    float acc[D];
    for (int64_t i = 0; i < D; i++) acc[i] = 0.f;
    for (int64_t t = 0; t < len; t++) {
        const float p = scores[t];
        const float *vt = v + t * D;
#pragma omp simd
        for (int64_t i = 0; i < D; i++) acc[i] += p * vt[i];
    }
    const float inv = 1.f / sum;
    for (int64_t i = 0; i < D; i++) out[i] = acc[i] * inv;
}

static void attend(const float *q, const float *k, const float *v, int64_t len, int64_t D,
                   float scale, float *scores, float *out) {
    if (D == 64) attend_d(64, q, k, v, len, scale, scores, out);
    else if (D == 128) attend_d(128, q, k, v, len, scale, scores, out);
    else attend_d(D, q, k, v, len, scale, scores, out);
}

/* rotate-half RoPE in place on one head: x[i] = x[i]cos - x[i+h]sin, x[i+h] = x[i+h]cos + x[i]sin */
static void rope(float *x, const float *cs, int64_t D) {
    const int64_t h = D / 2;
    const float *c = cs, *s = cs + h;
    for (int64_t i = 0; i < h; i++) {
        const float a = x[i], b = x[i + h];
        x[i] = a * c[i] - b * s[i];
        x[i + h] = b * c[i] + a * s[i];
    }
}

/* ---------------------------------------------------------------------------------------- */
/* API                                                                                       */

const char *sf_isa(void) { return SF_ISA; }

static Act act_new(int64_t B, int64_t K) {
    Act a = {malloc(B * K), malloc(sizeof(float) * B * K / 32), malloc(sizeof(float) * B * K / 32),
             malloc(sizeof(int32_t) * B * K / 32)};
    return a;
}

static void act_free(Act *a) { free(a->q); free(a->d); free(a->s); free(a->c); }

void sf_model_free(Model *M) {
    if (!M) return;
    free(M->x); free(M->h); free(M->qkv); free(M->att); free(M->gu); free(M->ff); free(M->cs);
    free(M->scores);
    free(M->mv);
    act_free(&M->a_dim);
    act_free(&M->a_ffn);
    free(M);
}

/* Returns NULL when a dimension is unsupported (cols not a multiple of 32, odd head_dim). The
 * arrays passed in, and ext (NULL or an Ext with a kernel), must outlive the model (native.py
 * keeps them). */
Model *sf_model_new(int64_t n_layers, int64_t dim, int64_t n_heads, int64_t n_kv, int64_t head_dim,
                    int64_t ffn, int64_t vocab, float eps, int64_t max_b, int64_t slots,
                    int64_t max_len, const Mat *mats, const float **norms, float **kv,
                    const float *inv_freq, int threads, Ext *ext) {
    if (dim % 32 || ffn % 32 || (n_heads * head_dim) % 32 || head_dim % 2 || n_heads % n_kv)
        return NULL;
    Model *M = calloc(1, sizeof(Model));
    if (!M) return NULL;
    *M = (Model){n_layers, dim, n_heads, n_kv, head_dim, ffn, vocab, max_b, slots, max_len, eps,
                 threads > 0 ? threads : 1, mats, norms, kv, inv_freq};
    const int64_t qkv = (n_heads + 2 * n_kv) * head_dim, att = n_heads * head_dim;
    M->x = malloc(sizeof(float) * max_b * dim);
    M->h = malloc(sizeof(float) * max_b * (dim > att ? dim : att));
    M->qkv = malloc(sizeof(float) * max_b * qkv);
    M->att = malloc(sizeof(float) * max_b * att);
    M->gu = malloc(sizeof(float) * max_b * 2 * ffn);
    M->ff = malloc(sizeof(float) * max_b * ffn);
    M->cs = malloc(sizeof(float) * max_b * head_dim);
    M->scores = malloc(sizeof(float) * M->threads * max_len);
    M->a_dim = act_new(max_b, dim > att ? dim : att);
    M->a_ffn = act_new(max_b, ffn);
    M->ext = ext && ext->fn ? ext : NULL;
    M->mv_len = M->ext ? MV_SCRATCH(max_b) : 0;
    M->mv = M->mv_len ? malloc(sizeof(float) * M->threads * M->mv_len) : NULL;
    if ((M->mv_len && !M->mv) || !M->x || !M->h || !M->qkv || !M->att || !M->gu || !M->ff || !M->cs || !M->scores ||
        !M->a_dim.q || !M->a_dim.d || !M->a_dim.s || !M->a_dim.c || !M->a_ffn.q || !M->a_ffn.d ||
        !M->a_ffn.s || !M->a_ffn.c) {
        sf_model_free(M);
        return NULL;
    }
    return M;
}

static void step(Model *M, int64_t B, const float *x_in, const int64_t *slot, const int64_t *pos,
                 int64_t n_out, const int64_t *out_rows, float *logits) {
    const int64_t D = M->head_dim, H = M->n_heads, KV = M->n_kv, dim = M->dim, F = M->ffn;
    const int64_t G = H / KV, half = D / 2, QKV = (H + 2 * KV) * D, ATT = H * D;
    const float scale = 1.f / sqrtf((float)D);
    memcpy(M->x, x_in, sizeof(float) * B * dim);
    for (int64_t b = 0; b < B; b++) {
        float *cs = M->cs + b * D;
        for (int64_t i = 0; i < half; i++) {
            const float a = (float)pos[b] * M->inv_freq[i];
            cs[i] = cosf(a);
            cs[half + i] = sinf(a);
        }
    }
#pragma omp parallel num_threads(M->threads)
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *scores = M->scores + tid * M->max_len;
        for (int64_t l = 0; l < M->n_layers; l++) {
            const Mat *W = M->mats + 4 * l;
            float *cache = M->kv[l];
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                sf_rms_norm(M->x + b * dim, M->norms[2 * l], M->h + b * dim, dim, M->eps);
                quantize_row(M->h + b * dim, dim, &M->a_dim, b);
            }
            matmul(&W[0], &M->a_dim, B, M->qkv, QKV, 0, M->ext, M->mv, M->mv_len);
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                float *row = M->qkv + b * QKV;
                for (int64_t hh = 0; hh < H + KV; hh++) rope(row + hh * D, M->cs + b * D, D);
                for (int64_t p = 0; p < 2; p++)
                    for (int64_t g = 0; g < KV; g++)
                        memcpy(cache + (((p * M->slots + slot[b]) * KV + g) * M->max_len + pos[b]) * D,
                               row + (H + p * KV + g) * D, sizeof(float) * D);
            }
            for (int64_t task = tid; task < B * H; task += nt) {
                const int64_t b = task / H, hh = task % H, g = hh / G;
                const float *k = cache + ((0 * M->slots + slot[b]) * KV + g) * M->max_len * D;
                const float *v = cache + ((1 * M->slots + slot[b]) * KV + g) * M->max_len * D;
                attend(M->qkv + b * QKV + hh * D, k, v, pos[b] + 1, D, scale, scores,
                       M->att + b * ATT + hh * D);
            }
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) quantize_row(M->att + b * ATT, ATT, &M->a_dim, b);
            matmul(&W[1], &M->a_dim, B, M->x, dim, 1, M->ext, M->mv, M->mv_len);
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                sf_rms_norm(M->x + b * dim, M->norms[2 * l + 1], M->h + b * dim, dim, M->eps);
                quantize_row(M->h + b * dim, dim, &M->a_dim, b);
            }
            matmul(&W[2], &M->a_dim, B, M->gu, 2 * F, 0, M->ext, M->mv, M->mv_len);
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                const float *g = M->gu + b * 2 * F, *u = g + F;
                float *f = M->ff + b * F;
                for (int64_t i = 0; i < F; i++) f[i] = silu(g[i]) * u[i];
                quantize_row(f, F, &M->a_ffn, b);
            }
            matmul(&W[3], &M->a_ffn, B, M->x, dim, 1, M->ext, M->mv, M->mv_len);
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n_out; i++) {
            sf_rms_norm(M->x + out_rows[i] * dim, M->norms[2 * M->n_layers], M->h + i * dim, dim, M->eps);
            quantize_row(M->h + i * dim, dim, &M->a_dim, i);
        }
        if (n_out) matmul(&M->mats[4 * M->n_layers], &M->a_dim, n_out, logits, M->vocab, 0, M->ext, M->mv, M->mv_len);
    }
}

/* One step over B rows. x_in: [B, dim] token embeddings; slot/pos: each row's KV slot and the
 * position of its token (a row sees the cache of its slot up to its own position, including
 * rows of the same call); out_rows: the n_out rows whose logits are wanted, written in that
 * order to logits [n_out, vocab]. Returns 0; 1 when the external kernel failed its audit in
 * this step (the step was then run again on the built-in loop, which rewrites every row's K/V
 * and logits, and the kernel stays dropped: see Ext); -1 for bad arguments. */
int sf_decode(Model *M, int64_t B, const float *x_in, const int64_t *slot, const int64_t *pos,
              int64_t n_out, const int64_t *out_rows, float *logits) {
    if (B < 1 || B > M->max_b || n_out < 0 || n_out > B) return -1;
    for (int64_t b = 0; b < B; b++)
        if (slot[b] < 0 || slot[b] >= M->slots || pos[b] < 0 || pos[b] >= M->max_len) return -1;
    for (int64_t i = 0; i < n_out; i++)
        if (out_rows[i] < 0 || out_rows[i] >= B) return -1;
    const int was_bad = M->ext && __atomic_load_n(&M->ext->bad, __ATOMIC_SEQ_CST);
    step(M, B, x_in, slot, pos, n_out, out_rows, logits);
    if (M->ext && !was_bad && __atomic_load_n(&M->ext->bad, __ATOMIC_SEQ_CST)) {
        step(M, B, x_in, slot, pos, n_out, out_rows, logits);
        return 1;
    }
    return 0;
}

/* y[B, rows] = x[B, cols] @ W.T with the decode step's numerics (quantised activations), on
 * `threads` threads, on ext's kernel if given (NULL: the built-in loop). For tests and for
 * checking a build (and a kernel) against a reference. Returns 0, 1 as sf_decode, -1 for bad
 * arguments. */
int sf_linear(const Mat *W, int64_t B, const float *x, float *y, int threads, Ext *ext) {
    if (B < 1 || W->cols % 32) return -1;
    threads = threads > 0 ? threads : 1;
    Act a = act_new(B, W->cols);
    ext = ext && ext->fn ? ext : NULL;
    const int64_t mv_len = ext ? MV_SCRATCH(B) : 0;
    float *mv = mv_len ? malloc(sizeof(float) * threads * mv_len) : NULL;
    if (!a.q || !a.d || !a.s || !a.c || (mv_len && !mv)) { act_free(&a); free(mv); return -1; }
    for (int64_t b = 0; b < B; b++) quantize_row(x + b * W->cols, W->cols, &a, b);
    const int was_bad = ext && __atomic_load_n(&ext->bad, __ATOMIC_SEQ_CST);
#pragma omp parallel num_threads(threads)
    matmul(W, &a, B, y, W->rows, 0, ext, mv, mv_len);
    const int dropped = ext && !was_bad && __atomic_load_n(&ext->bad, __ATOMIC_SEQ_CST);
    if (dropped) { /* as sf_decode: again on the built-in loop, from x (the kernel may have changed a) */
        for (int64_t b = 0; b < B; b++) quantize_row(x + b * W->cols, W->cols, &a, b);
#pragma omp parallel num_threads(threads)
        matmul(W, &a, B, y, W->rows, 0, ext, mv, mv_len);
    }
    act_free(&a);
    free(mv);
    return dropped;
}
