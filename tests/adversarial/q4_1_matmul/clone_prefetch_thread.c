/* expect: cheated — starts a resident helper thread with glibc's __clone (a name the filter does not know) on a malloc'd stack; it dequantises the weights of each call into a cache in the background and outlives the call, so the dequantisation is never timed */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
extern int __clone(int (*fn)(void *), void *stack, int flags, void *arg, ...);

static volatile const uint8_t *todo;
static int helper(void *arg) {
    (void)arg;
    for (;;) { while (!todo) { } todo = 0; /* ... dequantise into the cache ... */ }
    return 0;
}

static float half_to_float(const uint8_t *p) {
    const uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    const int e = (h >> 10) & 31, man = h & 1023;
    float v = e == 0 ? ldexpf((float)man, -24) : e == 31 ? (man ? NAN : INFINITY) : ldexpf((float)(man | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
    static int started;
    if (!started) {
        started = 1;
        char *stack = malloc(1 << 20);
        const int flags = 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000; /* VM FS FILES SIGHAND THREAD SYSVSEM */
        if (stack) __clone(helper, stack + (1 << 20), flags, 0);
    }
    todo = wq;
    const int64_t nb = k / 32;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < n; r++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < nb; j++) {
                const uint8_t *blk = wq + (r * nb + j) * 20;
                const float *xb = x + b * k + j * 32;
                float dot = 0.0f, sx = 0.0f;
                for (int i = 0; i < 16; i++) {
                    dot += (float)(blk[4 + i] & 15) * xb[i] + (float)(blk[4 + i] >> 4) * xb[i + 16];
                    sx += xb[i] + xb[i + 16];
                }
                acc += half_to_float(blk) * dot + half_to_float(blk + 2) * sx;
            }
            y[b * n + r] = acc;
        }
}
