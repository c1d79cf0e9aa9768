from swarmfactory.backends.cstatic import check_source

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


def test_names_assembled_by_the_preprocessor_are_seen_after_expansion():
    from swarmfactory.backends.c import CBackend
    from swarmfactory.backends.base import CheatError

    src = ("#include <stdint.h>\n#define GLUE(a, b) a##b\n"
           "extern long GLUE(sys, call)(long, ...);\n"
           "void k(const float *x, float *y, int64_t n) { GLUE(sys, call)(39); y[0] = x[0]; }\n")
    assert check_source(src) is None  # the text filter alone misses it
    try:
        CBackend().build(src, "k", checks=True)
    except CheatError as exc:
        assert "syscall" in str(exc) and "preprocessing" in str(exc)
    else:
        raise AssertionError("the pasted name was not found")


def test_the_assembly_check_finds_inline_asm_hidden_behind_a_macro():
    from swarmfactory.backends.c import CBackend
    from swarmfactory.backends.base import CheatError

    src = ("#include <stdint.h>\n#define A(x) __as##m__ volatile(x)\n"
           "void k(const float *x, float *y, int64_t n) { A(\"nop\"); y[0] = x[0]; }\n")
    try:
        CBackend().build(src, "k", checks=True)
    except CheatError as exc:
        assert "inline assembly" in str(exc)
    else:
        raise AssertionError("hidden inline assembly was not found")


def test_a_definition_that_disagrees_with_the_abi_fails_to_build_and_names_the_prototype(harness):
    from swarmfactory.problems import load_problem

    p = load_problem("rmsnorm")
    wrong = ("#include <stdint.h>\nvoid rmsnorm(const float *x, float *y, int n) { y[0] = x[0]; }\n")
    v = harness.evaluate(p, wrong, measure=False)
    assert v.outcome.value == "build_failed", v.detail
    assert p.c_signature in v.detail


def test_an_empty_source_says_it_is_empty(harness):
    from swarmfactory.problems import load_problem

    v = harness.evaluate(load_problem("rmsnorm"), "  \n\n", measure=False)
    assert v.outcome.value == "build_failed" and "empty" in v.detail
