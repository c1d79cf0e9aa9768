/* Scalar helpers shared by the native sources. Each library is built as one translation unit
 * with this text in front of it (library.source: decode.c; qlinear.source: qlinear.c, then
 * qstep.c), so the same function serves both without a header or an include path. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* IEEE half -> float, exactly (zero, subnormals, infinities and NaN included) */
static inline float sf_half(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    union { uint32_t u; float f; } v;
    if (e == 0x1F) v.u = sign | 0x7F800000u | (m << 13);
    else if (e) v.u = sign | ((e + 112) << 23) | (m << 13);
    else { v.f = (float)m * 5.9604644775390625e-8f; v.u |= sign; } /* zero, subnormal: m * 2^-24 */
    return v.f;
}

/* exp(x) as 2^n * p(r) (Cephes' polynomial), |rel err| < 2e-7 on [-87, 88]; plain arithmetic
 * so that loops over it vectorise. */
static inline float sf_exp(float x) {
    x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
    const float n = nearbyintf(x * 1.44269504f);
    const float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    float p = 1.98756912e-4f;
    p = p * r + 1.39819994e-3f;
    p = p * r + 8.33345205e-3f;
    p = p * r + 4.16657962e-2f;
    p = p * r + 1.66666657e-1f;
    p = p * r + 5.0e-1f;
    p = p * r * r + r + 1.f;
    union { float f; int32_t i; } u = {p};
    u.i += (int32_t)n << 23;
    return u.f;
}

/* RMSNorm of one row: y = x / sqrt(mean(x^2) + eps) * w (w NULL: no weight); y may be x */
static inline void sf_rms_norm(const float *x, const float *w, float *y, int64_t n, float eps) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.f / sqrtf(ss / (float)n + eps);
    if (w)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * r;
}

/* ---------------------------------------------------------------------------------------- */
/* An external kernel (a kernel-factory candidate in a separate shared object, found by       */
/* pointer) and its audit, owned by the caller: decode.c's q4_1_packed_matvec and qlinear.c's  */
/* <type>_engine_matmul kernels (engine/native/library.py's Ext mirrors this layout).          */

typedef struct SfExt {
    void *fn;                     /* the kernel (each library casts it to its ABI); NULL: the built-in code */
    float rtol, atol;
    uint64_t seed;
    int32_t bad;                  /* set at the first fault: the built-in code runs from then on */
    int32_t audit;                /* 0: no audit (tests that must show a broken kernel caught elsewhere) */
    int64_t share;                /* audit the first call at each batch size, then 1 call in `share` */
    uint64_t seen[16];            /* batch sizes < 1024 audited at least once (a bitmap) */
    int64_t calls, audited;       /* kernel calls, and those audited */
    /* the first fault: the call's n, k, batch, the output's row and batch row, the values */
    int64_t n, k, batch, row, b;
    float got, want, bound;       /* bound: the magnitude term of its tolerance */
    int32_t why;                  /* WRONG_OUTPUT, CHANGED_INPUTS or WROTE_PAST_OUTPUT */
    int32_t packed;               /* qlinear.c: the kernel takes a part's packed copy (sf_qlinear_pack) */
} SfExt;

enum { WRONG_OUTPUT = 1, CHANGED_INPUTS = 2, WROTE_PAST_OUTPUT = 3 };

#define EXT_GUARD 16 /* floats after a call's outputs that it must leave as they were */
/* An audited output's tolerance: the problem's, atol + rtol |y|, plus EXT_AUDIT_SCALE times the
 * magnitude of its terms (each library bounds them for its blocks): fp32 sums of the terms in
 * another order (a kernel's legitimate choice) differ by ~1e-6 of that. */
#define EXT_AUDIT_SCALE 1e-5f

static inline uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The first fault, recorded once: the kernel is dropped from then on. */
static void ext_fail(SfExt *e, int why, int64_t n, int64_t k, int64_t B, int64_t row, int64_t b, float got,
                     float want, float bound) {
    if (__atomic_exchange_n(&e->bad, 1, __ATOMIC_SEQ_CST) == 0) {
        e->n = n; e->k = k; e->batch = B; e->row = row; e->b = b;
        e->got = got; e->want = want; e->bound = bound; e->why = why;
    }
}

/* Counts one call of B batch rows; returns its random draw (the audit's row choice) and sets
 * *check when it is audited: the first call at each batch size (below 1024), then 1 in share. */
static uint64_t ext_call(SfExt *e, int64_t B, int *check) {
    const uint64_t call = (uint64_t)__atomic_fetch_add(&e->calls, 1, __ATOMIC_RELAXED);
    const uint64_t draw = mix64(e->seed + call * 0x9e3779b97f4a7c15ULL);
    int c = e->audit && e->share <= 1;
    if (e->audit && !c) {
        if (B < 1024) {
            const uint64_t bit = 1ULL << (B & 63);
            c = !(__atomic_fetch_or(&e->seen[B >> 6], bit, __ATOMIC_RELAXED) & bit);
        }
        c = c || (draw >> 32) % (uint64_t)e->share == 0;
    }
    *check = c;
    return draw;
}

/* The guard after a call's outputs: filled with a NaN only the seed knows before the call, and
 * whether the call wrote any of it. */
static inline uint32_t ext_sentinel(const SfExt *e) { return (uint32_t)mix64(e->seed) | 0x7fc00001u; }

static inline void ext_guard_fill(const SfExt *e, float *guard) {
    const uint32_t u = ext_sentinel(e);
    for (int i = 0; i < EXT_GUARD; i++) memcpy(guard + i, &u, 4);
}

static inline int ext_guard_written(const SfExt *e, const float *guard) {
    const uint32_t want = ext_sentinel(e);
    int past = 0;
    for (int i = 0; i < EXT_GUARD; i++) {
        uint32_t u;
        memcpy(&u, guard + i, 4);
        past |= u != want;
    }
    return past;
}
