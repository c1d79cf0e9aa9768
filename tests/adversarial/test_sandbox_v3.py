"""The third red team's classes, each proved on the layer that stops it (the hostile kernels'
expected verdicts under the default harness are checked by test_adversarial.py).

1. Load-time code loosening the sandbox: the built library is refused (ELF check), the driver is
   bound at once with a read-only GOT and no memory call may touch its image, and the installed
   filters are read back and compared with the driver's own programs.
2. A candidate that knows it is being judged: verification and timing run in the same
   environment (no variable naming the harness, no wait policy, the timed thread count), and
   timed inputs are drawn from the same value distributions as verification, specials included.
3. Floating-point state changed at load or on OpenMP workers: read on every thread.
6. Memoisation on diffed inputs: every row of every input changes before every timed call.
7. Audits placed by the candidate's calibration: audits stop at moments of the trusted clock's
   choosing; a figure beyond the roofline is re-measured under audit and never the verdict.
8. Build evidence: a file the candidate did not supply is never quoted.
"""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from swarmfactory.backends.c import CBackend, withhold_foreign
from swarmfactory.backends.elfcheck import load_time_code
from swarmfactory.harness import candidate as cand
from swarmfactory.harness import tracer
from swarmfactory.harness.arena import Arena
from swarmfactory.harness.evaluate import Harness, HarnessConfig
from swarmfactory.outcome import Outcome, Verdict
from swarmfactory.harness.slots import FULL_REWRITE_MAX, SlotGroup, group_bytes, mutation_plan
from swarmfactory.problems import load_problem
from swarmfactory.problems.spec import Case

HERE = Path(__file__).parent
CORRECT = {Outcome.FASTER, Outcome.NOT_FASTER}
BASE = dict(rounds=6, compile_baselines=False, case_timeout_s=5.0)


# an honest rmsnorm (sums in double: as accurate as torch's at every shape)
GOOD = r"""
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) ss += (double)xr[c] * xr[c];
        const float inv = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
}
"""


def source(kernel: str) -> str:
    return GOOD if kernel == "rmsnorm/good" else (HERE / f"{kernel}.c").read_text()


def evaluate(kernel: str, **config):
    h = Harness(HarnessConfig(**{**BASE, **config}))
    try:
        return h.evaluate(load_problem(kernel.split("/")[0]), source(kernel))
    finally:
        h.close()


# -- 1. load-time code ------------------------------------------------------------------------
LOADERS = {
    "ifunc": "static void k(const float *x, float *y, long n) { for (long i = 0; i < n; i++) y[i] = x[i]; }\n"
             "static void *r(void) { return (void *)k; }\n"
             "void f(const float *x, float *y, long n) __attribute__((ifunc(\"r\")));\n",
    "ifunc used inside": "static void k(const float *x, float *y, long n) { for (long i = 0; i < n; i++) y[i] = x[i]; }\n"
                         "static void *r(void) { return (void *)k; }\n"
                         "static void g(const float *x, float *y, long n) __attribute__((ifunc(\"r\")));\n"
                         "void f(const float *x, float *y, long n) { g(x, y, n); }\n",
    "constructor": "volatile int v;\n__attribute__((constructor)) static void c(void) { v = 1; }\n"
                   "void f(const float *x, float *y, long n) { for (long i = 0; i < n; i++) y[i] = x[i] + v; }\n",
    "init_array by section": "volatile int v;\nstatic void c(void) { v = 1; }\n"
                             "__attribute__((used, section(\".init_array\"))) static void (*p)(void) = c;\n"
                             "void f(const float *x, float *y, long n) { for (long i = 0; i < n; i++) y[i] = x[i] + v; }\n",
    "init_array type under another name": "volatile int v;\nstatic void c(void) { v = 1; }\n"
                                          "__attribute__((used, section(\".mine,\\\"aw\\\",@init_array #\"))) "
                                          "static void (*p)(void) = c;\n"
                                          "void f(const float *x, float *y, long n) { for (long i = 0; i < n; i++) y[i] = x[i] + v; }\n",
    "destructor": "volatile int v;\n__attribute__((destructor)) static void d(void) { v = 1; }\n"
                  "void f(const float *x, float *y, long n) { for (long i = 0; i < n; i++) y[i] = x[i] + v; }\n",
    "thread-local storage": "static __thread float t;\n"
                            "void f(const float *x, float *y, long n) { for (long i = 0; i < n; i++) { t += x[i]; y[i] = t; } }\n",
}


@pytest.mark.parametrize("what", sorted(LOADERS))
def test_a_library_that_would_run_code_while_it_loads_is_refused(what, tmp_path, monkeypatch):
    from swarmfactory.backends.base import CheatError

    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path))
    with pytest.raises(CheatError, match="would run code while it loads"):
        CBackend().build(LOADERS[what], "f")
    art = CBackend().build(LOADERS[what], "f", load_checks=False)  # it does build: the ELF says it
    assert load_time_code(art.path) is not None


def test_a_plain_kernel_has_no_load_time_code(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path))
    p = load_problem("rmsnorm")
    art = CBackend().build(p.render({"threads": "omp"}), "rmsnorm", prototype=p.c_prototype)
    assert load_time_code(art.path) is None


def test_the_driver_is_bound_at_once_with_a_read_only_got():
    from swarmfactory.harness.drivertools import driver_path

    out = subprocess.run(["readelf", "-dlW", driver_path()], capture_output=True, text=True).stdout
    assert "BIND_NOW" in out and "GNU_RELRO" in out, out
    assert " PIE" in out or "Flags: NOW PIE" in out or "DYN" in out


def test_the_hostile_kernel_that_replaces_the_serve_filter_is_stopped_at_every_layer():
    """Accepted (`faster` with `isolation.seccomp: true`) by the driver before this change, with
    the static filter off: see the table in docs/architecture.md."""
    kernel = "rmsnorm/ifunc_replaces_serve_filter"
    v = evaluate(kernel, static_checks=False)
    assert v.outcome is Outcome.CHEATED and "load" in v.detail and "ifunc" in v.detail, v.detail
    v = evaluate(kernel, static_checks=False, load_checks=False)  # the resolver runs
    assert v.outcome not in CORRECT, v.detail
    assert v.outcome in (Outcome.CHEATED, Outcome.CRASHED), v.detail


def test_the_installed_filters_are_read_back_not_counted(monkeypatch):
    if not tracer.available()[1]:
        pytest.skip("the installed filters cannot be read here (no CAP_SYS_ADMIN or ptrace)")
    real = cand.expected_filters

    def other(pid, lo, hi):
        load, serve = real(pid, lo, hi)
        allow_all = struct.pack("<HBBI", 0x06, 0, 0, 0x7FFF0000)  # RET ALLOW
        return load, allow_all

    monkeypatch.setattr(cand, "expected_filters", other)
    v = evaluate("rmsnorm/good")
    assert v.outcome is Outcome.CHEATED and "filter" in v.detail, v.detail


def test_a_candidate_process_holds_exactly_the_drivers_two_filters():
    if not tracer.available()[1]:
        pytest.skip("the installed filters cannot be read here")
    v = evaluate("rmsnorm/good")
    assert v.outcome in CORRECT, v.detail
    assert "read back" in v.evidence["isolation"]["filters"], v.evidence


# -- 2. nothing tells verification from timing --------------------------------------------------
def test_verification_and_timing_see_the_same_environment(monkeypatch):
    seen = []
    real = cand.subprocess.Popen
    cand.expected_filters(os.getpid(), 0, 1)  # the driver built before the spy goes in

    from swarmfactory.harness.drivertools import driver_path

    driver = driver_path()

    def spy(argv, *a, **kw):
        if argv and argv[0] == driver and "--filters" not in argv:
            seen.append(dict(kw.get("env") or {}))
        return real(argv, *a, **kw)

    monkeypatch.setattr(cand.subprocess, "Popen", spy)
    v = evaluate("rmsnorm/good", measure_cpus=(0,), verify_cpus=(0,))
    # on a machine too busy to time it the verdict is inconclusive, but the timed rounds ran and
    # their environment is what is under test here
    assert v.outcome in CORRECT or (v.outcome is Outcome.INCONCLUSIVE and "too busy" in v.detail), v.detail
    assert len(seen) >= 2
    shapes = {tuple(sorted((k, v if k not in ("HOME", "TMPDIR") else "dir") for k, v in env.items()))
              for env in seen if env["OMP_NUM_THREADS"] == "1"}
    assert len(shapes) == 1, shapes  # one environment for every stage at the timed thread count
    assert seen[0]["OMP_NUM_THREADS"] == "1"  # verification first, as timed
    racy = [env for env in seen if env["OMP_NUM_THREADS"] != "1"]  # the race pass: two threads
    assert all(env["OMP_NUM_THREADS"] == "2" and set(env) == set(seen[0]) for env in racy), racy
    env = seen[0]
    assert not any("SWARMFACTORY" in k or "SWARMFACTORY" in v for k, v in env.items()), env
    assert "OMP_WAIT_POLICY" not in env and env["OMP_NUM_THREADS"] == "1"
    assert "swarmfactory" not in env["TMPDIR"].lower() and "sf-" not in env["TMPDIR"]


def test_a_kernel_exact_only_at_the_verification_thread_count_is_wrong():
    """A run times with one thread per measurement CPU; verification used two. Now it uses the
    timed count (and two threads again only for races, on the timed and stress shapes)."""
    v = evaluate("softmax/fast_path_at_one_thread", measure_cpus=(0,), verify_cpus=(1,) if
                 len(os.sched_getaffinity(0)) > 1 else (0,))
    assert v.outcome is Outcome.WRONG, v.detail


def test_timed_inputs_hold_special_values_and_each_set_is_mutated_from_its_own_distribution():
    from swarmfactory.harness.sampling import CandidateTimer

    p = load_problem("softmax")
    h = Harness(HarnessConfig(**BASE))
    shape = {"rows": 9, "cols": 512}
    arena = Arena(group_bytes(p, shape, 2, 2), seed=1)
    try:
        timer = CandidateTimer(h, None, arena, p, np.random.default_rng(1), 10.0)
        assert timer.timed_dists() == ("normal", "special")
        group = timer.add_group(shape, 0, 2)
        assert not np.isnan(group.copies[0]["x"]).any() and np.isinf(group.copies[1]["x"]).any()
        assert not np.isinf(group.donor(0, "x")[1]).any() and np.isinf(group.donor(1, "x")[1]).any()
    finally:
        arena.close()
        h.close()


# -- 3. floating-point state on every thread ---------------------------------------------------
@pytest.mark.parametrize("trace", [True, False], ids=["ptrace", "driver"])
def test_fp_state_left_changed_on_an_openmp_worker_is_cheated(trace):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the kernel runs one OpenMP thread")
    if trace and not tracer.available()[0]:
        pytest.skip("ptrace is not permitted here")
    v = evaluate("swiglu/ftz_left_on_worker_threads", trace=trace)
    assert v.outcome is Outcome.CHEATED and "OpenMP" in v.detail, v.detail


def test_fp_state_changed_at_load_is_compared_with_the_state_before_loading():
    v = evaluate("rmsnorm/x87_single_at_load", static_checks=False)
    assert v.outcome is Outcome.CHEATED and "load" in v.detail, v.detail  # the ELF check
    v = evaluate("rmsnorm/x87_single_at_load", static_checks=False, load_checks=False)
    assert v.outcome is Outcome.CHEATED and "x87 precision single" in v.detail, v.detail


# -- 6. every row changes before every timed call ------------------------------------------------
@pytest.mark.parametrize("name,shape", [("rmsnorm", {"rows": 4, "cols": 33}),
                                        ("rmsnorm", {"rows": 130, "cols": 576}),
                                        ("softmax", {"rows": 8, "cols": 49152}),
                                        ("q4_1_matmul", {"n": 1536, "k": 576, "batch": 8}),
                                        ("rope", {"tokens": 128, "heads": 9, "head_dim": 64})])
def test_the_driver_changes_every_row_and_the_trusted_side_replays_it(name, shape):
    p = load_problem(name)
    if not p.valid_shape(shape):
        pytest.skip(f"{shape} is not a {name} shape")
    full, rows = mutation_plan(p, shape)
    sizes = {a.name for a in p.args if a.kind == "in"}
    assert full | set(rows) == sizes
    art = CBackend().build(p.render(), name, prototype=p.c_prototype)
    arena = Arena(group_bytes(p, shape, 2, True), seed=3)
    try:
        group = SlotGroup(arena, p, shape, 0, 2, donors=p.case_inputs(Case(shape, seed=5)))
        for j in range(2):
            group.load(j, p.case_inputs(Case(shape, seed=10 + j)))
        before = {k: v.copy() for k, v in group.copies[0].items()}
        with cand.CandidateProcess(art.path, name, arena, [0], 1) as proc:
            proc.batch(0, 2, 7, 12345, 30.0, "test")
        calls = np.arange(7)
        for j in range(2):
            group.replay(j, 12345, calls[calls % 2 == j])
            assert group.changed_inputs(j) == []  # the trusted replay is exactly the driver's
        for a in p.args:
            if a.kind != "in":
                continue
            item = np.dtype(before[a.name].dtype).itemsize * a.block
            old = before[a.name].reshape(-1).view(np.uint8).reshape(-1, item)
            new = group.copies[0][a.name].reshape(-1).view(np.uint8).reshape(-1, item)
            changed = (old != new).any(axis=1)
            if a.name in full:
                assert group.arena.read(group.bufs[0][a.name]).nbytes <= FULL_REWRITE_MAX
                assert changed.mean() > 0.5, a.name  # rewritten whole (a rotation may match a few)
            else:
                per_row = changed.reshape(rows[a.name], -1).any(axis=1)
                assert per_row.all(), f"{a.name}: a row kept its values"
    finally:
        arena.close()


# -- 7. audits on trusted time, and the roofline -------------------------------------------------
def test_audits_stop_at_moments_the_trusted_clock_draws(monkeypatch):
    """Never at a call count derived from the candidate's own calibration."""
    from swarmfactory.harness import sampling

    asked = []
    real = cand.CandidateProcess.run_for

    def spy(self, first, n, seed, seconds, timeout, stage, **kw):
        asked.append((seconds, kw.get("stop_at_calls")))
        return real(self, first, n, seed, seconds, timeout, stage, **kw)

    monkeypatch.setattr(cand.CandidateProcess, "run_for", spy)
    v = evaluate("rmsnorm/good", audit=0.5)
    assert v.outcome in CORRECT, v.detail
    assert asked and all(stop is None for _, stop in asked)
    short = [s for s, _ in asked if s < 1.5e-3]   # audits: log-uniform from 20 us
    assert short and min(short) >= 19e-6
    assert sampling.PROBE_US > 0


def test_a_figure_beyond_the_roofline_is_never_the_verdict(monkeypatch):
    """It is measured again, every sample checked and half of them audits, and that figure is
    the verdict (the roofs are measured again first: measured under load they come out low)."""
    h = Harness(HarnessConfig(**BASE))
    p = load_problem("rmsnorm")
    prep = h.prepare(p, source("rmsnorm/good"))
    assert prep.rejected is None
    audited = []

    def measured(prep, audited_run=False, **kw):
        audited.append(kw.get("audited", audited_run))
        speedup = 1.5 if audited[-1] else 40.0
        evidence = {} if audited[-1] else {"beyond the measured roof": ["rows=128xcols=576"]}
        return Verdict(Outcome.FASTER, "x", "measure", speedup=speedup, ci_low=speedup * 0.9,
                       ci_high=speedup * 1.1, evidence=evidence)

    remeasured = []
    monkeypatch.setattr(h, "_measure", measured)
    monkeypatch.setattr("swarmfactory.harness.evaluate.remeasure",
                        lambda cpus, roofs, wait_s: remeasured.append(1) or roofs)
    monkeypatch.setattr(h, "roofs", lambda: {})
    v = h.measure(prep)
    h.close()
    assert audited == [False, True] and remeasured == [1]
    assert v.speedup == 1.5 and any("beyond the roofline" in f for f in v.flags), v.flags


# -- 8. build evidence quotes no file the candidate did not supply --------------------------------
def test_an_include_outside_the_system_headers_fails_the_build_without_quoting_it(tmp_path):
    secret = "sk-planted-9f1c2e"
    target = tmp_path / "secrets.txt"
    target.write_text(f"api_key = '{secret}\n#error {secret}\n")
    src = (f"#include <{target}>\n#include <stdint.h>\n"
           "void rmsnorm(const float *x, const float *w, float *y, int64_t r, int64_t c, float e) {}\n")
    h = Harness(HarnessConfig(**BASE))
    v = h.evaluate(load_problem("rmsnorm"), src)
    h.close()
    assert v.outcome is Outcome.BUILD_FAILED, v.detail
    assert "not a header of the compiler's system directories" in v.detail and "secrets.txt" in v.detail
    assert secret not in repr(v.to_dict())


def test_the_compilers_words_about_foreign_files_are_withheld():
    log = ("In file included from kernel.c:1:\n"
           "/home/u/.ssh/id_rsa:1:1: error: unknown type name 'MIIEpAIBAAKCAQEA'\n"
           "    1 | MIIEpAIBAAKCAQEA\n      | ^~~~~~~~~~~~~~~~\n"
           "kernel.c:3:5: error: 'z' undeclared\n    3 |     z = 1;\n      |     ^\n"
           "/usr/include/stdio.h:10:2: note: declared here\n   10 | int printf(const char *, ...);\n")
    out = withhold_foreign(log, ("/usr/include",))
    assert "MIIEpAIBAAKCAQEA" not in out and "/home/u/.ssh/id_rsa:1:" in out
    assert "'z' undeclared" in out and "    3 |     z = 1;" in out     # its own file: quoted
    assert "int printf" in out                                          # a system header: public
