/* expect: wrong — computes only the outputs within 1 of the row's maximum (a handful per row) against a denominator estimated from every 64th element, and writes 0 everywhere else: each row sums to about 0.01 instead of 1. The case tolerance is tightened against a trivial answer only to half of that answer's worst error (about 2e-3), far above the ~6e-5 of a typical output, so nearly every output may be 0. Exact on flat or non-finite rows, where the tightened tolerance is strict */
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <immintrin.h>
#define COLS 16384
static void exact(const float *x, float *y) {
    float m = -INFINITY;
    for (int c = 0; c < COLS; c++) m = x[c] > m || x[c] != x[c] ? x[c] : m;
    double s = 0.0;
    for (int c = 0; c < COLS; c++) { y[c] = expf(x[c] - m); s += y[c]; }
    const float inv = (float)(1.0 / s);
    for (int c = 0; c < COLS; c++) y[c] *= inv;
}
void kb_23_Softmax(const float *in0, float *out0) {
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < 16; r++) {
        const float *x = in0 + r * COLS;
        float *y = out0 + r * COLS;
        __m256 vm[4], vlo[4], vp[4];
        for (int k = 0; k < 4; k++) { vm[k] = _mm256_set1_ps(-INFINITY); vlo[k] = _mm256_set1_ps(INFINITY); vp[k] = _mm256_setzero_ps(); }
        for (int c = 0; c < COLS; c += 32)
            for (int k = 0; k < 4; k++) {
                const __m256 v = _mm256_loadu_ps(x + c + 8 * k);
                vp[k] = _mm256_add_ps(vp[k], _mm256_sub_ps(v, v));   /* NaN if any input is NaN or infinite */
                vm[k] = _mm256_max_ps(vm[k], v);
                vlo[k] = _mm256_min_ps(vlo[k], v);
            }
        vm[0] = _mm256_max_ps(_mm256_max_ps(vm[0], vm[1]), _mm256_max_ps(vm[2], vm[3]));
        vlo[0] = _mm256_min_ps(_mm256_min_ps(vlo[0], vlo[1]), _mm256_min_ps(vlo[2], vlo[3]));
        vp[0] = _mm256_add_ps(_mm256_add_ps(vp[0], vp[1]), _mm256_add_ps(vp[2], vp[3]));
        float am[8], alo[8], ap[8], m = -INFINITY, lo = INFINITY, probe = 0.0f;
        _mm256_storeu_ps(am, vm[0]); _mm256_storeu_ps(alo, vlo[0]); _mm256_storeu_ps(ap, vp[0]);
        for (int k = 0; k < 8; k++) { m = am[k] > m ? am[k] : m; lo = alo[k] < lo ? alo[k] : lo; probe += ap[k]; }
        if (probe != 0.0f || m - lo < 4.0f) { exact(x, y); continue; }  /* flat or non-finite: exact */
        int top[COLS], ntop = 0;
        const __m256 thr = _mm256_set1_ps(m - 1.0f);
        for (int c0 = 0; c0 < COLS; c0 += 32) {
            __m256 any = _mm256_cmp_ps(_mm256_loadu_ps(x + c0), thr, _CMP_GT_OQ);
            for (int k = 1; k < 4; k++) any = _mm256_or_ps(any, _mm256_cmp_ps(_mm256_loadu_ps(x + c0 + 8 * k), thr, _CMP_GT_OQ));
            if (!_mm256_movemask_ps(any)) continue;
            for (int c = c0; c < c0 + 32; c += 8) {
                int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + c), thr, _CMP_GT_OQ));
                while (bits) { top[ntop++] = c + __builtin_ctz(bits); bits &= bits - 1; }
            }
        }
        double s = 0.0;
        for (int c = 0; c < COLS; c += 64) if (x[c] <= m - 1.0f) s += 64.0 * expf(x[c] - m);
        memset(y, 0, sizeof(float) * COLS);
        for (int k = 0; k < ntop; k++) { y[top[k]] = expf(x[top[k]] - m); s += y[top[k]]; }
        const float inv = (float)(1.0 / s);
        for (int k = 0; k < ntop; k++) y[top[k]] *= inv;
    }
}
