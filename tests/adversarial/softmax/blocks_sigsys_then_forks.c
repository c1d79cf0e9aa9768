/* expect: cheated — blocks SIGSYS with sigprocmask (rt_sigprocmask is allowed) before forking through glibc's __fork, so the sandbox's trap cannot run the driver's handler that reports the forbidden call: the kernel then kills the process with SIGSYS instead. The fork never happens either way; the verdict must still say it tried */
#include <stdint.h>
#include <math.h>
extern int sigprocmask(int how, const void *set, void *old);
extern int __fork(void);
extern void _exit(int);

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    static int forked;
    if (!forked) {
        forked = 1;
        unsigned long set[16] = {1ul << (31 - 1)};          /* SIGSYS */
        sigprocmask(0 /* SIG_BLOCK */, set, 0);
        if (__fork() == 0) {                                 /* a helper to finish rows later */
            volatile double burn = 0.0;
            for (long i = 0; i < 1000000000L; i++) burn += 1e-9;
            _exit(0);
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m || xr[c] != xr[c] ? xr[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        const float inv = (float)(1.0 / s);
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
