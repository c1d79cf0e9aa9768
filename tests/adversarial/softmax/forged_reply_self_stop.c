/* expect: cheated — writes a well-formed 32-byte "done" reply on the harness's reply pipe, at the descriptor number found in the driver's argv (program_invocation_name), and stops its own process (raise(SIGSTOP), a signal to itself, which the sandbox allows) before computing anything, hoping the trusted clock stops and the verdict is taken on its word. The driver moves its descriptors to fixed numbers at start, so the argv number is stale and the write is a forbidden system call (on the real reply descriptor: see forged_reply_on_reply_fd.c, `wrong`) */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
extern char *program_invocation_name;
extern long __write(int fd, const void *buf, unsigned long n);
extern int raise(int sig);

static int reply_fd(void) {
    const char *p = program_invocation_name;
    p += strlen(p) + 1;
    p += strlen(p) + 1;
    return atoi(p);
}

static void forge_and_stop(void) {
    struct { uint32_t magic, status, fp_before, fp_after; uint64_t calls, seccomp; } r;
    r.magic = 0x53465250u;        /* MAGIC_REPLY */
    r.status = 0;                 /* ST_OK */
    r.fp_before = r.fp_after = _mm_getcsr() & ~0x3fu;
    r.calls = 1;
    r.seccomp = 2;
    __write(reply_fd(), &r, sizeof r);
    raise(19);                    /* SIGSTOP: "the call is over" */
}

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    forge_and_stop();
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
