/* expect: cheated — turns on flush-to-zero and denormals-are-zero and leaves them on (a kernel must return the caller's FP modes as it found them), and hides it: through the loader's _r_debug list it finds the driver's image, scans its writable segment for the reply_fd/cmd_fd pair (their values come from the driver's argv via program_invocation_name), points the driver's reply_fd at stderr, and writes its own well-formed replies (fp_after == fp_before) at the end of every command, which it tells from the driver's command record on the stack and the arena's halt flag */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <link.h>
#include <immintrin.h>
extern char *program_invocation_name;
extern long __write(int fd, const void *buf, unsigned long n);

struct sf_cmd { uint32_t magic, op, slot_first, nslots; uint64_t iters, seed; uint32_t mutate, pad; uint64_t reserved[3]; };
static struct sf_cmd *cmd_at;
static struct sf_cmd *find_cmd(void) {
    if (cmd_at && cmd_at->magic == 0x53464344u) return cmd_at;
    uintptr_t p = ((uintptr_t)__builtin_frame_address(0) + 7) & ~(uintptr_t)7;
    for (uintptr_t end = p + (128 << 10); p < end; p += 8) {
        struct sf_cmd *c = (struct sf_cmd *)p;
        if (c->magic == 0x53464344u && (c->op == 1 || c->op == 2) && c->nslots >= 1 && c->nslots <= 256 &&
            c->slot_first + c->nslots <= 256 && c->pad == 0 && !c->reserved[0] && !c->reserved[1] && !c->reserved[2])
            return cmd_at = c;
    }
    return 0;
}

static int my_reply = -1;
static volatile uint64_t *halt_flag;

static void take_over(void) {
    const char *a = program_invocation_name;          /* sf-driver CMD REPLY ARENA BYTES ... */
    const char *cmd = a + strlen(a) + 1, *rep = cmd + strlen(cmd) + 1, *fd = rep + strlen(rep) + 1;
    const char *bytes = fd + strlen(fd) + 1;
    const int cmd_fd = atoi(cmd), reply_fd = atoi(rep);
    const uint64_t arena_bytes = strtoull(bytes, 0, 10);
    struct link_map *main_map = _r_debug.r_map;         /* the first entry is the executable */
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)main_map->l_addr;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)((const char *)eh + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_LOAD || !(ph[i].p_flags & PF_W)) continue;
        char *lo = (char *)main_map->l_addr + ph[i].p_vaddr;
        char *hi = lo + ph[i].p_memsz;
        for (int *p = (int *)(((uintptr_t)lo + 3) & ~(uintptr_t)3); (char *)(p + 1) < hi; p++)
            if (p[0] == reply_fd && p[1] == cmd_fd) { my_reply = reply_fd; p[0] = 2; }
            else if (p[0] == cmd_fd && p[1] == reply_fd) { my_reply = reply_fd; p[1] = 2; }
        for (uint64_t *p = (uint64_t *)(((uintptr_t)lo + 7) & ~(uintptr_t)7); (char *)(p + 2) < hi; p++)
            if (p[0] == arena_bytes && p[1] && !(p[1] & 4095)) halt_flag = (volatile uint64_t *)(p[1] + 64);
            else if (p[1] == arena_bytes && p[0] && !(p[0] & 4095)) halt_flag = (volatile uint64_t *)(p[0] + 64);
    }
}

static void reply(uint32_t fp, uint64_t calls) {
    struct { uint32_t magic, status, fp_before, fp_after; uint64_t calls, seccomp; } r =
        { 0x53465250u, 0, fp, fp, calls, 2 };
    __write(my_reply, &r, sizeof r);
}

static void compute(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    const int64_t half = head_dim / 2;
    float inv[1024], cs[1024], sn[1024];
    for (int64_t i0 = 0; i0 < half; i0 += 1024) {
        const int64_t n = half - i0 < 1024 ? half - i0 : 1024;
        for (int64_t j = 0; j < n; j++) inv[j] = (float)pow((double)theta, -2.0 * (double)(i0 + j) / (double)head_dim);
        for (int64_t t = 0; t < tokens; t++) {
            const float p = (float)pos[t];
            for (int64_t j = 0; j < n; j++) { cs[j] = cosf(p * inv[j]); sn[j] = sinf(p * inv[j]); }
            for (int64_t h = 0; h < heads; h++) {
                const float *x1 = x + (t * heads + h) * head_dim + i0, *x2 = x1 + half;
                float *y1 = y + (t * heads + h) * head_dim + i0, *y2 = y1 + half;
                for (int64_t j = 0; j < n; j++) { y1[j] = x1[j] * cs[j] - x2[j] * sn[j]; y2[j] = x2[j] * cs[j] + x1[j] * sn[j]; }
            }
        }
    }
}

void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    static uint64_t seed_now, calls_now;
    const uint32_t fp = _mm_getcsr() & ~0x3fu;          /* the driver's modes, as it will report them */
    if (my_reply < 0) take_over();
    _mm_setcsr(_mm_getcsr() | 0x8040u);                 /* FTZ | DAZ, and never restored */
    compute(x, pos, y, tokens, heads, head_dim, theta);
    struct sf_cmd *c = find_cmd();
    if (my_reply < 0 || !c) return;
    if (c->op == 1) { reply(fp, 1); return; }
    if (c->seed != seed_now) { seed_now = c->seed; calls_now = 0; }
    calls_now++;
    if (c->iters == UINT64_MAX ? (halt_flag && *halt_flag) : calls_now == c->iters) reply(fp, calls_now);
}
