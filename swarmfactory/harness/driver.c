/* The candidate driver: the only process that ever runs candidate code.
 *
 * Started by the harness (candidate.py) as
 *     sf-driver CMD_FD REPLY_FD ARENA_FD ARENA_BYTES THREADS SECCOMP LIBRARY SYMBOL
 * (the descriptors are moved to the fixed numbers 3, 4, 5 at once: compiled-in constants, not
 * variables a candidate could overwrite to redirect the driver's replies)
 * It maps the shared arena (inputs, outputs, guard zones and the slot table, all written by the
 * trusted side), warms the OpenMP pool, locks itself down, loads the candidate's library and then
 * serves fixed-size commands: CALL one slot, or BATCH many calls rotating over slots with a
 * fresh unit of every input replaced before each call. After every reply it stops itself
 * (SIGSTOP): the trusted side times a batch from the SIGCONT it sends to the moment it sees the
 * process stopped, so nothing this process says, and no work it leaves behind, can shorten a
 * measurement. It never times, compares or judges anything.
 *
 * Before any thread exists: Landlock (where the kernel has it) limits the file system to reading
 * the library and the system's shared libraries (no /proc, no secrets, no writes), and the
 * time-stamp counter is made to fault (x86): the candidate has no clock to pace itself by.
 * Lock-down (SECCOMP=1): a system-call allow-list in two steps, applied to every thread.
 *   load:  no new threads or processes, no sockets, no signals to others, no files opened for
 *          writing (the dynamic loader may still read and map the library);
 *   serve: additionally no files at all, no executable mappings, reads only from the command
 *          pipe and writes only to the reply pipe and stderr.
 * A forbidden call traps: the handler names it on stderr and exits with status 159.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define SF_AUDIT_ARCH AUDIT_ARCH_X86_64
/* SSE control (MXCSR without its sticky flags) in the low half, the x87 control word (masks,
   precision, rounding) in the high half: what a kernel must leave as it found it */
static uint32_t fp_state(void) {
    uint16_t cw;
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    return (_mm_getcsr() & 0xffc0u) | ((uint32_t)(cw & 0x1f3f) << 16);
}
static void fp_restore(uint32_t v) {
    uint16_t cw;
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    cw = (uint16_t)((cw & ~0x1f3f) | ((v >> 16) & 0x1f3f));
    __asm__ volatile("fldcw %0" : : "m"(cw));
    _mm_setcsr(v & 0xffffu);
}
#elif defined(__aarch64__)
#define SF_AUDIT_ARCH AUDIT_ARCH_AARCH64
static uint32_t fp_state(void) { uint64_t v; __asm__ volatile("mrs %0, fpcr" : "=r"(v)); return (uint32_t)v; }
static void fp_restore(uint32_t v) { uint64_t w = v; __asm__ volatile("msr fpcr, %0" : : "r"(w)); }
#else
#error "the candidate driver supports x86-64 and aarch64"
#endif

#define MAGIC_CMD 0x53464344u   /* "DCFS" */
#define MAGIC_REPLY 0x53465250u /* "PRFS" */
#define EXIT_FORBIDDEN 159
#define MAX_ARGS 24
#define MAX_SLOTS 256
#define TABLE_OFFSET 4096

enum { OP_CALL = 1, OP_BATCH = 2, OP_EXIT = 3, OP_FP = 4 };
enum { ST_OK = 0, ST_BAD_COMMAND = 1, ST_LOAD_FAILED = 2, ST_NO_SYMBOL = 3, ST_READY = 4,
       ST_BAD_SLOT = 5 };
enum { K_IN = 1, K_OUT = 2, K_INT = 3, K_FLOAT = 4, K_IN_FULL = 5 };
enum { M_MUTATE = 1 };  /* command.mutate bits */

struct cmd { uint32_t magic, op, slot_first, nslots; uint64_t iters, seed; uint32_t mutate, pad;
             uint64_t reserved[3]; };
struct reply { uint32_t magic, status, fp_before, fp_after; uint64_t calls, seccomp; };
struct arg { uint32_t kind, unit; uint64_t off, count, donor_off, donor_count; int64_t ival;
             double fval; };  /* an input's ival: the rows its per-call mutation touches */
struct slot { uint32_t nargs, pad; struct arg args[MAX_ARGS]; };

_Static_assert(sizeof(struct cmd) == 64, "command size");
_Static_assert(sizeof(struct reply) == 32, "reply size");
_Static_assert(sizeof(struct arg) == 56, "arg size");

typedef void (*kernel_fn)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                          float, float, float, float, float, float, float, float);

#define CMD_FD 3
#define REPLY_FD 4
#define ARENA_FD 5
/* The driver's own state, alone on a page that is made read-only before the library loads (and
   the filters forbid any memory call on the driver's image): a candidate cannot redirect it. */
static struct {
    unsigned char *arena;
    uint64_t arena_bytes;
    uint32_t fp0;        /* the floating-point control state before any candidate code ran */
    int threads;
    unsigned char pad[4096 - 24];
} G __attribute__((aligned(4096)));
#define arena G.arena
#define arena_bytes G.arena_bytes
extern char __executable_start[], _end[];

/* ---- seccomp ------------------------------------------------------------------------------- */
struct prog { struct sock_filter f[256]; int n; };

static void emit(struct prog *p, struct sock_filter s) { if (p->n < 256) p->f[p->n++] = s; }
#define LD_NR() BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define ARG_LO(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args) + 8 * (i))
#define ARG_HI(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args) + 8 * (i) + 4)
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))

static void allow(struct prog *p, long nr) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 1));
    emit(p, (struct sock_filter)RET(SECCOMP_RET_ALLOW));
}

/* nr allowed when (args[i] & mask) == 0 (low 32 bits; the high bits must be 0 as well) */
static void allow_arg_masked(struct prog *p, long nr, int i, uint32_t mask) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 6));
    emit(p, (struct sock_filter)ARG_HI(i));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 3));
    emit(p, (struct sock_filter)ARG_LO(i));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, mask, 1, 0));
    emit(p, (struct sock_filter)RET(SECCOMP_RET_ALLOW));
    emit(p, (struct sock_filter)RET(SECCOMP_RET_TRAP));
}

/* nr allowed when args[i] is one of values[0..n) (64-bit compare) */
static void allow_arg_in(struct prog *p, long nr, int i, const uint64_t *values, int n) {
    /* layout: JEQ nr ? next : skip; then per value: LD hi; JEQ hi ? next : +3; LD lo;
       JEQ lo ? ALLOW : next value; ... ; TRAP; ALLOW */
    int body = 4 * n + 2;
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, body));
    for (int k = 0; k < n; k++) {
        int left = 4 * (n - k - 1);  /* instructions after this value's block, before TRAP */
        emit(p, (struct sock_filter)ARG_HI(i));
        emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(values[k] >> 32), 0, 2));
        emit(p, (struct sock_filter)ARG_LO(i));
        emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)values[k],
                                             (uint8_t)(left + 1), 0));
    }
    emit(p, (struct sock_filter)RET(SECCOMP_RET_TRAP));
    emit(p, (struct sock_filter)RET(SECCOMP_RET_ALLOW));
}

/* The driver's image as whole 4 GiB units, from 1 TiB below it: no call may map, unmap, protect,
   remap or advise memory there (its read-only GOT and state page stay so; nothing else of the
   process lives below the executable). Only the high 32 bits of an address are compared. */
static uint32_t image_lo_hi32(void) {
    uint64_t lo = (uint64_t)(uintptr_t)__executable_start;
    uint64_t below = lo > (1ull << 40) ? lo - (1ull << 40) : 0;
    return (uint32_t)(below >> 32);
}
static uint32_t image_hi_hi32(void) { return (uint32_t)((((uint64_t)(uintptr_t)_end) >> 32) + 1); }

/* nr traps when args[i] lies in the driver's image range (see above); else falls through */
static void deny_in_image(struct prog *p, long nr, int i, uint32_t lo_hi, uint32_t hi_hi) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 4));
    emit(p, (struct sock_filter)ARG_HI(i));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, lo_hi, 0, 2));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, hi_hi, 1, 0));
    emit(p, (struct sock_filter)RET(SECCOMP_RET_TRAP));
    emit(p, (struct sock_filter)LD_NR());
}

static void protect_image(struct prog *p, uint32_t lo_hi, uint32_t hi_hi) {
    deny_in_image(p, SYS_mmap, 0, lo_hi, hi_hi);
    deny_in_image(p, SYS_mprotect, 0, lo_hi, hi_hi);
    deny_in_image(p, SYS_munmap, 0, lo_hi, hi_hi);
    deny_in_image(p, SYS_mremap, 0, lo_hi, hi_hi);
    deny_in_image(p, SYS_mremap, 4, lo_hi, hi_hi);
    deny_in_image(p, SYS_madvise, 0, lo_hi, hi_hi);
}

static void prologue(struct prog *p) {
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SF_AUDIT_ARCH, 1, 0));
    emit(p, (struct sock_filter)RET(SECCOMP_RET_KILL_PROCESS));
    emit(p, (struct sock_filter)LD_NR());
#if defined(__x86_64__)
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1)); /* x32 */
    emit(p, (struct sock_filter)RET(SECCOMP_RET_KILL_PROCESS));
#endif
}

static void common(struct prog *p, pid_t self) {
    uint64_t me = (uint64_t)self;
    allow(p, SYS_futex); allow(p, SYS_sched_yield); allow(p, SYS_exit); allow(p, SYS_exit_group);
    allow(p, SYS_rt_sigreturn); allow(p, SYS_rt_sigprocmask); allow(p, SYS_getpid); allow(p, SYS_gettid);
    allow(p, SYS_sched_getaffinity); allow(p, SYS_munmap);
    allow(p, SYS_brk); allow(p, SYS_madvise); allow(p, SYS_mremap); allow(p, SYS_restart_syscall);
    allow(p, SYS_getrandom);
#ifdef SYS_futex_waitv
    allow(p, SYS_futex_waitv);
#endif
    allow_arg_in(p, SYS_kill, 0, &me, 1);      /* signals to itself only (abort, self-stop) */
    allow_arg_in(p, SYS_tgkill, 0, &me, 1);
}

static int install(struct prog *p) {
    struct sock_fprog fp = { .len = (unsigned short)p->n, .filter = p->f };
    if (p->n >= 256) return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fp);
}

static void load_program(struct prog *pp, pid_t self, uint32_t lo_hi, uint32_t hi_hi) {
    struct prog p = { .n = 0 };
    prologue(&p);
    protect_image(&p, lo_hi, hi_hi);
    common(&p, self);
    allow(&p, SYS_read); allow(&p, SYS_pread64); allow(&p, SYS_close); allow(&p, SYS_fstat);
    allow(&p, SYS_newfstatat); allow(&p, SYS_lseek); allow(&p, SYS_mmap); allow(&p, SYS_mprotect);
    allow(&p, SYS_seccomp);  /* only ever adds restrictions: the serve filter goes on top */
    allow(&p, SYS_clock_gettime); allow(&p, SYS_nanosleep);  /* the loader's, not the kernel's */
#ifdef SYS_statx
    allow(&p, SYS_statx);
#endif
    uint64_t writers[2] = { 2, REPLY_FD };
    allow_arg_in(&p, SYS_write, 0, writers, 2);
    uint32_t wflags = O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_TMPFILE;
    allow_arg_masked(&p, SYS_openat, 2, wflags);
#ifdef SYS_open
    allow_arg_masked(&p, SYS_open, 1, wflags);
#endif
    emit(&p, (struct sock_filter)RET(SECCOMP_RET_TRAP));
    *pp = p;
}

static void serve_program(struct prog *pp, pid_t self, uint32_t lo_hi, uint32_t hi_hi) {
    struct prog p = { .n = 0 };
    prologue(&p);
    protect_image(&p, lo_hi, hi_hi);
    common(&p, self);
    uint64_t readers[1] = { CMD_FD };
    allow_arg_in(&p, SYS_read, 0, readers, 1);
    uint64_t writers[2] = { 2, REPLY_FD };
    allow_arg_in(&p, SYS_write, 0, writers, 2);
    allow_arg_masked(&p, SYS_mmap, 2, PROT_EXEC);    /* memory, never code */
    allow_arg_masked(&p, SYS_mprotect, 2, PROT_EXEC);
    emit(&p, (struct sock_filter)RET(SECCOMP_RET_TRAP));
    *pp = p;
}

static int lock_for_load(void) {
    struct prog p;
    load_program(&p, getpid(), image_lo_hi32(), image_hi_hi32());
    return install(&p);
}

static int lock_for_serve(void) {
    struct prog p;
    serve_program(&p, getpid(), image_lo_hi32(), image_hi_hi32());
    return install(&p);
}

/* `sf-driver --filters PID LO_HI HI_HI`: the two programs a driver with that pid and image range
   installs, written to stdout (counts, then the instructions) for the trusted side to compare
   with what the kernel reports installed. Runs no candidate code. */
static int dump_filters(pid_t pid, uint32_t lo_hi, uint32_t hi_hi) {
    struct prog load, serve;
    load_program(&load, pid, lo_hi, hi_hi);
    serve_program(&serve, pid, lo_hi, hi_hi);
    uint32_t counts[2] = { (uint32_t)load.n, (uint32_t)serve.n };
    if (fwrite(counts, sizeof counts, 1, stdout) != 1) return 1;
    if (fwrite(load.f, sizeof load.f[0], (size_t)load.n, stdout) != (size_t)load.n) return 1;
    if (fwrite(serve.f, sizeof serve.f[0], (size_t)serve.n, stdout) != (size_t)serve.n) return 1;
    return fflush(stdout) != 0;
}

static void put_str(const char *s) { ssize_t r = write(2, s, strlen(s)); (void)r; }

/* ---- Landlock (file system) and the time-stamp counter --------------------------------------- */
struct ll_ruleset { uint64_t fs, net, scoped; };
struct ll_path { uint64_t allowed; int32_t parent_fd; } __attribute__((packed));
#define LL_READ_FILE (1ull << 2)
#define LL_READ_DIR (1ull << 3)
#define LL_EXECUTE (1ull << 0)

static void ll_allow(int ruleset, const char *path, uint64_t access, uint64_t handled) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) access &= LL_READ_FILE | LL_EXECUTE;
    struct ll_path rule = { access & handled, fd };
    syscall(445 /* landlock_add_rule */, ruleset, 1 /* PATH_BENEATH */, &rule, 0);
    close(fd);
}

/* Reading the library and the shared libraries the loader may need; nothing else, no writes.
   Returns the Landlock ABI in force, 0 where the kernel has none. */
static int lock_files(const char *library) {
    long abi = syscall(444 /* landlock_create_ruleset */, NULL, 0, 1u /* VERSION */);
    if (abi < 1) return 0;
    struct ll_ruleset attr = { (1ull << 13) - 1, 0, 0 };
    size_t size = 8;
    if (abi >= 2) attr.fs |= 1ull << 13;            /* REFER */
    if (abi >= 3) attr.fs |= 1ull << 14;            /* TRUNCATE */
    if (abi >= 5) attr.fs |= 1ull << 15;            /* IOCTL_DEV */
    if (abi >= 4) { attr.net = 3; size = 16; }      /* BIND_TCP, CONNECT_TCP */
    if (abi >= 6) { attr.scoped = 3; size = 24; }   /* abstract sockets, signals to others */
    int rs = (int)syscall(444, &attr, size, 0u);
    if (rs < 0) return 0;
    uint64_t lib = LL_READ_FILE | LL_READ_DIR | LL_EXECUTE;
    ll_allow(rs, library, LL_READ_FILE | LL_EXECUTE, attr.fs);
    ll_allow(rs, "/etc/ld.so.cache", LL_READ_FILE, attr.fs);
    const char *dirs[] = { "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib" };
    for (unsigned i = 0; i < sizeof dirs / sizeof *dirs; i++) ll_allow(rs, dirs[i], lib, attr.fs);
    long ok = syscall(446 /* landlock_restrict_self */, rs, 0u);
    close(rs);
    return ok == 0 ? (int)abi : 0;
}

#if defined(__x86_64__)
static int stop_clock(void) { return prctl(PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0) == 0; }
static int reads_tsc(const unsigned char *ip) {
    return (ip[0] == 0x0f && ip[1] == 0x31) || (ip[0] == 0x0f && ip[1] == 0x01 && ip[2] == 0xf9);
}
#else
static int stop_clock(void) { return 0; }
#endif

static void say_and_exit(const char *what) {
    put_str("\nswarmfactory-sandbox: ");
    put_str(what);
    put_str("\n");
    syscall(SYS_exit_group, EXIT_FORBIDDEN);
}

/* SA_RESETHAND: any other fault re-executes under the default action and kills the process */
static void on_sigsegv(int sig, siginfo_t *info, void *ctx) {
    (void)sig; (void)info;
#if defined(__x86_64__)
    const ucontext_t *uc = (const ucontext_t *)ctx;
    const unsigned char *ip = (const unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
    if (ip && reads_tsc(ip)) say_and_exit("read the time-stamp counter (rdtsc)");
#else
    (void)ctx;
#endif
}

static void on_sigsys(int sig, siginfo_t *info, void *ctx) {
    (void)sig; (void)ctx;
    char buf[96], num[24];
    int nr = info->si_syscall, k = 0;
    unsigned v = nr < 0 ? 0u : (unsigned)nr;
    do { num[k++] = (char)('0' + v % 10); v /= 10; } while (v && k < 20);
    strcpy(buf, "\nswarmfactory-sandbox: forbidden system call ");
    size_t n = strlen(buf);
    while (k) buf[n++] = num[--k];
    buf[n++] = '\n';
    ssize_t r = write(2, buf, n); (void)r;
    syscall(SYS_exit_group, EXIT_FORBIDDEN);
}

/* ---- serving ------------------------------------------------------------------------------- */
static void send_reply(uint32_t status, uint32_t fp_before, uint32_t fp_after, uint64_t calls,
                       uint64_t seccomp) {
    struct reply r = { MAGIC_REPLY, status, fp_before, fp_after, calls, seccomp };
    const char *b = (const char *)&r;
    size_t left = sizeof r;
    while (left) {
        ssize_t n = write(REPLY_FD, b, left);
        if (n <= 0) { if (n < 0 && errno == EINTR) continue; _exit(3); }
        b += n; left -= (size_t)n;
    }
    kill(getpid(), SIGSTOP);  /* the trusted side's clock stops when it sees this */
}

static int read_cmd(struct cmd *c) {
    char *b = (char *)c;
    size_t left = sizeof *c;
    while (left) {
        ssize_t n = read(CMD_FD, b, left);
        if (n == 0) return -1;
        if (n < 0) { if (errno == EINTR) continue; return -1; }
        b += n; left -= (size_t)n;
    }
    return 0;
}

static inline uint64_t splitmix(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct ready { int nargs; int64_t iv[16]; float fv[8]; struct arg *in[MAX_ARGS]; int nin; };

static int prepare_slot(uint32_t s, struct ready *r) {
    if (s >= MAX_SLOTS) return -1;
    struct slot *sl = (struct slot *)(arena + TABLE_OFFSET + (uint64_t)s * sizeof(struct slot));
    int ni = 0, nf = 0;
    r->nin = 0;
    memset(r->iv, 0, sizeof r->iv);
    memset(r->fv, 0, sizeof r->fv);
    if (sl->nargs > MAX_ARGS) return -1;
    for (uint32_t a = 0; a < sl->nargs; a++) {
        struct arg *g = &sl->args[a];
        if (g->kind == K_IN || g->kind == K_OUT || g->kind == K_IN_FULL) {
            if (g->off >= arena_bytes || ni >= 16) return -1;
            r->iv[ni++] = (int64_t)(uintptr_t)(arena + g->off);
            if (g->kind == K_IN && g->ival > 1 && (g->ival > (int64_t)g->count || g->count % (uint64_t)g->ival))
                return -1;
            if ((g->kind == K_IN || g->kind == K_IN_FULL) && g->count && g->donor_count && g->unit)
                r->in[r->nin++] = g;
        } else if (g->kind == K_INT) {
            if (ni >= 16) return -1;
            r->iv[ni++] = g->ival;
        } else if (g->kind == K_FLOAT) {
            if (nf >= 8) return -1;
            r->fv[nf++] = (float)g->fval;
        } else {
            return -1;
        }
    }
    return 0;
}

static inline void call(kernel_fn fn, const struct ready *r) {
    const int64_t *i = r->iv;
    const float *f = r->fv;
    fn(i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], i[8], i[9], i[10], i[11], i[12], i[13], i[14],
       i[15], f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]);
}

/* Before every timed call: an input of kind K_IN has one unit replaced by a donor unit in each
   of its `ival` rows (equal runs of units: every row of a matrix changes, so no row's result can
   be kept); one of kind K_IN_FULL (an input small enough to be diffed for little) is rewritten
   whole, from the donor rotated by a random number of units. The trusted side replays it all. */
static inline void mutate(const struct ready *r, uint64_t seed, uint64_t call_index) {
    for (int a = 0; a < r->nin; a++) {
        const struct arg *g = r->in[a];
        uint64_t z = splitmix(seed, call_index * 64 + (uint64_t)a);
        if (g->kind == K_IN_FULL) {
            uint64_t rot = ((z >> 32) * g->donor_count) >> 32, n = g->count;
            uint64_t first = g->donor_count - rot < n ? g->donor_count - rot : n;
            memcpy(arena + g->off, arena + g->donor_off + rot * g->unit, first * g->unit);
            if (first < n)
                memcpy(arena + g->off + first * g->unit, arena + g->donor_off, (n - first) * g->unit);
            continue;
        }
        uint64_t rows = g->ival > 1 ? (uint64_t)g->ival : 1, per = g->count / rows;
        for (uint64_t row = 0; row < rows; row++) {
            uint64_t zr = row ? splitmix(z, row) : z;
            uint64_t dst = row * per + (((zr & 0xffffffffull) * per) >> 32);
            uint64_t src = ((zr >> 32) * g->donor_count) >> 32;
            memcpy(arena + g->off + dst * g->unit, arena + g->donor_off + src * g->unit, g->unit);
        }
    }
}

/* Every thread of the pool must hold the control state it had before the library loaded: a
   kernel that changes it on a worker thread (or leaves it changed on this one) is caught here
   (and by the trusted side, which reads every thread's state while the process is stopped). */
static uint32_t pool_fp_state(void) {
    uint32_t found = fp_state();
    if (found != G.fp0) { fp_restore(G.fp0); return found; }
    if (G.threads < 2) return G.fp0;
    #pragma omp parallel num_threads(G.threads)
    {
        uint32_t mine = fp_state();
        if (mine != G.fp0) {
            fp_restore(G.fp0);
            #pragma omp critical
            found = mine;
        }
    }
    return found;
}

/* the inherited descriptors, moved to their fixed numbers whatever they arrived as */
static int fix_fds(int cmd, int reply, int arena_fd) {
    int tmp[3] = { fcntl(cmd, F_DUPFD_CLOEXEC, 100), fcntl(reply, F_DUPFD_CLOEXEC, 100),
                   fcntl(arena_fd, F_DUPFD_CLOEXEC, 100) };
    if (tmp[0] < 0 || tmp[1] < 0 || tmp[2] < 0) return -1;
    close(cmd); close(reply); close(arena_fd);
    int want[3] = { CMD_FD, REPLY_FD, ARENA_FD };
    for (int i = 0; i < 3; i++) {
        if (dup2(tmp[i], want[i]) != want[i]) return -1;
        close(tmp[i]);
    }
    return 0;
}

enum { F_SECCOMP_LOAD = 1, F_SECCOMP_SERVE = 2, F_LANDLOCK = 4, F_NO_CLOCK = 8 };

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--filters") == 0)
        return dump_filters((pid_t)atoi(argv[2]), (uint32_t)strtoul(argv[3], NULL, 10),
                            (uint32_t)strtoul(argv[4], NULL, 10));
    if (argc != 9) { put_str("usage: sf-driver CMD REPLY ARENA BYTES THREADS SECCOMP LIB SYMBOL\n"); return 2; }
    if (fix_fds(atoi(argv[1]), atoi(argv[2]), atoi(argv[3])) != 0) { put_str("sf-driver: bad descriptors\n"); return 2; }
    arena_bytes = strtoull(argv[4], NULL, 10);
    int threads = atoi(argv[5]);
    int want_seccomp = atoi(argv[6]);
    arena = mmap(NULL, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ARENA_FD, 0);
    if (arena == MAP_FAILED) { put_str("sf-driver: cannot map the arena\n"); return 2; }
    close(ARENA_FD);
    volatile double keep = sqrt((double)threads);  /* libm is loaded before the candidate */
    (void)keep;

    uint64_t flags = 0;
    if (want_seccomp) {  /* the whole lock-down, or none of it (tests switch it off to probe) */
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) put_str("sf-driver: no_new_privs failed\n");
        if (lock_files(argv[7])) flags |= F_LANDLOCK;
        if (stop_clock()) flags |= F_NO_CLOCK;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSYS, &sa, NULL);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsegv;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigaction(SIGSEGV, &sa, NULL);

    /* the pool is created after the file and clock restrictions, so every thread has them */
    if (threads < 1) threads = 1;
    omp_set_num_threads(threads);
    #pragma omp parallel
    { volatile int t = omp_get_thread_num(); (void)t; }
    G.threads = threads;
    G.fp0 = fp_state();
    (void)pool_fp_state();  /* every pool thread starts from the same state */
    if (want_seccomp && mprotect(&G, sizeof G, PROT_READ) != 0) put_str("sf-driver: state page stays writable\n");

    if (want_seccomp) {
        if (lock_for_load() != 0) { put_str("sf-driver: seccomp unavailable\n"); }
        else flags |= F_SECCOMP_LOAD;
    }
    uint64_t seccomp = flags;
    /* before any candidate code: the image range the filters protect rides in `calls`, so the
       trusted side can rebuild the exact programs it must find installed */
    send_reply(ST_READY, G.fp0, G.fp0, ((uint64_t)image_lo_hi32() << 32) | image_hi_hi32(), seccomp);

    void *lib = dlopen(argv[7], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        put_str("sf-driver: dlopen: "); put_str(dlerror()); put_str("\n");
        send_reply(ST_LOAD_FAILED, 0, 0, 0, seccomp);
        return 4;
    }
    kernel_fn fn = (kernel_fn)dlsym(lib, argv[8]);
    if (!fn) { send_reply(ST_NO_SYMBOL, 0, 0, 0, seccomp); return 4; }
    if (flags & F_SECCOMP_LOAD) {
        if (lock_for_serve() != 0) { put_str("sf-driver: seccomp (serve) failed\n"); return 5; }
        seccomp |= F_SECCOMP_SERVE;
    }
    /* the library's loading must have left every thread's control state as it was */
    uint32_t loaded_fp = pool_fp_state();
    send_reply(ST_OK, G.fp0, loaded_fp, 0, seccomp);

    struct cmd c;
    struct ready rs[MAX_SLOTS];
    while (read_cmd(&c) == 0) {
        if (c.magic != MAGIC_CMD) { send_reply(ST_BAD_COMMAND, 0, 0, 0, seccomp); continue; }
        if (c.op == OP_EXIT) _exit(0);
        if (c.op == OP_FP) {  /* every pool thread's control state, on its own (never timed) */
            uint32_t found = pool_fp_state();
            send_reply(ST_OK, G.fp0, found, 0, seccomp);
            continue;
        }
        if (c.op != OP_CALL && c.op != OP_BATCH) { send_reply(ST_BAD_COMMAND, 0, 0, 0, seccomp); continue; }
        uint32_t n = c.op == OP_CALL ? 1 : c.nslots;
        if (n == 0 || n > MAX_SLOTS || c.slot_first + n > MAX_SLOTS) { send_reply(ST_BAD_SLOT, 0, 0, 0, seccomp); continue; }
        int bad = 0;
        for (uint32_t k = 0; k < n && !bad; k++) bad = prepare_slot(c.slot_first + k, &rs[k]) != 0;
        if (bad) { send_reply(ST_BAD_SLOT, 0, 0, 0, seccomp); continue; }
        uint32_t before = G.fp0, after = before;
        uint64_t iters = c.op == OP_CALL ? 1 : c.iters, done = 0;
        /* UNBOUNDED: run until the trusted side stops this process at a moment of its choosing;
           the counter lets it check (against the replayed mutations) how many calls were made */
        int unbounded = iters == UINT64_MAX;
        volatile uint64_t *counter = (volatile uint64_t *)arena;
        volatile uint64_t *halt = (volatile uint64_t *)(arena + 64);
        for (uint64_t i = 0; i < iters; i++) {
            if (unbounded && *halt) break;
            const struct ready *r = &rs[i % n];
            if (c.mutate & M_MUTATE) mutate(r, c.seed, i);
            call(fn, r);
            done++;
            if (unbounded) *counter = done;
            uint32_t now = fp_state();
            if (now != before && after == before) after = now;
            if (now != before) fp_restore(before);
        }
        send_reply(ST_OK, before, after, done, seccomp);
    }
    return 0;
}
