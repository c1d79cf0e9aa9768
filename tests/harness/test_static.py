from swarmfactory.harness.static import check_source

CLEAN = """#include <stdint.h>
#include <math.h>
#include <string.h>
/* time is measured by the harness; we never call clock() */
void k(const float *x, float *y, int64_t n) {
    #pragma omp parallel for
    for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]);
    const char *s = "fopen(";
    (void)s;
}
"""


def test_a_clean_kernel_passes_even_when_comments_and_strings_name_forbidden_things():
    assert check_source(CLEAN) is None


def test_forbidden_things_are_named():
    cases = {
        "#include <pthread.h>\n": "pthread.h",
        "void f(){ clock_gettime(0, 0); }": "clock_gettime",
        "void f(){ __rdtsc(); }": "__rdtsc",
        "void f(){ system(\"ls\"); }": "system",
        "void f(){ asm volatile(\"nop\"); }": "inline assembly",
        "__attribute__((constructor)) void f(){}": "load time",
        "#include \"/etc/passwd\"\n": "includes outside",
        "#include <sys/mman.h>\n": "sys/",
        "void f(){ void *h = dlopen(0, 0); }": "dlopen",
        "void f(){ omp_set_num_threads(64); }": "omp_set_num_threads",
    }
    for src, needle in cases.items():
        reason = check_source(src)
        assert reason and needle in reason, (src, reason)
