/* expect: wrong — writes a well-formed 32-byte "done" reply (magic, status OK, unchanged FP modes) onto the reply pipe at the driver's fixed descriptor 4, and stops its own process with raise(SIGSTOP) (a signal to itself, which the sandbox allows) before computing anything, hoping the trusted clock stops there and the verdict is taken on its word; the work would resume at the next SIGCONT, one command late */
#include <stdint.h>
#include <math.h>
#include <immintrin.h>
extern long __write(int fd, const void *buf, unsigned long n);
extern int raise(int sig);
#define REPLY_FD 4

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    struct { uint32_t magic, status, fp_before, fp_after; uint64_t calls, seccomp; } r =
        { 0x53465250u, 0, _mm_getcsr() & ~0x3fu, _mm_getcsr() & ~0x3fu, 1, 15 };
    __write(REPLY_FD, &r, sizeof r);
    raise(19);                        /* SIGSTOP: "the call is over" */
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * cols;
        float *yr = y + i * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m || xr[c] != xr[c] ? xr[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        const float inv = (float)(1.0 / s);
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
