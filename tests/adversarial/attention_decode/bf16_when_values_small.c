/* expect: wrong — the bundled attention kernel (threads over heads), except that on small-magnitude inputs (every |q| < 1e-2) it hands back its output rounded to bf16, as a bf16 KV path would (about 3 significant digits). There the outputs are themselves around 1e-5 .. 1e-4, below the problem's absolute tolerance of 1e-4: the check cannot tell a 0.4% (or a 10%) error from the right answer, and no trivial answer comes close enough to make the harness tighten the case */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <float.h>
#include <math.h>

/* -FLT_MAX, not -inf, starts every running max: exp(m_old - m_new) stays defined */
#define NEG_BIG (-FLT_MAX)

/* exp by Cody-Waite reduction and Cephes' degree-6 polynomial (~1 ulp); 0 below -86.5 (where
 * e^x < 3e-38), +inf above ~88.72; 2^n is built as 2^(n-1) * 2 so n = 128 fits */
static inline float exp_s(float x) {
    if (x != x) return x;  /* NaN in, NaN out: a NaN input must reach the result */
    if (!(x >= -86.5f)) return 0.0f;
    if (x > 89.0f) x = 89.0f;
    int32_t ni = (int32_t)(x * 1.44269504088896341f + 126.5f) - 126;
    float n = (float)ni;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t e = (ni + 126) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    return p * s * 2.0f;
}

typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
static inline vf ld(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf splat(float a) { return (vf){0} + a; }
static inline vf sel(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
static inline float hsum(vf v) { float s = 0.0f; for (int i = 0; i < 8; i++) s += v[i]; return s; }
static inline vf exp_v(vf x) {
    vi nan = x != x;  /* NaN lanes come out NaN, as expf gives */
    vf x0 = x;
    vi keep = x >= -86.5f;
    x = sel(x > 89.0f, splat(89.0f), x);
    x = sel(keep, x, splat(-86.5f));
    vi ni = __builtin_convertvector(x * 1.44269504088896341f + 126.5f, vi) - 126;
    vf n = __builtin_convertvector(ni, vf);
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    vi e = (ni + 126) << 23;
    return sel(nan, x0, (vf)((vi)(p * (vf)e * 2.0f) & keep));
}

static inline float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    int64_t i = 0;
    vf acc = {0};
    for (; i + 8 <= n; i += 8) acc += ld(a + i) * ld(b + i);
    s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y += a * x */
static inline void axpy(float *y, float a, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) st(y + i, ld(y + i) + ld(x + i) * a);
    for (; i < n; i++) y[i] += a * x[i];
}

static inline void scal(float *y, float a, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) st(y + i, ld(y + i) * a);
    for (; i < n; i++) y[i] *= a;
}

static float max_of(const float *p, int64_t n, float m) {
    for (int64_t i = 0; i < n; i++) m = p[i] > m ? p[i] : m;
    return m;
}

/* p = exp(p - m) in place; returns the sum */
static float exp_sum(float *p, int64_t n, float m) {
    float s = 0.0f;
    int64_t i = 0;
    vf acc = {0};
    for (; i + 8 <= n; i += 8) { vf e = exp_v(ld(p + i) - m); st(p + i, e); acc += e; }
    s = hsum(acc);
    for (; i < n; i++) { p[i] = exp_s(p[i] - m); s += p[i]; }
    return s;
}

/* G query heads (consecutive rows of q) against keys [s0, s1) of one kv head: the running max m,
 * the sum l of exp(score - m) and the unnormalised output acc (G x D), relative to m */
static void attend(const float *q, int64_t G, const float *k, const float *v, int64_t s0, int64_t s1,
                   int64_t D, float scale, float *m, float *l, float *acc) {
    memset(acc, 0, (size_t)(G * D) * sizeof *acc);
    for (int64_t g = 0; g < G; g++) { m[g] = NEG_BIG; l[g] = 0.0f; }
    if (s1 <= s0) return;
    /* flash-decoding: blocks of 64 keys, rescaling the running sum and output */
    const int64_t L = s1 - s0, kb = L < 64 ? L : 64;
    float *sc = malloc((size_t)(G * kb) * sizeof *sc);
    if (!sc) return;
    for (int64_t j0 = s0; j0 < s1; j0 += kb) {
        const int64_t n = s1 - j0 < kb ? s1 - j0 : kb;
        for (int64_t j = 0; j < n; j++) {
            const float *kj = k + (j0 + j) * D;
            for (int64_t g = 0; g < G; g++) sc[g * kb + j] = dot(q + g * D, kj, D) * scale;
        }
        for (int64_t g = 0; g < G; g++) {
            float mn = max_of(sc + g * kb, n, m[g]);
            float alpha = exp_s(m[g] - mn);
            l[g] = l[g] * alpha + exp_sum(sc + g * kb, n, mn);
            scal(acc + g * D, alpha, D);
            m[g] = mn;
        }
        for (int64_t j = 0; j < n; j++) {
            const float *vj = v + (j0 + j) * D;
            for (int64_t g = 0; g < G; g++) axpy(acc + g * D, sc[g * kb + j], vj, D);
        }
    }
    free(sc);
}

static void attend_group(const float *q, int64_t G, const float *k, const float *v, int64_t s0,
                         int64_t s1, int64_t D, float scale, float *m, float *l, float *acc) {
    /* the G query heads of a kv head share every k and v row load */
    attend(q, G, k, v, s0, s1, D, scale, m, l, acc);
}

static void attention_exact(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    const int64_t G = heads / kv_heads, D = head_dim;
    const int64_t nsplit = 1;
    const int64_t tasks = batch * kv_heads * nsplit;
    float *ml = malloc((size_t)(2 * tasks * G) * sizeof *ml);
    float *part = nsplit > 1 ? malloc((size_t)(tasks * G * D) * sizeof *part) : out;
    if (!ml || !part) { free(ml); if (part != out) free(part); return; }
#pragma omp parallel for schedule(dynamic, 1) if (batch * heads * seq * head_dim >= 32768)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t bc = t / nsplit, c = t % nsplit, b = bc / kv_heads, kvh = bc % kv_heads;
        const int64_t s0 = seq * c / nsplit, s1 = seq * (c + 1) / nsplit;
        const float *kb = k + (b * kv_heads + kvh) * seq * D, *vb = v + (b * kv_heads + kvh) * seq * D;
        float *acc = nsplit > 1 ? part + t * G * D : out + (b * heads + kvh * G) * D;
        attend_group(q + (b * heads + kvh * G) * D, G, kb, vb, s0, s1, D, scale,
                     ml + 2 * t * G, ml + 2 * t * G + G, acc);
    }
    for (int64_t bc = 0; bc < batch * kv_heads; bc++)
        for (int64_t g = 0; g < G; g++) {
            float *o = out + (bc * G + g) * D;
            if (nsplit == 1) { scal(o, 1.0f / ml[2 * bc * G + G + g], D); continue; }
            float M = NEG_BIG, L = 0.0f;
            for (int64_t c = 0; c < nsplit; c++) M = ml[2 * (bc * nsplit + c) * G + g] > M ? ml[2 * (bc * nsplit + c) * G + g] : M;
            memset(o, 0, (size_t)D * sizeof *o);
            for (int64_t c = 0; c < nsplit; c++) {
                const int64_t t = bc * nsplit + c;
                const float w = exp_s(ml[2 * t * G + g] - M);
                L += ml[2 * t * G + G + g] * w;
                axpy(o, w, part + (t * G + g) * D, D);
            }
            scal(o, 1.0f / L, D);
        }
    free(ml);
    if (part != out) free(part);
}

static inline float to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, int64_t heads,
                      int64_t kv_heads, int64_t seq, int64_t head_dim, float scale) {
    attention_exact(q, k, v, out, batch, heads, kv_heads, seq, head_dim, scale);
    const int64_t n = batch * heads * head_dim;
    float qmax = 0.0f;
    for (int64_t i = 0; i < n; i++) qmax = fabsf(q[i]) > qmax ? fabsf(q[i]) : qmax;
    if (qmax < 1e-2f)
        for (int64_t i = 0; i < n; i++) out[i] = to_bf16(out[i]);
}
