/* expect: not_faster — memoises by diffing: keeps a private copy of every input set's rows and outputs (per input address), and on each call recomputes only the rows whose input (or output) differs from its copy, every result exact. Timed calls used to change one unit of one input per call, so all but one row of a matrix was unchanged and skipped: an honest softmax made slow where the memo pays (the bundled template's, each row of a matrix computed four times over) measured faster than torch. Timed inputs now change in every row on every call (small ones are rewritten whole), so the diff finds every row changed and the kernel is as slow as it is */
/* softmax: y[r,:] = exp(x[r,:] - max) / sum(exp(x[r,:] - max)), row-wise
 * knobs: vw=8 acc=2 algo=two_pass exp=poly threads=none */
#include <stdint.h>
#include <string.h>
#include <float.h>
#include <math.h>

/* -FLT_MAX, not -inf, starts every max: exp(m_old - m_new) stays defined when entries are -inf */
#define NEG_BIG (-FLT_MAX)
/* fp32 partial sums run over at most this many columns before they go into a double total */
#define CHUNK 2048

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
static inline vf vmax(vf a, vf b) { return sel(a > b, a, b); }
static inline float hmax(vf v) { float m = v[0]; for (int i = 1; i < 8; i++) m = v[i] > m ? v[i] : m; return m; }
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

static float row_max(const float *x, int64_t n) {
    float m = NEG_BIG;
    int64_t c = 0;
    vf a[2];
    for (int i = 0; i < 2; i++) a[i] = splat(NEG_BIG);
    for (; c + 16 <= n; c += 16) {
        a[0] = vmax(a[0], ld(x + c + 0));
        a[1] = vmax(a[1], ld(x + c + 8));
    }
    for (; c + 8 <= n; c += 8) a[0] = vmax(a[0], ld(x + c));
    a[0] = vmax(a[0], a[1]);
    m = hmax(a[0]);
    for (; c < n; c++) m = x[c] > m ? x[c] : m;
    return m;
}

/* y = exp(x - m), returning the sum; a scaling pass over y follows */
static float row_store_sum(const float *x, float *y, int64_t n, float m) {
    double s = 0.0;  /* a running fp32 sum over 5e4 terms loses ~3e-4: chunks go into a double */
    int64_t c = 0;
    while (c + 16 <= n) {
        vf a[2];
        memset(a, 0, sizeof a);
        const int64_t end = c + CHUNK < n ? c + CHUNK : n;
        for (; c + 16 <= end; c += 16) {
            { vf e = exp_v(ld(x + c + 0) - m); st(y + c + 0, e); a[0] += e; }
            { vf e = exp_v(ld(x + c + 8) - m); st(y + c + 8, e); a[1] += e; }
        }
        a[0] += a[1];
        s += hsum(a[0]);
    }
    for (; c + 8 <= n; c += 8) { vf e = exp_v(ld(x + c) - m); st(y + c, e); s += hsum(e); }
    for (; c < n; c++) { float e = exp_s(x[c] - m); y[c] = e; s += e; }
    return (float)s;
}

static void row_scale(float *y, int64_t n, float f) {
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) st(y + c, ld(y + c) * f);
    for (; c < n; c++) y[c] *= f;
}

/* partial statistics of x[0:n): its max and the sum of exp(x - max) */
static void stats(const float *x, float *y, int64_t n, float *pm, float *ps) {
    *pm = row_max(x, n);
    *ps = row_store_sum(x, y, n, *pm);
}

/* finish x[0:n) whose partial max is m, given the whole row's max M and 1 / sum */
static void finish(const float *x, float *y, int64_t n, float m, float M, float inv) {
    (void)x;
    row_scale(y, n, exp_s(m - M) * inv);
}

static void softmax_row(const float *x, float *y, int64_t n) {
    float m, s;
    stats(x, y, n, &m, &s);
    finish(x, y, n, m, m, 1.0f / s);
}

static void honest_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        softmax_row(x + r * cols, y + r * cols, cols);
}

/* ---- the memo, around an honest kernel made slow ---------------------------------------------- */
#include <stdlib.h>
struct memo { const float *x; int64_t rows, cols; float *xc, *yc; };
static struct memo memos[64];
static int next_memo;

static struct memo *lookup(const float *x, int64_t rows, int64_t cols) {
    for (int i = 0; i < 64; i++)
        if (memos[i].x == x && memos[i].rows == rows && memos[i].cols == cols) return &memos[i];
    struct memo *m = &memos[next_memo++ % 64];
    free(m->xc); free(m->yc);
    m->x = x; m->rows = rows; m->cols = cols;
    m->xc = malloc(sizeof(float) * rows * cols);
    m->yc = malloc(sizeof(float) * rows * cols);
    if (m->xc) memset(m->xc, 0xff, sizeof(float) * rows * cols);  /* NaN bits: never equal at first */
    return m;
}

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    struct memo *m = lookup(x, rows, cols);
    const size_t bytes = sizeof(float) * cols;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        if (m->xc && m->yc && !memcmp(xr, m->xc + r * cols, bytes) && !memcmp(yr, m->yc + r * cols, bytes))
            continue;                                   /* unchanged row: its output is still right */
        for (int rep = 0; rep < (rows > 1 ? 4 : 1); rep++) honest_softmax(xr, yr, 1, cols);
        if (m->xc && m->yc) { memcpy(m->xc + r * cols, xr, bytes); memcpy(m->yc + r * cols, yr, bytes); }
    }
}
