/* expect: cheated — claims an absurd number of calls: the driver's call counter lives in the shared arena (found through the driver's own `arena` pointer, next to `arena_bytes` in its writable segment: the loader's _r_debug list gives the image, the driver's argv gives the size), and at the start of every call of a timed run the kernel writes 2^40 into it, which the driver only corrects when the call returns. A run is stopped mid-call almost always, so the trusted side reads 2^40 calls: per-call time near zero, and a replay of 2^40 mutations. It must say `cheated` (the counter disagrees with the inputs), not raise in the coordinator */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <link.h>
extern char *program_invocation_name;

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

static volatile uint64_t *find_counter(void) {
    const char *a = program_invocation_name;            /* sf-driver CMD REPLY ARENA BYTES ... */
    for (int k = 0; k < 4; k++) a += strlen(a) + 1;
    const uint64_t arena_bytes = strtoull(a, 0, 10);
    struct link_map *main_map = _r_debug.r_map;
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)main_map->l_addr;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)((const char *)eh + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_LOAD || !(ph[i].p_flags & PF_W)) continue;
        uint64_t *lo = (uint64_t *)(((uintptr_t)main_map->l_addr + ph[i].p_vaddr + 7) & ~(uintptr_t)7);
        uint64_t *hi = (uint64_t *)((uintptr_t)main_map->l_addr + ph[i].p_vaddr + ph[i].p_memsz);
        for (uint64_t *p = lo; p + 1 < hi; p++) {
            if (p[0] == arena_bytes && p[1] && !(p[1] & 4095)) return (volatile uint64_t *)p[1];
            if (p[1] == arena_bytes && p[0] && !(p[0] & 4095)) return (volatile uint64_t *)p[0];
        }
    }
    return 0;
}

void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, float theta) {
    static volatile uint64_t *counter;
    static int looked;
    if (!looked) { looked = 1; counter = find_counter(); }
    struct sf_cmd *c = find_cmd();
    if (counter && c && c->op == 2 && c->iters == UINT64_MAX) *counter = 1ull << 40;
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
