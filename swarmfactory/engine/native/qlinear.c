/* Linear layers on GGUF block weights: y[M, N] = x[M, K] @ W^T, W kept as llama.cpp stores it.
 *
 * W is one or more parts stacked along N (a fused q|k|v may mix types), each part's rows as raw
 * GGUF blocks of one of: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 elements a block) or Q4_K, Q5_K, Q6_K
 * (256 a block). Block layouts: ggml-common.h (gguf-py's quants.py decodes the same bytes).
 *
 * Numerics (as llama.cpp on CPU). Each activation row is quantised once per call to 8 bits:
 *   - for the 32-element types per block of 32 (Q8_0-style): d = amax / 127, q = rint(x / d)
 *     (x * (127 / amax) in fp32, rounded to nearest even), |q| <= 127, and s = d * sum(q);
 *   - for the K-quants per block of 256 (Q8_K-style): d = amax / 127 over the 256, q as above,
 *     and the sums of q per 16 (bsums).
 * Each block's dot product of weight quants and activation quants is exact in int32: Q8_0
 * takes the signed quants; Q4_0, Q4_1, Q5_0, Q5_1 the unsigned ones u (w = d u + m), plus
 * m * s per block in fp32 (m: Q4_1, Q5_1's stored min, -8 d for Q4_0, -16 d for Q5_0); per
 * super-block Q4_K, Q5_K the integer sums sum_j sc_j dot_j and sum_j m_j bsum_j (times d dx
 * and -dmin dx), Q6_K sum_j sc_j (dot_j - 32 bsum_j) in one integer. The scales are applied
 * in fp32, a fused multiply-add per block into 8 lanes summed at the end. So y = sum_i w_i xq_i
 * (w_i the fp32-dequantised weight, xq_i = d q_i) up to fp32 rounding, and against the fp32
 * reference x @ W^T:
 *     |y - x @ W^T| <= sum_i |w_i| d(i) / 2  +  eps * S,    S = sum_i |w_i| |x_i|,
 * where d(i) is the scale of the activation block holding element i (|x_i - xq_i| <= d(i) / 2)
 * and eps covers fp32 arithmetic: about (K/32) * 2^-24 relative to the terms summed, which for
 * the types with a min (d u and m) and the K-quants (their two integer sums) may exceed |w| by
 * a small factor; the check at load and the tests use eps = 1e-5 (measured: below 1e-7). The first
 * term dominates: on Gaussian activations the largest error of an output is ~0.1-0.15% of its
 * S, and 5-15% of this bound (which assumes every rounding error at its worst).
 * A non-finite activation makes its block's scale NaN, so every output it reaches is NaN.
 *
 * Batch and thread invariance: output (m, n) is computed by one thread with the same
 * operations whatever M, the thread count or the other rows are (see "threads" below).
 *
 * ISA (from the compiler flags, qlinear.py builds each path): portable C; AVX2+FMA+F16C
 * (maddubs/madd); AVX-512 BW/VL (the AVX2 code in EVEX form: 32 registers, so the activation
 * rows of a pass no longer spill); AVX-512 VNNI or AVX-VNNI (vpdpbusd for the 32-element
 * types). The SIMD code uses 256-bit vectors on every path. SF_EMULATE_VNNI builds the VNNI
 * code with vpdpbusd emulated exactly by AVX2 (tests: the VNNI arithmetic is checked on any
 * AVX2 host).
 */
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define SF_SIMD 1
#if defined(SF_EMULATE_VNNI)
#define SF_ISA "avx2-emulated-vnni"
#define DPBUSD(acc, u, s) dpbusd_emulated((acc), (u), (s))
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SF_ISA "avx512vnni"
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(__AVXVNNI__)
#define SF_ISA "avxvnni"
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#elif defined(__AVX512BW__) && defined(__AVX512VL__)
#define SF_ISA "avx512"
#else
#define SF_ISA "avx2"
#endif
/* activation rows per pass over a weight row: each weight block is unpacked once for all of
 * them. 8 also on AVX2, where their accumulators no longer all fit in its 16 registers:
 * measured 1.1-1.3x faster than 4 at 64 rows, the same at 4-16 (and the same results). */
#define MT 8
#else
#define SF_ISA "portable"
#define SF_SIMD 0
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

/* An external kernel for the parts of one type: a kernel of the kernel factory's
 * <type>_engine_matmul problem (a separate shared object, found by pointer), with the ABI and
 * numerics of sf_qlinear_q32 (32-element types) or sf_qlinear_q256 (K-quants) below, and its audit. The same layout as decode.c's Ext (Python:
 * library.Ext). Its calls on a thread's run of rows read that thread's private copy of the
 * activations (so they cannot change what another thread's calls read), compared with the
 * original after the run, and every call has guard floats after its outputs; a changed copy, a
 * written guard and an audited output outside the tolerance drop the kernel for good
 * (bad = 1): from then on rows_dot runs, the call that found it is recomputed there, and
 * sf_qlinear and sf_qstep run their whole call again (returning 1). Audited: the first call at
 * each batch size and 1 in `share` of the others, one random row of the call for every batch
 * row, against rows_dot. */
typedef void (*Q32Fn)(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, float *y, int64_t n,
                      int64_t k, int64_t batch);
/* the K-quants' (Q4_K, Q5_K, Q6_K): activations per block of 256 and their sums per 16 */
typedef void (*Q256Fn)(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *bsums, float *y,
                       int64_t n, int64_t k, int64_t batch);
typedef SfExt QExt; /* common.c: fn is a Q32Fn, or a Q256Fn for a K-quant part */

/* One part of W: `rows` rows of K / elems(type) blocks each, row r at data + r * row_bytes;
 * ext: NULL, or an external kernel for it; pack: NULL, or the same rows in the interleaved
 * layout of sf_qlinear_pack (a type this build packs: sf_qlinear_pack_bytes > 0). */
typedef struct {
    int64_t type, rows, row_bytes;
    const uint8_t *data;
    QExt *ext;
    const uint8_t *pack;
} QPart;

static int64_t elems(int64_t t) { return t == Q4_K || t == Q5_K || t == Q6_K ? 256 : 32; }

static int64_t block_bytes(int64_t t) {
    switch (t) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
    }
}

const char *sf_qlinear_isa(void) { return SF_ISA; }

/* ---------------------------------------------------------------------------------------- */
/* scalars                                                                                   */

static inline float fp16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if SF_SIMD
    return _cvtsh_ss(h);
#else
    return sf_half(h);
#endif
}

static inline float bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

static inline uint16_t float_to_bf16(float f) { /* round to nearest even, as torch */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

/* Q4_K / Q5_K: the 12 bytes of 6-bit scales and mins -> sc[0..7], mn[0..7] (llama.cpp's
 * get_scale_min_k4, four at a time) */
static inline void k4_scales(const uint8_t *s12, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[4];
    memcpy(u, s12, 12);
    u[3] = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const uint32_t mins_lo = u[1] & 0x3F3F3F3Fu;
    u[1] = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = mins_lo;
    u[0] &= 0x3F3F3F3Fu;
    memcpy(sc, u, 8);
    memcpy(mn, u + 2, 8);
}

/* ---------------------------------------------------------------------------------------- */
/* activation quantisation (the same C on every path, so every path sees the same q)         */

typedef struct {         /* per block of 32 */
    int8_t *q;           /* [M, K] */
    float *d;            /* [M, K/32] */
    float *s;            /* [M, K/32] d * sum(q) */
    int32_t *isum;       /* [M, K/32] sum(q), or NULL (the packed kernel needs it) */
} Act32;

typedef struct {         /* per block of 256 */
    int8_t *q;           /* [M, K] */
    float *d;            /* [M, K/256] */
    int16_t *bsums;      /* [M, K/16] sums of q per 16 */
} Act256;

/* n (32 or 256) values -> q, returns d; *isum = sum(q). A non-finite value gives d = NaN. */
static float quantize_block(const float *x, int n, int8_t *q, int32_t *isum) {
    float amax = 0.f;
    int bad = 0;
#pragma omp simd reduction(max : amax) reduction(| : bad)
    for (int t = 0; t < n; t++) {
        const float a = fabsf(x[t]);
        amax = a > amax ? a : amax;
        bad |= !(a <= 3.4028234663852886e38f); /* inf or NaN */
    }
    *isum = 0;
    if (bad) {
        memset(q, 0, (size_t)n);
        return NAN;
    }
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    int32_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int t = 0; t < n; t++) {
        float v = x[t] * id;
        v = v > 127.f ? 127.f : v < -127.f ? -127.f : v;
        const int r = (int)nearbyintf(v);
        q[t] = (int8_t)r;
        sum += r;
    }
    *isum = sum;
    return amax / 127.f;
}

static void quantize_row(const float *x, int64_t K, int64_t m, Act32 *a32, Act256 *a256) {
    int32_t isum;
    if (a32->q) {
        const int64_t nb = K / 32;
        for (int64_t j = 0; j < nb; j++) {
            const float d = quantize_block(x + 32 * j, 32, a32->q + m * K + 32 * j, &isum);
            a32->d[m * nb + j] = d;
            a32->s[m * nb + j] = d * (float)isum;
            if (a32->isum) a32->isum[m * nb + j] = isum;
        }
    }
    if (a256->q) {
        const int64_t nb = K / 256;
        for (int64_t j = 0; j < nb; j++) {
            int8_t *q = a256->q + m * K + 256 * j;
            a256->d[m * nb + j] = quantize_block(x + 256 * j, 256, q, &isum);
            int16_t *bs = a256->bsums + m * (K / 16) + 16 * j;
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int t = 0; t < 16; t++) s += q[16 * g + t];
                bs[g] = (int16_t)s;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* portable kernels: one (row, activation row) at a time, plain C                            */

#if !SF_SIMD
/* block -> 32 quants as the SIMD code takes them (Q8_0: the signed quants, w = d * q; the others
 * unsigned, 0..15 or 0..31, w = d * u + m with m the stored min of Q4_1, Q5_1 and -8 d, -16 d for
 * Q4_0, Q5_0), returns d; *m = m (0 for Q8_0). So every path computes the same function of
 * (xq, xd, xs): sum_j d dx dot + m s, s taken as given (the kernel factory's
 * <type>_engine_matmul problems, whose timing runs mix inputs of several draws). */
static float unpack32(int64_t t, const uint8_t *b, int8_t q[32], float *m) {
    *m = 0.f;
    if (t == Q8_0) {
        memcpy(q, b + 2, 32);
        return fp16(b);
    }
    const int has_m = t == Q4_1 || t == Q5_1, five = t == Q5_0 || t == Q5_1;
    const uint8_t *qs = b + 2 + 2 * has_m + 4 * five;
    uint32_t qh = 0;
    if (five) memcpy(&qh, b + 2 + 2 * has_m, 4);
    for (int i = 0; i < 16; i++) {
        q[i] = (int8_t)((qs[i] & 0x0F) | (((qh >> i) & 1) << 4));
        q[i + 16] = (int8_t)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
    }
    const float d = fp16(b);
    *m = has_m ? fp16(b + 2) : (five ? -16.f : -8.f) * d;
    return d;
}

static float dot32(int64_t t, const uint8_t *w, int64_t K, const Act32 *a, int64_t m) {
    const int64_t nb = K / 32, bs = block_bytes(t);
    const int8_t *xq = a->q + m * K;
    float acc = 0.f, accm = 0.f;
    for (int64_t j = 0; j < nb; j++) {
        int8_t q[32];
        float mw;
        const float dw = unpack32(t, w + j * bs, q, &mw);
        int32_t s = 0;
        for (int i = 0; i < 32; i++) s += q[i] * xq[32 * j + i];
        acc += (float)s * (dw * a->d[m * nb + j]);
        if (t != Q8_0) accm += mw * a->s[m * nb + j]; /* Q8_0 has no min term: s is not read */
    }
    return acc + accm;
}

/* super-block -> 256 unsigned quants (Q4_K/Q5_K: 0..31, Q6_K: 0..63, its -32 applied through the
 * activations' bsums as the SIMD code does) and its integer scales */
static void unpack256(int64_t t, const uint8_t *b, int8_t q[256], int16_t sc[16], int16_t mn[8],
                      float *d, float *dmin) {
    if (t == Q6_K) {
        const uint8_t *ql = b, *qh = b + 128;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int l = 0; l < 32; l++) {
                    const int lo = (ql[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 0x0F;
                    const int hi = (qh[32 * h + l] >> (2 * s)) & 3;
                    q[128 * h + 32 * s + l] = (int8_t)(lo | (hi << 4)); /* 0..63; the -32 goes through bsums */
                }
        for (int i = 0; i < 16; i++) sc[i] = (int8_t)b[192 + i];
        *d = fp16(b + 208);
        *dmin = 0.f;
        return;
    }
    uint8_t s8[8], m8[8];
    k4_scales(b + 4, s8, m8);
    for (int j = 0; j < 8; j++) { sc[j] = s8[j]; mn[j] = m8[j]; }
    const uint8_t *qh = b + 16, *qs = b + (t == Q5_K ? 48 : 16);
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) {
            int v = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
            if (t == Q5_K) v |= ((qh[l] >> j) & 1) << 4;
            q[32 * j + l] = (int8_t)v;
        }
    *d = fp16(b);
    *dmin = fp16(b + 2);
}

static float dot256(int64_t t, const uint8_t *w, int64_t K, const Act256 *a, int64_t m) {
    const int64_t nb = K / 256, bs = block_bytes(t);
    float acc = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        int8_t q[256];
        int16_t sc[16], mn[8];
        float d, dmin;
        unpack256(t, w + i * bs, q, sc, mn, &d, &dmin);
        const int8_t *xq = a->q + m * K + 256 * i;
        const int16_t *bsum = a->bsums + m * (K / 16) + 16 * i;
        const int sub = t == Q6_K ? 16 : 32;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 256 / sub; j++) {
            int32_t s = 0;
            for (int l = 0; l < sub; l++) s += q[sub * j + l] * xq[sub * j + l];
            if (t == Q6_K) s -= 32 * bsum[j]; /* as the SIMD code: the bsums as given */
            isum += sc[j] * s;
            if (t != Q6_K) msum += mn[j] * (bsum[2 * j] + bsum[2 * j + 1]);
        }
        const float dx = a->d[m * nb + i];
        acc += (d * dx) * (float)isum - (dmin * dx) * (float)msum;
    }
    return acc;
}
#endif

/* ---------------------------------------------------------------------------------------- */
/* SIMD kernels                                                                              */

#if SF_SIMD
#define INLINE static inline __attribute__((always_inline))

#ifdef SF_EMULATE_VNNI
/* vpdpbusd exactly: acc + per 32-bit lane sum of 4 u8 * s8, no saturation */
INLINE __m256i dpbusd_emulated(__m256i acc, __m256i u, __m256i s) {
    const __m256i ue = _mm256_and_si256(u, _mm256_set1_epi16(0x00FF)), uo = _mm256_srli_epi16(u, 8);
    const __m256i se = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8), so = _mm256_srai_epi16(s, 8);
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(ue, se), _mm256_madd_epi16(uo, so)));
}
#endif

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31) */
INLINE __m256i nibbles32(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

/* bit i of the 32-bit little-endian qh -> 0x10 in byte i */
INLINE __m256i bits32(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf);
    b = _mm256_cmpeq_epi8(_mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

/* A block's 32 weight quants as the dot takes them. Q8_0 (w = d * q, q signed) as |q|, with q
 * in *sgn; the others as unsigned quants u (Q4_0, Q4_1: the nibble, Q5_0, Q5_1: 5 bits), with
 * w = d * u + m: m is the stored min for Q4_1, Q5_1 and -8 d (Q4_0), -16 d (Q5_0). */
INLINE __m256i quants32(const int T, const uint8_t *b, __m256i *sgn) {
    switch (T) {
    case Q8_0: {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
        *sgn = q;
        return _mm256_sign_epi8(q, q);
    }
    case Q4_0: return nibbles32(b + 2);
    case Q5_0: return _mm256_or_si256(nibbles32(b + 6), bits32(b + 2));
    case Q4_1: return nibbles32(b + 4);
    default: return _mm256_or_si256(nibbles32(b + 8), bits32(b + 4));
    }
}

/* 8 int32 lanes, each the sum of 4 products of weight quants and activation quants. Exact:
 * the first operand is unsigned (|q| <= 128, or u <= 31) and the activations' |q| <= 127, so
 * maddubs's int16 pair sums stay below 2 * 128 * 127 < 2^15 (vpdpbusd has no such limit). */
INLINE __m256i dot32x(const int T, __m256i u, __m256i sgn, const int8_t *xp) {
    __m256i x = _mm256_loadu_si256((const __m256i *)xp);
    if (T == Q8_0) x = _mm256_sign_epi8(x, sgn);
#ifdef DPBUSD
    return DPBUSD(_mm256_setzero_si256(), u, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
}

/* The weight scales d (off 0) or the mins m (off 2) of 8 consecutive blocks, as fp32. Q4_0
 * and Q5_0 have no stored min: theirs is -8 d, -16 d (exact in fp32). */
INLINE __m256 scales8(const int T, const uint8_t *b, int64_t bs, int min) {
    uint16_t h[8];
    const int off = min && (T == Q4_1 || T == Q5_1) ? 2 : 0;
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) memcpy(h + i, b + i * bs + off, 2);
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
    if (!min || off) return v;
    return _mm256_mul_ps(v, _mm256_set1_ps(T == Q4_0 ? -8.f : -16.f));
}

/* Rows m0 .. m0 + NM - 1 of one weight row, 32-element type T: out[mm] = sum_j dw_j dx_mj
 * dot_j (+ sum_j m_j s_mj for every type but Q8_0, s_mj = dx_mj * sum of the row's block j
 * quants), per lane in fp32 and the lanes summed at the end. Blocks go in groups of 8: the
 * group's scale products dw_j dx_mj are computed 8 at a time (one multiply per row and group)
 * and its min terms m_j s_mj go into the same accumulator 8 at a time; then per block and row
 * one integer dot, its conversion and one fused multiply-add. The blocks after the last whole
 * group are scaled one at a time. The same operations for a row whatever NM is. */
INLINE void tile32(const int T, const int NM, const uint8_t *w, int64_t K, const Act32 *a, int64_t m0, float *out) {
    const int64_t nb = K / 32, bs = T == Q4_0 ? 18 : T == Q4_1 ? 20 : T == Q5_0 ? 22 : T == Q5_1 ? 24 : 34;
    __m256 acc[MT]; /* sized by a constant: a VLA would never live in registers */
    float sc[MT][8] __attribute__((aligned(32)));
#pragma GCC unroll 8
    for (int mm = 0; mm < NM; mm++) acc[mm] = _mm256_setzero_ps();
    const int8_t *xq = a->q + m0 * K;
    const float *xd = a->d + m0 * nb, *xs = a->s + m0 * nb;
    __m256i sgn = _mm256_setzero_si256();
    int64_t j = 0;
    for (; j + 8 <= nb; j += 8) {
        const uint8_t *b = w + j * bs;
        const __m256 dw = scales8(T, b, bs, 0);
        const __m256 mw = T == Q8_0 ? dw : scales8(T, b, bs, 1);
#pragma GCC unroll 8
        for (int mm = 0; mm < NM; mm++) {
            _mm256_store_ps(sc[mm], _mm256_mul_ps(dw, _mm256_loadu_ps(xd + mm * nb + j)));
            if (T != Q8_0) acc[mm] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(xs + mm * nb + j), acc[mm]);
        }
#pragma GCC unroll 1
        for (int jj = 0; jj < 8; jj++) {
            const __m256i u = quants32(T, b + jj * bs, &sgn);
#pragma GCC unroll 8
            for (int mm = 0; mm < NM; mm++) {
                const __m256i p = dot32x(T, u, sgn, xq + mm * K + 32 * (j + jj));
                acc[mm] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&sc[mm][jj]), acc[mm]);
            }
        }
    }
    for (; j < nb; j++) {
        const uint8_t *b = w + j * bs;
        const __m256i u = quants32(T, b, &sgn);
        const float dw = fp16(b);
        const float mw = T == Q4_0 ? -8.f * dw : T == Q5_0 ? -16.f * dw : T == Q8_0 ? 0.f : fp16(b + 2);
#pragma GCC unroll 8
        for (int mm = 0; mm < NM; mm++) {
            const __m256i p = dot32x(T, u, sgn, xq + mm * K + 32 * j);
            acc[mm] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * xd[mm * nb + j]), acc[mm]);
            if (T != Q8_0) acc[mm] = _mm256_fmadd_ps(_mm256_set1_ps(0.125f * mw), _mm256_set1_ps(xs[mm * nb + j]),
                                                     acc[mm]);
        }
    }
#pragma GCC unroll 8
    for (int mm = 0; mm < NM; mm++) out[mm] = hsum(acc[mm]);
}

/* One super-block of a K-quant unpacked for the dot: 8 vectors of 32 unsigned quants, the
 * int16 scales to madd them with, and the min (Q4_K/Q5_K) or -32 (Q6_K) term's int16 factors
 * per 16 elements (against the activations' bsums). */
typedef struct {
    __m256i q[8], sc[8], f16;
    float d, dmin;
} SuperBlock;

/* A vpshufb mask that fills the low 128 bits with int16 number `lo` of the source's low half
 * and the high 128 bits with number `hi` of its high half (a broadcast of a scale per half). */
INLINE __m256i pick16(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * hi)),
                            _mm_set1_epi16((short)(0x0100 + 0x0202 * lo)));
}

INLINE void unpack_k(const int T, const uint8_t *b, SuperBlock *u) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    if (T == Q6_K) {
        const uint8_t *ql = b, *qh = b + 128;
        const __m256i top = _mm256_set1_epi8(0x30);
        /* the 16 int8 scales as int16, each 128-bit half repeated in both halves for vpshufb */
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
        const __m256i s_lo = _mm256_permute2x128_si256(s16, s16, 0x00);
        const __m256i s_hi = _mm256_permute2x128_si256(s16, s16, 0x11);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) { /* elements 32c..: half h = c / 4, s = c % 4 */
            const int h = c / 4, s = c % 4;
            __m256i lo = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32 * (s & 1)));
            if (s >> 1) lo = _mm256_srli_epi16(lo, 4);
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            /* bits 2s, 2s + 1 of each byte to bits 4, 5 */
            const __m256i hi = s == 2 ? bits : s < 2 ? _mm256_slli_epi16(bits, 4 - 2 * s) : _mm256_srli_epi16(bits, 2);
            u->q[c] = _mm256_or_si256(_mm256_and_si256(lo, low), _mm256_and_si256(hi, top));
            /* sub-blocks 2c (elements 0..15 of the chunk) and 2c + 1 */
            u->sc[c] = _mm256_shuffle_epi8(c < 4 ? s_lo : s_hi, pick16((2 * c) % 8, (2 * c + 1) % 8));
        }
        u->f16 = s16;
        u->d = fp16(b + 208);
        u->dmin = 0.f;
        return;
    }
    uint8_t sm[16]; /* scales, then mins */
    k4_scales(b + 4, sm, sm + 8);
    const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sm));
    const __m256i sc = _mm256_permute2x128_si256(sm16, sm16, 0x00), mn = _mm256_permute2x128_si256(sm16, sm16, 0x11);
    const uint8_t *qs = b + (T == Q5_K ? 48 : 16);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        u->q[2 * c] = _mm256_and_si256(v, low);
        u->q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    if (T == Q5_K) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16)), bit4 = _mm256_set1_epi8(0x10);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) { /* bit j of each byte to bit 4 */
            const __m256i h = j < 4 ? _mm256_slli_epi16(qh, 4 - j) : j > 4 ? _mm256_srli_epi16(qh, j - 4) : qh;
            u->q[j] = _mm256_or_si256(u->q[j], _mm256_and_si256(h, bit4));
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) u->sc[j] = _mm256_shuffle_epi8(sc, pick16(j, j));
    u->f16 = _mm256_shuffle_epi8(mn, _mm256_set_epi8(15, 14, 15, 14, 13, 12, 13, 12, 11, 10, 11, 10, 9, 8, 9, 8,
                                                     7, 6, 7, 6, 5, 4, 5, 4, 3, 2, 3, 2, 1, 0, 1, 0)); /* m_j per 16 */
    u->d = fp16(b);
    u->dmin = fp16(b + 2);
}

/* Rows m0 .. m0 + NM - 1 of one weight row, K-quant T. Per super-block the integer sum
 * sum_j sc_j * dot_j (Q6_K: less 32 * sum_j sc_j * bsum_j) is exact in int32 (bounded by
 * 2^25), then d * dx (and for Q4_K/Q5_K - dmin * dx * sum_j m_j * bsum_j) in fp32. */
INLINE void tilek(const int T, const int NM, const uint8_t *w, int64_t K, const Act256 *a,
                  int64_t m0, float *out) {
    const int64_t nb = K / 256, bs = T == Q4_K ? 144 : T == Q5_K ? 176 : 210;
    __m256 acc[MT];
#pragma GCC unroll 8
    for (int mm = 0; mm < NM; mm++) acc[mm] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        SuperBlock u;
        unpack_k(T, w + i * bs, &u);
#pragma GCC unroll 8
        for (int mm = 0; mm < NM; mm++) {
            const int64_t m = m0 + mm;
            const int8_t *x = a->q + m * K + 256 * i;
            __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m256i p = _mm256_maddubs_epi16(u.q[c], _mm256_loadu_si256((const __m256i *)(x + 32 * c)));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, u.sc[c]));
            }
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)(a->bsums + m * (K / 16) + 16 * i));
            const __m256i f = _mm256_madd_epi16(u.f16, bsums);
            const float dx = a->d[m * nb + i];
            if (T == Q6_K) s = _mm256_sub_epi32(s, _mm256_slli_epi32(f, 5));
            acc[mm] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(u.d * dx), acc[mm]);
            if (T != Q6_K) acc[mm] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(f), _mm256_set1_ps(u.dmin * dx), acc[mm]);
        }
    }
#pragma GCC unroll 8
    for (int mm = 0; mm < NM; mm++) out[mm] = hsum(acc[mm]);
}

/* Passes of 8, 4, 2 and 1 rows (a constant in each copy of the tile code: four copies, not
 * eight, as the rows' results do not depend on the pass they are in). */
#define TILES(CALL) \
    for (int64_t m0 = 0; m0 < M;) { \
        const int64_t left = M - m0; \
        if (left >= 8) { CALL(8); m0 += 8; } \
        else if (left >= 4) { CALL(4); m0 += 4; } \
        else if (left >= 2) { CALL(2); m0 += 2; } \
        else { CALL(1); m0 += 1; } \
    }

#endif

/* Weight rows a call takes together (at most ROW_GROUP, and about GROUP_BYTES of them): each
 * pass of activation rows runs over all of them before the next pass, so the pass's quantised
 * activations stay in L1 while the group's rows stream by. With the weight row outermost, 64
 * activation rows (40 KB at K = 640) went through L2 for every weight row: 20% slower per
 * product at 64 rows than at 8 on an AVX2 core. */
#define ROW_GROUP 16
#define GROUP_BYTES 16384

static int64_t row_group(int64_t row_bytes) {
    const int64_t g = GROUP_BYTES / (row_bytes > 0 ? row_bytes : 1);
    return g < 1 ? 1 : g > ROW_GROUP ? ROW_GROUP : g;
}

#if SF_SIMD
/* out[r * M + m] = W[row r] . x[m], r < R, m < M; row r at w + r * rb. Each output's operations
 * depend on neither R nor M (nor the pass its activation row is in). */
INLINE void group32(const int T, const uint8_t *w, int64_t rb, int64_t R, int64_t K, const Act32 *a, int64_t M,
                    float *out) {
#define CALL32G(k) for (int64_t r = 0; r < R; r++) tile32(T, k, w + r * rb, K, a, m0, out + r * M + m0)
    TILES(CALL32G)
#undef CALL32G
}

INLINE void groupk(const int T, const uint8_t *w, int64_t rb, int64_t R, int64_t K, const Act256 *a, int64_t M,
                   float *out) {
#define CALLKG(k) for (int64_t r = 0; r < R; r++) tilek(T, k, w + r * rb, K, a, m0, out + r * M + m0)
    TILES(CALLKG)
#undef CALLKG
}
#endif

static void rows_dot(int64_t t, const uint8_t *w, int64_t rb, int64_t R, int64_t K, const Act32 *a32,
                     const Act256 *a256, int64_t M, float *out) {
#if SF_SIMD
    switch (t) {
    case Q4_0: group32(Q4_0, w, rb, R, K, a32, M, out); break;
    case Q4_1: group32(Q4_1, w, rb, R, K, a32, M, out); break;
    case Q5_0: group32(Q5_0, w, rb, R, K, a32, M, out); break;
    case Q5_1: group32(Q5_1, w, rb, R, K, a32, M, out); break;
    case Q8_0: group32(Q8_0, w, rb, R, K, a32, M, out); break;
    case Q4_K: groupk(Q4_K, w, rb, R, K, a256, M, out); break;
    case Q5_K: groupk(Q5_K, w, rb, R, K, a256, M, out); break;
    default: groupk(Q6_K, w, rb, R, K, a256, M, out); break;
    }
#else
    for (int64_t r = 0; r < R; r++)
        for (int64_t m = 0; m < M; m++)
            out[r * M + m] = elems(t) == 32 ? dot32(t, w + r * rb, K, a32, m) : dot256(t, w + r * rb, K, a256, m);
#endif
}

/* y[m * R + r] = W[row r] . x[m] for R rows (row stride rb) of type t, on the engine's own
 * kernel: the layout of the external kernels' ABI. tmp: ROW_GROUP * M floats. */
static void own_rows_t(int64_t t, const uint8_t *w, int64_t rb, int64_t R, int64_t K, const Act32 *a32,
                       const Act256 *a256, int64_t M, float *y, float *tmp) {
    const int64_t g = row_group(rb);
    for (int64_t r0 = 0; r0 < R; r0 += g) {
        const int64_t G = R - r0 < g ? R - r0 : g;
        rows_dot(t, w + r0 * rb, rb, G, K, a32, a256, M, tmp);
        for (int64_t m = 0; m < M; m++)
            for (int64_t r = 0; r < G; r++) y[m * R + r0 + r] = tmp[r * M + m];
    }
}

/* ---------------------------------------------------------------------------------------- */
/* packed 32-element types: 8 weight rows interleaved, one vpdpbusd per 4 columns of 8 rows */

/* The layout (sf_qlinear_pack), for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: rows in groups of 8 (the
 * last padded with zero blocks), each group its K/32 blocks in order, each block the same bytes
 * as the 8 rows' stored blocks (pack_block), rearranged:
 *   - the 8 rows' fp16 scales d; then (Q4_1, Q5_1) their fp16 mins m;
 *   - Q5_0, Q5_1: the fifth bits, 4 bytes a row: bit c of byte e is element 4c + e's;
 *   - Q4_*, Q5_*: for c = 0..3 the 8 rows' nibble bytes 4c..4c+3 (32 bytes: low nibbles are
 *     elements 4c + e, high nibbles 16 + 4c + e);
 *   - Q8_0: for c = 0..7 the 8 rows' quants 4c..4c+3, each q + 128 (unsigned).
 * So one 32-byte load (and for the 4/5-bit types a mask or shift) is 4 columns of 8 rows, and
 * vpdpbusd against 4 activation quants broadcast gives the 8 rows' partial dots in 8 lanes: a
 * block's 8 dots come out in one vector, and its scale product, conversion and fused multiply-adds
 * are one each for 8 outputs (on the stored layout, one each per output, and a horizontal sum).
 * Q8_0's +128 comes off exactly as 128 * sum(xq) per activation block (Act32.isum).
 * Each output is, in one fp32 lane, j in order: acc = fma(dot_j, fl(dw_j dx_j), acc), then (all
 * but Q8_0) acc = fma(m_j, xs_j, acc): the same operations whatever M, the pass or the thread
 * (batch and thread invariant as the rest). The same numbers as the stored layout's kernel up to
 * fp32 rounding (that one sums 8 lanes and adds them at the end).
 * Built only where vpdpbusd is (VNNI, or its exact emulation): AVX2's maddubs would saturate
 * on Q8_0's +128 quants. */
#define PACK_ROWS 8

static int has_min(int64_t t) { return t == Q4_1 || t == Q5_1; }
static int five_bit(int64_t t) { return t == Q5_0 || t == Q5_1; }

/* Q4_K and Q5_K packed (sf_qlinear_pack), per 8-row group and super-block of 256, the 8 rows'
 * bytes rearranged: fp16 d[8], dmin[8]; the 6-bit scales sc[sub-block 0..7][row] and mins
 * m[sub-block][row] as bytes; (Q5_K) the fifth bits, 8 x (8 rows x 4 bytes): byte e of plane p
 * is the row's stored qh[4p + e] (bit j: element 32j + 4p + e); the nibbles, 4 x 8 x (8 rows x 4
 * bytes): byte e of (c, p) is the row's qs[32c + 4p + e] (low nibble: element 64c + 4p + e,
 * high: 64c + 32 + 4p + e). Per super-block and lane (row) the stored layout's two integer sums,
 * sum_j sc_j dot_j and sum_j m_j bsum_j, then acc = fma(isum, d dx, acc) and
 * acc = fnmadd(msum, dmin dx, acc). Q6_K stays on the stored layout: its 6-bit quants in this
 * form cost more to unpack than the layout saved (measured 0.6-0.9x on a Zen 4). */
static int64_t pack_block_k(int64_t t) {
    return t == Q4_K ? 32 + 128 + 1024 : t == Q5_K ? 32 + 128 + 256 + 1024 : 0;
}

/* bytes of a packed block of 8 rows (32 elements, or a super-block of 256) */
static int64_t pack_block(int64_t t) { return elems(t) == 32 ? PACK_ROWS * block_bytes(t) : pack_block_k(t); }

#if SF_SIMD && defined(DPBUSD)
#define SF_PACK 1
#if defined(__AVX512VL__)
#define MTP 8 /* activation rows per pass: 2 vectors each, 32 registers */
#else
#define MTP 4 /* 16 registers */
#endif

/* bit c of each byte at bit 4 (the fifth bits of group c: elements 4c..4c+3 of each row) */
INLINE __m256i fifth(__m256i h, const int c) {
    const __m256i s = c < 4 ? _mm256_slli_epi16(h, 4 - c) : c > 4 ? _mm256_srli_epi16(h, c - 4) : h;
    return _mm256_and_si256(s, _mm256_set1_epi8(0x10));
}

INLINE __m256i bcast4(const void *p) { /* 4 bytes at p in every 32-bit lane */
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Rows r_lo .. r_hi - 1 of the 8-row group at g (type T), activation rows m0 .. m0 + NM - 1:
 * out[r * ldo + m]. */
INLINE void tile_pack(const int T, const int NM, const uint8_t *g, int64_t K, const Act32 *a, int64_t m0,
                      float *out, int64_t ldo, int r_lo, int r_hi) {
    const int64_t nb = K / 32, pb = pack_block(T);
    const int M1 = has_min(T), F5 = five_bit(T);
    __m256 acc[MTP];
#pragma GCC unroll 8
    for (int mm = 0; mm < NM; mm++) acc[mm] = _mm256_setzero_ps();
    const int8_t *xq = a->q + m0 * K;
    const float *xd = a->d + m0 * nb, *xs = a->s + m0 * nb;
    const int32_t *xi = T == Q8_0 ? a->isum + m0 * nb : NULL;
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int64_t j = 0; j < nb; j++) {
        const uint8_t *b = g + j * pb;
        const int8_t *x = xq + 32 * j;
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        __m256i s[MTP];
        if (T == Q8_0) {
#pragma GCC unroll 8
            for (int mm = 0; mm < NM; mm++) s[mm] = _mm256_set1_epi32(-128 * xi[mm * nb + j]);
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m256i wq = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
#pragma GCC unroll 8
                for (int mm = 0; mm < NM; mm++) s[mm] = DPBUSD(s[mm], wq, bcast4(x + mm * K + 4 * c));
            }
        } else {
            const uint8_t *qs = b + 16 + 16 * M1 + 32 * F5;
            const __m256i h = F5 ? _mm256_loadu_si256((const __m256i *)(b + 16 + 16 * M1)) : _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int mm = 0; mm < NM; mm++) s[mm] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                if (F5) {
                    lo = _mm256_or_si256(lo, fifth(h, c));
                    hi = _mm256_or_si256(hi, fifth(h, c + 4));
                }
#pragma GCC unroll 8
                for (int mm = 0; mm < NM; mm++) {
                    s[mm] = DPBUSD(s[mm], lo, bcast4(x + mm * K + 4 * c));
                    s[mm] = DPBUSD(s[mm], hi, bcast4(x + mm * K + 16 + 4 * c));
                }
            }
        }
        const __m256 mw = M1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16)))
                        : _mm256_mul_ps(dw, _mm256_set1_ps(T == Q4_0 ? -8.f : -16.f)); /* exact */
#pragma GCC unroll 8
        for (int mm = 0; mm < NM; mm++) {
            acc[mm] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[mm]), _mm256_mul_ps(dw, _mm256_set1_ps(xd[mm * nb + j])),
                                      acc[mm]);
            if (T != Q8_0) acc[mm] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xs[mm * nb + j]), acc[mm]);
        }
    }
#pragma GCC unroll 8
    for (int mm = 0; mm < NM; mm++) {
        float v[8] __attribute__((aligned(32)));
        _mm256_store_ps(v, acc[mm]);
        for (int r = r_lo; r < r_hi; r++) out[(int64_t)r * ldo + m0 + mm] = v[r];
    }
}

/* 8 bytes at p widened to 8 int32 lanes */
INLINE __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

INLINE void tile_pack_k(const int T, const int NM, const uint8_t *g, int64_t K, const Act256 *a, int64_t m0,
                        float *out, int64_t ldo, int r_lo, int r_hi) {
    const int64_t nb = K / 256, pb = pack_block_k(T);
    __m256 acc[MTP];
    __m256i is[MTP];
#pragma GCC unroll 8
    for (int mm = 0; mm < NM; mm++) acc[mm] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = g + i * pb;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
#pragma GCC unroll 8
        for (int mm = 0; mm < NM; mm++) is[mm] = _mm256_setzero_si256();
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16)));
        const uint8_t *sc = b + 32, *mn = b + 96, *qh = b + 160, *qs = b + 160 + (T == Q5_K ? 256 : 0);
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) { /* sub-block of 32: nibbles (j / 2, p), low or high by j % 2 */
            __m256i v[8];
#pragma GCC unroll 8
            for (int p = 0; p < 8; p++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * (j / 2) + p)));
                if (j % 2) q = _mm256_srli_epi16(q, 4);
                v[p] = _mm256_and_si256(q, low);
                if (T == Q5_K) /* bit j of the plane's bytes to bit 4 */
                    v[p] = _mm256_or_si256(v[p], fifth(_mm256_loadu_si256((const __m256i *)(qh + 32 * p)), j));
            }
            const __m256i scs = u8x8(sc + 8 * j);
#pragma GCC unroll 8
            for (int mm = 0; mm < NM; mm++) {
                const int8_t *x = a->q + (m0 + mm) * K + 256 * i + 32 * j;
                __m256i t = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++) t = DPBUSD(t, v[p], bcast4(x + 4 * p));
                is[mm] = _mm256_add_epi32(is[mm], _mm256_mullo_epi32(t, scs));
            }
        }
#pragma GCC unroll 8
        for (int mm = 0; mm < NM; mm++) {
            const float dx = a->d[(m0 + mm) * nb + i];
            acc[mm] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[mm]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[mm]);
            is[mm] = _mm256_setzero_si256();
        }
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) { /* the mins: m_j * (bsum_2j + bsum_2j+1), m_j in both int16 halves */
            const __m256i m32 = u8x8(mn + 8 * j), mp = _mm256_or_si256(m32, _mm256_slli_epi32(m32, 16));
#pragma GCC unroll 8
            for (int mm = 0; mm < NM; mm++)
                is[mm] = _mm256_add_epi32(is[mm], _mm256_madd_epi16(mp, bcast4(a->bsums + (m0 + mm) * (K / 16) + 16 * i + 2 * j)));
        }
#pragma GCC unroll 8
        for (int mm = 0; mm < NM; mm++) {
            const float dx = a->d[(m0 + mm) * nb + i];
            acc[mm] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(is[mm]), _mm256_mul_ps(dmin, _mm256_set1_ps(dx)), acc[mm]);
        }
    }
#pragma GCC unroll 8
    for (int mm = 0; mm < NM; mm++) {
        float v[8] __attribute__((aligned(32)));
        _mm256_store_ps(v, acc[mm]);
        for (int r = r_lo; r < r_hi; r++) out[(int64_t)r * ldo + m0 + mm] = v[r];
    }
}

/* out[(i - i0) * M + m] = W[row i] . x[m] for part-local rows i0 <= i < i1 of a packed part of
 * type T, activation rows 0..M-1 in passes of MTP (then 4, 2, 1); the groups the rows touch are
 * computed whole (their other rows are not written). */
INLINE void pack_rows_t(const int T, const uint8_t *pack, int64_t i0, int64_t i1, int64_t K, const Act32 *a,
                        const Act256 *a256, int64_t M, float *out) {
    const int64_t gbytes = K / elems(T) * pack_block(T);
#define TILE_PACK(k) \
    if (elems(T) == 32) tile_pack(T, k, gp, K, a, m0, o, M, lo, hi); \
    else tile_pack_k(T, k, gp, K, a256, m0, o, M, lo, hi)
    for (int64_t m0 = 0; m0 < M;) {
        const int64_t left = M - m0;
        const int nm = left >= MTP ? MTP : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        for (int64_t g = i0 / PACK_ROWS; g * PACK_ROWS < i1; g++) {
            const int64_t r0 = g * PACK_ROWS;
            const int lo = (int)((i0 > r0 ? i0 : r0) - r0), hi = (int)((i1 < r0 + PACK_ROWS ? i1 : r0 + PACK_ROWS) - r0);
            float *o = out + (r0 - i0) * M; /* row r of the group at o + r * M; only lo..hi-1 written */
            const uint8_t *gp = pack + g * gbytes;
            switch (nm) {
#if MTP == 8
            case 8: TILE_PACK(8); break;
#endif
            case 4: TILE_PACK(4); break;
            case 2: TILE_PACK(2); break;
            default: TILE_PACK(1); break;
            }
        }
        m0 += nm;
    }
#undef TILE_PACK
}

static void pack_rows(int64_t t, const uint8_t *pack, int64_t i0, int64_t i1, int64_t K, const Act32 *a,
                      const Act256 *a256, int64_t M, float *out) {
    switch (t) {
    case Q4_0: pack_rows_t(Q4_0, pack, i0, i1, K, a, a256, M, out); break;
    case Q4_1: pack_rows_t(Q4_1, pack, i0, i1, K, a, a256, M, out); break;
    case Q5_0: pack_rows_t(Q5_0, pack, i0, i1, K, a, a256, M, out); break;
    case Q5_1: pack_rows_t(Q5_1, pack, i0, i1, K, a, a256, M, out); break;
    case Q4_K: pack_rows_t(Q4_K, pack, i0, i1, K, a, a256, M, out); break;
    case Q5_K: pack_rows_t(Q5_K, pack, i0, i1, K, a, a256, M, out); break;
    default: pack_rows_t(Q8_0, pack, i0, i1, K, a, a256, M, out); break;
    }
}
#else
#define SF_PACK 0
#endif

/* The packed copy of K-quant rows: one 8-row group's super-block i from the rows' stored blocks
 * (src[r]: row r's block, or NULL for a padding row: zero scales). */
static void pack_k(int64_t t, const uint8_t *const src[PACK_ROWS], uint8_t *b) {
    memset(b, 0, (size_t)pack_block_k(t));
    for (int r = 0; r < PACK_ROWS; r++) {
        const uint8_t *s = src[r];
        if (!s) continue; /* d = dmin = 0: a padding row's outputs are 0 (never written) */
        memcpy(b + 2 * r, s, 2);
        memcpy(b + 16 + 2 * r, s + 2, 2);
        uint8_t sc[8], mn[8];
        k4_scales(s + 4, sc, mn);
        for (int j = 0; j < 8; j++) {
            b[32 + 8 * j + r] = sc[j];
            b[96 + 8 * j + r] = mn[j];
        }
        const int five = t == Q5_K;
        if (five)
            for (int p = 0; p < 8; p++) memcpy(b + 160 + 32 * p + 4 * r, s + 16 + 4 * p, 4);
        const uint8_t *qs = s + (five ? 48 : 16);
        for (int c = 0; c < 4; c++)
            for (int p = 0; p < 8; p++) memcpy(b + 160 + 256 * five + 32 * (8 * c + p) + 4 * r, qs + 32 * c + 4 * p, 4);
    }
}

/* Bytes of a packed copy of `rows` rows of K columns of type t on this build (the 32-element
 * types: their stored size padded to whole groups of 8 rows; Q4_K and Q5_K 2-3% more, their
 * scales as bytes): 0 for Q6_K and on a build without vpdpbusd. */
int64_t sf_qlinear_pack_bytes(int64_t t, int64_t rows, int64_t K) {
    if (!SF_PACK || !pack_block(t) || K < elems(t) || K % elems(t) || rows < 0) return 0;
    return (rows + PACK_ROWS - 1) / PACK_ROWS * (K / elems(t)) * pack_block(t);
}

/* The packed copy of `rows` rows of type t (row r at w + r * row_bytes) into out
 * (sf_qlinear_pack_bytes of them). Returns 0; -1 for bad arguments. */
int sf_qlinear_pack(int64_t t, const uint8_t *w, int64_t rows, int64_t row_bytes, int64_t K, uint8_t *out) {
    const int64_t nb = K / elems(t), bs = block_bytes(t), pb = pack_block(t);
    if (!sf_qlinear_pack_bytes(t, rows, K) || row_bytes < nb * bs || !w || !out) return -1;
    if (elems(t) == 256) {
        for (int64_t g = 0; g * PACK_ROWS < rows; g++)
            for (int64_t j = 0; j < nb; j++) {
                const uint8_t *src[PACK_ROWS];
                for (int r = 0; r < PACK_ROWS; r++)
                    src[r] = g * PACK_ROWS + r < rows ? w + (g * PACK_ROWS + r) * row_bytes + j * bs : NULL;
                pack_k(t, src, out + (g * nb + j) * pb);
            }
        return 0;
    }
    const int M1 = has_min(t), F5 = five_bit(t);
    const uint8_t zero[34] = {0};
    for (int64_t g = 0; g * PACK_ROWS < rows; g++)
        for (int64_t j = 0; j < nb; j++) {
            uint8_t *b = out + (g * nb + j) * pb;
            for (int r = 0; r < PACK_ROWS; r++) {
                const int64_t row = g * PACK_ROWS + r;
                /* a padding row: zero scales, so its outputs are 0 (and never written) */
                const uint8_t *src = row < rows ? w + row * row_bytes + j * bs : zero;
                memcpy(b + 2 * r, src, 2);
                if (t == Q8_0) {
                    for (int c = 0; c < 8; c++)
                        for (int e = 0; e < 4; e++) b[16 + 32 * c + 4 * r + e] = (uint8_t)(src[2 + 4 * c + e] ^ 0x80);
                    continue;
                }
                if (M1) memcpy(b + 16 + 2 * r, src + 2, 2);
                const uint8_t *qs = src + 2 + 2 * M1 + 4 * F5;
                if (F5) {
                    uint32_t qh;
                    memcpy(&qh, src + 2 + 2 * M1, 4);
                    for (int e = 0; e < 4; e++) {
                        uint8_t v = 0;
                        for (int c = 0; c < 8; c++) v |= (uint8_t)(((qh >> (4 * c + e)) & 1) << c);
                        b[16 + 16 * M1 + 4 * r + e] = v;
                    }
                }
                uint8_t *dq = b + 16 + 16 * M1 + 32 * F5;
                for (int c = 0; c < 4; c++)
                    for (int e = 0; e < 4; e++) dq[32 * c + 4 * r + e] = qs[4 * c + e];
            }
        }
    return 0;
}

/* A part's rows [i0, i1) (part-local) into y[m * ldy + i - i0 + col] (fp32 or bf16): on its packed
 * copy (a build that runs one), else rows_dot on the stored blocks in groups of g rows. tmp:
 * ROW_GROUP * M floats. */
static void own_rows(const QPart *P, int64_t i0, int64_t i1, int64_t K, const Act32 *a32, const Act256 *a256,
                     int64_t M, float *tmp, void *y, int y_bf16, int64_t ldy, int64_t col, const float *bias) {
#if SF_PACK
    const int packed = P->pack && (elems(P->type) == 32 ? P->type != Q8_0 || a32->isum : a256->q != NULL);
#else
    const int packed = 0;
#endif
    /* packed: slices ending on a group boundary, ROW_GROUP rows at most */
    const int64_t g = packed ? ROW_GROUP : row_group(P->row_bytes);
    for (int64_t i = i0; i < i1;) {
        int64_t e = packed ? (i / PACK_ROWS) * PACK_ROWS + g : i + g;
        e = e < i1 ? e : i1;
        const int64_t R = e - i;
#if SF_PACK
        if (packed) pack_rows(P->type, P->pack, i, e, K, a32, a256, M, tmp);
        else
#endif
            rows_dot(P->type, P->data + i * P->row_bytes, P->row_bytes, R, K, a32, a256, M, tmp);
        for (int64_t m = 0; m < M; m++)
            for (int64_t r = 0; r < R; r++) {
                const float v = tmp[r * M + m] + (bias ? bias[i + r] : 0.f);
                if (y_bf16) ((uint16_t *)y)[m * ldy + col + r] = float_to_bf16(v);
                else ((float *)y)[m * ldy + col + r] = v;
            }
        col += R;
        i = e;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* external kernels (QExt)                                                                   */

#define EXT_ROWS 256      /* weight rows per call of an external kernel, at most */
/* The audit's tolerance: the problem's, atol + rtol |y|, plus EXT_AUDIT_SCALE (common.c) times
 * the output's magnitude bound sum_j |d_w xd| umax sum |xq| + |m_w xs| (umax: the largest
 * |weight quant|). */

static inline int qx_active(const QPart *P) {
    /* a kernel of the packed layout runs only where the part has its packed copy */
    return P->ext && P->ext->fn && !__atomic_load_n(&P->ext->bad, __ATOMIC_RELAXED) && (!P->ext->packed || P->pack);
}

/* Floats of one thread's scratch for external kernels at M activation rows of K columns: the
 * outputs and their guard, rows_dot's tile and the audit's row, and the private activations
 * (Act32's, or in the same room Act256's: K/256 scales and K/16 int16 sums a row). */
static int64_t qx_scratch(int64_t M, int64_t K) {
    return M * EXT_ROWS + EXT_GUARD + (ROW_GROUP + 1) * M + 2 * M * (K / 32) + (M * K + 3) / 4 + 16;
}

typedef struct {
    float *out, *tmp;
    Act32 mine;       /* a 32-element part's private activations */
    Act256 mine256;   /* a K-quant part's, in the same memory */
} QxSlot;

static QxSlot qx_slot(float *base, int64_t M, int64_t K) {
    QxSlot s;
    s.out = base;
    s.tmp = s.out + M * EXT_ROWS + EXT_GUARD;
    s.mine.d = s.tmp + (ROW_GROUP + 1) * M;
    s.mine.s = s.mine.d + M * (K / 32);
    s.mine.q = (int8_t *)(s.mine.s + M * (K / 32));
    s.mine.isum = NULL; /* the external kernels' ABI has no sums; the packed kernel never reads these */
    s.mine256 = (Act256){s.mine.q, s.mine.d, (int16_t *)s.mine.s}; /* K/16 int16 = K/32 floats */
    return s;
}

/* The bytes of a run's activations: q, scales, and offset terms (32) or sums per 16 (256). */
static void qx_sizes(int64_t t, int64_t M, int64_t K, size_t *nq, size_t *nd, size_t *ns) {
    *nq = (size_t)(M * K);
    *nd = sizeof(float) * (size_t)(M * (K / elems(t)));
    *ns = elems(t) == 32 ? sizeof(float) * (size_t)(M * (K / 32)) : sizeof(int16_t) * (size_t)(M * (K / 16));
}

/* The activations into this thread's private copy, for the external kernel's calls on a run of
 * rows of a part of type t (qx_end checks the copy after them). */
static void qx_begin(QxSlot *S, int64_t t, const Act32 *a32, const Act256 *a256, int64_t M, int64_t K) {
    size_t nq, nd, ns;
    qx_sizes(t, M, K, &nq, &nd, &ns);
    if (elems(t) == 32) {
        memcpy(S->mine.q, a32->q, nq); memcpy(S->mine.d, a32->d, nd); memcpy(S->mine.s, a32->s, ns);
    } else {
        memcpy(S->mine256.q, a256->q, nq); memcpy(S->mine256.d, a256->d, nd);
        memcpy(S->mine256.bsums, a256->bsums, ns);
    }
}

/* After a run of rows: the private copy must be as qx_begin made it, or a call changed its
 * inputs (then a later call of the run, or its audit, read changed ones): a fault. */
static void qx_end(const QPart *P, const QxSlot *S, const Act32 *a32, const Act256 *a256, int64_t M, int64_t K) {
    QExt *e = P->ext;
    if (!e->audit || __atomic_load_n(&e->bad, __ATOMIC_RELAXED)) return;
    size_t nq, nd, ns;
    qx_sizes(P->type, M, K, &nq, &nd, &ns);
    const int changed = elems(P->type) == 32
        ? memcmp(S->mine.q, a32->q, nq) || memcmp(S->mine.d, a32->d, nd) || memcmp(S->mine.s, a32->s, ns)
        : memcmp(S->mine256.q, a256->q, nq) || memcmp(S->mine256.d, a256->d, nd) ||
          memcmp(S->mine256.bsums, a256->bsums, ns);
    if (changed) ext_fail(e, CHANGED_INPUTS, 0, K, M, 0, 0, 0.f, 0.f, 0.f);
}

/* The magnitude of the terms of row `row`'s outputs for activation rows 0..M-1 (the audit's
 * allowance for fp32 sums in another order): per block |scale x activation scale| times the most
 * |weight quant| times sum |xq|, plus the min term's size. */
static void qx_bound(int64_t t, const uint8_t *row, int64_t K, const Act32 *a32, const Act256 *a256, int64_t M,
                     float *bound) {
    const int64_t E = elems(t), nb = K / E, bs = block_bytes(t);
    for (int64_t m = 0; m < M; m++) bound[m] = 0.f;
    for (int64_t j = 0; j < nb; j++) {
        const uint8_t *b = row + j * bs;
        float dw, mw = 0.f, umax;
        if (E == 32) {
            dw = fabsf(fp16(b));
            mw = t == Q4_1 || t == Q5_1 ? fabsf(fp16(b + 2)) : t == Q4_0 ? 8.f * dw : t == Q5_0 ? 16.f * dw : 0.f;
            umax = t == Q8_0 ? 128.f : (t == Q5_0 || t == Q5_1) ? 31.f : 15.f;
        } else if (t == Q6_K) { /* w = d sc (u - 32): |sc| <= 128, |u - 32| <= 32 */
            dw = fabsf(fp16(b + 208)) * 128.f;
            umax = 32.f;
        } else { /* w = d sc u - dmin m: sc, m <= 63 */
            dw = fabsf(fp16(b)) * 63.f;
            mw = fabsf(fp16(b + 2)) * 63.f;
            umax = t == Q5_K ? 31.f : 15.f;
        }
        for (int64_t m = 0; m < M; m++) {
            const int8_t *xq = (E == 32 ? a32->q : a256->q) + m * K + E * j;
            int32_t qa = 0;
            for (int i = 0; i < E; i++) qa += xq[i] < 0 ? -xq[i] : xq[i];
            if (E == 32) {
                bound[m] += dw * fabsf(a32->d[m * nb + j]) * umax * (float)qa + mw * fabsf(a32->s[m * nb + j]);
            } else {
                const float dx = fabsf(a256->d[m * nb + j]);
                bound[m] += dx * (dw * umax * (float)qa + mw * (float)qa);
            }
        }
    }
}

/* Rows [0, R) (R <= EXT_ROWS) of a part of P's type at w (stored blocks; pw: the same rows' packed
 * groups, for a kernel of the packed layout) into S->out[m * R + r], on P's external kernel
 * (reading S's private activations, qx_begin), checked and audited as QExt says; on a fault
 * (this call's or, meanwhile, another's) the rows come from rows_dot. */
static void ext_rows(const QPart *P, const uint8_t *w, const uint8_t *pw, int64_t R, int64_t K, const Act32 *a32,
                     const Act256 *a256, int64_t M, QxSlot *S) {
    QExt *e = P->ext;
    const int64_t t = P->type, rb = K / elems(t) * block_bytes(t);
    if (!__atomic_load_n(&e->bad, __ATOMIC_RELAXED)) {
        ext_guard_fill(e, S->out + M * R);
        if (elems(t) == 32) ((Q32Fn)e->fn)(e->packed ? pw : w, S->mine.q, S->mine.d, S->mine.s, S->out, R, K, M);
        else ((Q256Fn)e->fn)(w, S->mine256.q, S->mine256.d, S->mine256.bsums, S->out, R, K, M);
        int check;
        const uint64_t draw = ext_call(e, M, &check);
        if (e->audit) {
            const int past = ext_guard_written(e, S->out + M * R);
            if (past) ext_fail(e, WROTE_PAST_OUTPUT, R, K, M, 0, 0, 0.f, 0.f, 0.f);
            if (check && !past) {
                __atomic_fetch_add(&e->audited, 1, __ATOMIC_RELAXED);
                const int64_t r = (int64_t)((draw & 0xffffffffULL) % (uint64_t)R);
                const uint8_t *row = w + r * rb;
                float *ref = S->tmp, *bound = S->tmp + ROW_GROUP * M;
                rows_dot(t, row, rb, 1, K, a32, a256, M, ref);
                qx_bound(t, row, K, a32, a256, M, bound);
                for (int64_t m = 0; m < M; m++) {
                    const float got = S->out[m * R + r], want = ref[m];
                    const float tol = e->atol + e->rtol * fabsf(want) + EXT_AUDIT_SCALE * bound[m];
                    if (!(fabsf(got - want) <= tol) && !(want != want && got != got)) { /* NaN only where rows_dot has one */
                        ext_fail(e, WRONG_OUTPUT, R, K, M, r, m, got, want, EXT_AUDIT_SCALE * bound[m]);
                        break;
                    }
                }
            }
        }
        if (!__atomic_load_n(&e->bad, __ATOMIC_RELAXED)) return;
    }
    own_rows_t(t, w, rb, R, K, a32, a256, M, S->out, S->tmp);
}

/* Rows [lo, hi) of a weight whose part P starts at row `base`, on P's external kernel (ext_rows,
 * EXT_ROWS rows a call at most), into y[m * ldy + row] (fp32 or bf16; plus bias[row] where given).
 * A kernel of the packed layout takes whole groups from a group's first row: the rows before lo it
 * computes too are not kept. */
static void ext_part(const QPart *P, int64_t base, int64_t lo, int64_t hi, int64_t K, const Act32 *a32,
                     const Act256 *a256, int64_t M, QxSlot *S, void *y, int y_bf16, int64_t ldy, const float *bias) {
    const int64_t gbytes = K / elems(P->type) * pack_block(P->type);
    for (int64_t s = P->ext->packed ? (lo - base) / PACK_ROWS * PACK_ROWS : lo - base; s < hi - base; s += EXT_ROWS) {
        const int64_t R = hi - base - s < EXT_ROWS ? hi - base - s : EXT_ROWS;
        const int64_t keep = lo - base > s ? lo - base - s : 0; /* the piece's first row kept */
        ext_rows(P, P->data + s * P->row_bytes, P->pack ? P->pack + s / PACK_ROWS * gbytes : NULL, R, K, a32, a256, M,
                 S);
        for (int64_t m = 0; m < M; m++)
            for (int64_t r = keep; r < R; r++) {
                const int64_t row = base + s + r;
                const float v = S->out[m * R + r] + (bias ? bias[row] : 0.f);
                if (y_bf16) ((uint16_t *)y)[m * ldy + row] = float_to_bf16(v);
                else ((float *)y)[m * ldy + row] = v;
            }
    }
}

/* External kernels of these parts dropped so far (a call compares the count before and after). */
static int64_t qx_dropped(const QPart *parts, int64_t n_parts) {
    int64_t c = 0;
    for (int64_t p = 0; p < n_parts; p++)
        c += parts[p].ext && parts[p].ext->fn && __atomic_load_n(&parts[p].ext->bad, __ATOMIC_SEQ_CST);
    return c;
}

/* ---------------------------------------------------------------------------------------- */
/* threads                                                                                   */

/* A call's rows of W are cut into chunks that threads claim one at a time from an atomic
 * counter: the calling thread claims chunks too and waits only for chunks another thread has
 * claimed, never for a helper that has not started yet (a fork/join region waits for every
 * thread of its team, which on a machine busy with other work costs a scheduler time slice,
 * milliseconds, per call). Helpers are created on first need and then wait for work (a short
 * spin, then a futex). One call uses the pool at a time; a concurrent call runs on its own
 * thread alone. */
typedef struct {
    const QPart *parts;
    int64_t n_parts, K, M, N, chunk;
    const Act32 *a32;
    const Act256 *a256;
    void *y;
    int y_bf16;
    float *out;        /* [helpers + 1, ROW_GROUP, M]: a row group's results before they go to y */
    float *xbase;      /* [helpers + 1, qx_scratch(M, K)]: external kernels' scratch (NULL: none) */
} Job;

#define MAX_HELPERS 255
/* products of a 32-element block (or an eighth of a super-block) and an activation row per
 * thread, at least: ~40 us of work on an AVX2 core. A helper costs a futex wake and, on a busy
 * machine, the chance of being preempted while it holds a chunk; below this it did not pay. */
#define MIN_WORK 16384
#define SPIN 20000     /* pause iterations (~0.1 ms) a helper spins before it sleeps */

static struct {
    pthread_mutex_t call;
    Job job;                       /* written only between calls */
    _Atomic uint64_t next;         /* [n_chunks:24][helpers:8][next chunk:32] */
    _Atomic int64_t done;          /* chunks finished */
    _Atomic uint32_t wake;         /* bumped for every call: the helpers' futex word */
    int helpers;                   /* created, by process pool.pid */
    pid_t pid;
} pool = {.call = PTHREAD_MUTEX_INITIALIZER};

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_rows(const Job *J, int64_t n0, int64_t n1, float *out, float *xscratch) {
    int64_t base = 0;
    for (int64_t p = 0; p < J->n_parts; p++) {
        const QPart *P = J->parts + p;
        const int64_t lo = n0 > base ? n0 : base, hi = n1 < base + P->rows ? n1 : base + P->rows;
        if (xscratch && qx_active(P)) {
            QxSlot S = qx_slot(xscratch, J->M, J->K);
            if (lo < hi) qx_begin(&S, P->type, J->a32, J->a256, J->M, J->K);
            ext_part(P, base, lo, hi, J->K, J->a32, J->a256, J->M, &S, J->y, J->y_bf16, J->N, NULL);
            if (lo < hi) qx_end(P, &S, J->a32, J->a256, J->M, J->K);
            base += P->rows;
            continue;
        }
        if (lo < hi) own_rows(P, lo - base, hi - base, J->K, J->a32, J->a256, J->M, out, J->y, J->y_bf16, J->N, lo, NULL);
        base += P->rows;
    }
}

/* Claim and run chunks until none is left; `slot` < 0: the caller, else helper number slot
 * (which takes part only if the call asked for that many helpers). */
static void run_chunks(int slot) {
    for (;;) {
        uint64_t c = atomic_load_explicit(&pool.next, memory_order_acquire);
        const int64_t idx = (int64_t)(c & 0xFFFFFFFFu), helpers = (int64_t)((c >> 32) & 0xFF), n = (int64_t)(c >> 40);
        if (idx >= n || slot >= helpers) return;
        if (!atomic_compare_exchange_weak_explicit(&pool.next, &c, c + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        /* chunk idx is ours: the call (and so pool.job) lasts until it is done */
        const Job *J = &pool.job;
        const int64_t n0 = idx * J->chunk, n1 = n0 + J->chunk < J->N ? n0 + J->chunk : J->N;
        const int64_t me = slot < 0 ? helpers : slot;
        run_rows(J, n0, n1, J->out + me * J->M * ROW_GROUP,
                 J->xbase ? J->xbase + me * qx_scratch(J->M, J->K) : NULL);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
    }
}

static void *helper_main(void *arg) {
    const int slot = (int)(intptr_t)arg;
    uint32_t seen = atomic_load_explicit(&pool.wake, memory_order_acquire);
    for (;;) {
        uint32_t w;
        for (int spin = 0; (w = atomic_load_explicit(&pool.wake, memory_order_acquire)) == seen; spin++) {
            if (spin < SPIN) relax();
            else syscall(SYS_futex, &pool.wake, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        }
        seen = w;
        run_chunks(slot);
    }
    return NULL;
}

/* Helpers 0 .. want - 1 exist (as many as could be created); returns how many do. A forked
 * child inherits the count but not the threads: it makes its own. (Were none made, the caller
 * would run every chunk itself.) */
static int ensure_helpers(int want) {
    const pid_t pid = getpid();
    if (pool.pid != pid) {
        pool.pid = pid;
        pool.helpers = 0;
    }
    while (pool.helpers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&t, &attr, helper_main, (void *)(intptr_t)pool.helpers);
        pthread_attr_destroy(&attr);
        if (rc) break;
        pool.helpers++;
    }
    return pool.helpers < want ? pool.helpers : want;
}

/* ---------------------------------------------------------------------------------------- */
/* entry point                                                                               */

/* y[M, N] = x[M, K] @ W^T, W = the parts stacked (N = sum of their rows). x: fp32, or bf16 if
 * x_bf16; y likewise by y_bf16, row stride N. Up to `threads` threads (the caller and
 * threads - 1 helpers) share the rows of W.
 * A part with an external kernel (QExt) runs on it, EXT_ROWS rows a call at most.
 * Returns 0; 1 when an external kernel was dropped during the call (the whole call then ran
 * again, and y is the engine's own kernels' result); -1 for bad arguments (unknown type, K not a
 * multiple of a part's block, a row stride shorter than a row); -2 if scratch memory could not
 * be allocated. */
int sf_qlinear(const QPart *parts, int64_t n_parts, int64_t K, int64_t M, const void *x, int x_bf16,
               void *y, int y_bf16, int threads) {
    if (n_parts < 1 || K < 1 || M < 1) return -1;
    int64_t N = 0;
    int need32 = 0, need256 = 0, has_ext = 0;
    for (int64_t p = 0; p < n_parts; p++) {
        const int64_t t = parts[p].type, bs = block_bytes(t);
        if (!bs || K % elems(t) || parts[p].rows < 0 || parts[p].row_bytes < K / elems(t) * bs || !parts[p].data)
            return -1;
        N += parts[p].rows;
        need32 |= elems(t) == 32;
        need256 |= elems(t) == 256;
        has_ext |= parts[p].ext && parts[p].ext->fn;
    }
    if (N == 0) return 0;
    /* a thread per MIN_WORK block products at most; at least 8 rows a chunk, about 16 chunks
     * per thread */
    const int64_t work = N * (K / 32) * M;
    threads = threads < 1 ? 1 : threads > MAX_HELPERS + 1 ? MAX_HELPERS + 1 : threads;
    if (threads > 1 && work / MIN_WORK < threads) threads = work / MIN_WORK > 1 ? (int)(work / MIN_WORK) : 1;
    int64_t chunk = (N + 16 * threads - 1) / (16 * threads);
    chunk = chunk < 8 ? 8 : (chunk + 7) & ~(int64_t)7; /* whole groups of the packed kernel's 8 rows */
    if (threads > 1 && (N + chunk - 1) / chunk < 2) threads = 1;
    const int pooled = threads > 1 && pthread_mutex_trylock(&pool.call) == 0;
    const int helpers = pooled ? ensure_helpers(threads - 1) : 0;

    Act32 a32 = {0};
    Act256 a256 = {0};
    const size_t own = (size_t)K + (size_t)(helpers + 1) * (size_t)M * ROW_GROUP;
    float *scratch = malloc(sizeof(float) * (own + (has_ext ? (size_t)(helpers + 1) * (size_t)qx_scratch(M, K) : 0)));
    if (need32) {
        a32.q = malloc((size_t)(M * K));
        a32.d = malloc(sizeof(float) * M * (K / 32));
        a32.s = malloc(sizeof(float) * M * (K / 32));
        a32.isum = malloc(sizeof(int32_t) * M * (K / 32));
    }
    if (need256) {
        a256.q = malloc((size_t)(M * K));
        a256.d = malloc(sizeof(float) * M * (K / 256));
        a256.bsums = malloc(sizeof(int16_t) * M * (K / 16));
    }
    int rc = 0;
    if (!scratch || (need32 && (!a32.q || !a32.d || !a32.s || !a32.isum)) || (need256 && (!a256.q || !a256.d || !a256.bsums))) {
        rc = -2;
        goto done;
    }
    for (int64_t m = 0; m < M; m++) {
        const float *xr = (const float *)x + m * K;
        if (x_bf16) {
            const uint16_t *xb = (const uint16_t *)x + m * K;
            for (int64_t k = 0; k < K; k++) scratch[k] = bf16_to_float(xb[k]);
            xr = scratch;
        }
        quantize_row(xr, K, m, &a32, &a256);
    }
    const Job job = {parts, n_parts, K, M, N, chunk, &a32, &a256, y, y_bf16, scratch + K, has_ext ? scratch + own : NULL};
    const int64_t dropped = has_ext ? qx_dropped(parts, n_parts) : 0;
    for (int pass = 0; pass < 2; pass++) { /* again, on the engine's own kernel, if one was dropped meanwhile */
        if (!helpers) {
            run_rows(&job, 0, N, job.out, job.xbase);
        } else {
            const int64_t n_chunks = (N + chunk - 1) / chunk;
            pool.job = job;
            atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
            atomic_store_explicit(&pool.next, ((uint64_t)n_chunks << 40) | ((uint64_t)helpers << 32),
                                  memory_order_release);
            atomic_fetch_add_explicit(&pool.wake, 1, memory_order_release);
            syscall(SYS_futex, &pool.wake, FUTEX_WAKE_PRIVATE, helpers, NULL, NULL, 0);
            run_chunks(-1);
            for (int spin = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < n_chunks; spin++) {
                if (spin < 64) relax();
                else sched_yield(); /* a helper holds a chunk: let it run */
            }
        }
        if (!has_ext || qx_dropped(parts, n_parts) == dropped) break;
        rc = 1;
    }
done:
    if (pooled) pthread_mutex_unlock(&pool.call);
    free(scratch);
    free(a32.q); free(a32.d); free(a32.s); free(a32.isum);
    free(a256.q); free(a256.d); free(a256.bsums);
    return rc;
}

/* The engine's own kernel for one weight of a 32-element type t (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
 * on activations quantised already, on the calling thread: y[b * n + r] = W[row r] . x[b], as
 * run_rows computes each output (row groups, passes of 8/4/2/1 activation rows). The ABI of the
 * kernel factory's <type>_engine_matmul problems (their yardstick, and the function a champion
 * of theirs replaces through QExt): w the n rows of k / 32 blocks as stored; xq int8 [batch, k];
 * xd, xs fp32 [batch, k / 32] (xs = xd * sum of the block's xq). Returns 0; -1 for bad
 * arguments; -2 if scratch memory could not be allocated. */
int sf_qlinear_q32(int64_t t, const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, float *y,
                   int64_t n, int64_t k, int64_t batch) {
    const int64_t bs = block_bytes(t);
    if (!bs || elems(t) != 32 || k < 32 || k % 32 || n < 0 || batch < 1) return -1;
    float *tmp = malloc(sizeof(float) * (size_t)(ROW_GROUP * batch));
    if (!tmp) return -2;
    const Act32 a32 = {(int8_t *)xq, (float *)xd, (float *)xs};
    const Act256 none = {0};
    own_rows_t(t, w, k / 32 * bs, n, k, &a32, &none, batch, y, tmp);
    free(tmp);
    return 0;
}

/* The same for a K-quant (Q4_K, Q5_K, Q6_K), the ABI of the <type>_engine_matmul problems of the
 * K-quants: xq int8 [batch, k], xd fp32 [batch, k / 256], bsums int16 [batch, k / 16] (the sums of
 * xq per 16, as quantize_row makes them). */
int sf_qlinear_q256(int64_t t, const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *bsums, float *y,
                    int64_t n, int64_t k, int64_t batch) {
    const int64_t bs = block_bytes(t);
    if (!bs || elems(t) != 256 || k < 256 || k % 256 || n < 0 || batch < 1) return -1;
    float *tmp = malloc(sizeof(float) * (size_t)(ROW_GROUP * batch));
    if (!tmp) return -2;
    const Act32 none = {0};
    const Act256 a256 = {(int8_t *)xq, (float *)xd, (int16_t *)bsums};
    own_rows_t(t, w, k / 256 * bs, n, k, &none, &a256, batch, y, tmp);
    free(tmp);
    return 0;
}

/* sf_qlinear_q32 on a weight's packed copy (sf_qlinear_pack of its n rows): what the engine runs
 * for a weight of type t on a build with a packed kernel for it, in the same ABI (Q8_0's
 * activation sums are taken from xq here). The yardstick of the kernel factory's problem of
 * that type on such a build. Returns 0; -1 for bad arguments or a build without the packed
 * kernel for t; -2 if scratch memory could not be allocated. */
int sf_qlinear_q32_packed(int64_t t, const uint8_t *pack, const int8_t *xq, const float *xd, const float *xs,
                          float *y, int64_t n, int64_t k, int64_t batch) {
    if (elems(t) != 32 || !sf_qlinear_pack_bytes(t, n, k) || !pack || n < 1 || batch < 1) return -1;
    const int64_t nb = k / 32;
    float *tmp = malloc(sizeof(float) * (size_t)(ROW_GROUP * batch));
    int32_t *isum = malloc(sizeof(int32_t) * (size_t)(batch * nb));
    if (!tmp || !isum) {
        free(tmp);
        free(isum);
        return -2;
    }
    for (int64_t i = 0; t == Q8_0 && i < batch * nb; i++) {
        int32_t s = 0;
        for (int e = 0; e < 32; e++) s += xq[32 * i + e];
        isum[i] = s;
    }
    const Act32 a32 = {(int8_t *)xq, (float *)xd, (float *)xs, isum};
    const Act256 none = {0};
    const QPart P = {t, n, nb * block_bytes(t), pack, NULL, pack}; /* data unused by the packed path */
    own_rows(&P, 0, n, k, &a32, &none, batch, tmp, y, 0, n, 0, NULL);
    free(tmp);
    free(isum);
    return 0;
}

/* sf_qlinear_q256 on a K-quant weight's packed copy (sf_qlinear_pack of its n rows): what the
 * engine runs for it on a build with vpdpbusd, in the same ABI; the yardstick of the kernel
 * factory's problem of that type there. Returns 0; -1 for bad arguments or a build without the
 * packed kernel; -2 if scratch memory could not be allocated. */
int sf_qlinear_q256_packed(int64_t t, const uint8_t *pack, const int8_t *xq, const float *xd, const int16_t *bsums,
                           float *y, int64_t n, int64_t k, int64_t batch) {
    if (elems(t) != 256 || !sf_qlinear_pack_bytes(t, n, k) || !pack || n < 1 || batch < 1) return -1;
    float *tmp = malloc(sizeof(float) * (size_t)(ROW_GROUP * batch));
    if (!tmp) return -2;
    const Act32 none = {0};
    const Act256 a256 = {(int8_t *)xq, (float *)xd, (int16_t *)bsums};
    const QPart P = {t, n, k / 256 * block_bytes(t), pack, NULL, pack}; /* data unused by the packed path */
    own_rows(&P, 0, n, k, &none, &a256, batch, tmp, y, 0, n, 0, NULL);
    free(tmp);
    return 0;
}
