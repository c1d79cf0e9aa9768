"""The sandbox's layers, each proved on its own (issue 10: "a text filter is a hint, the OS is the
protection").

* The OS layer alone: hostile kernels that start threads or processes, open files, write to
  /proc, renice the baseline or forge replies, run with the static filter switched off, never get
  a correct verdict (`faster` / `not_faster`): the system-call allow-list stops them (`cheated`,
  naming the call) or their process dies (`crashed`).
* Containment alone: with the allow-list also off, a daemon that double-forks and calls setsid()
  (leaving the driver's process group and session) is found and killed, by the cgroup where the
  machine allows one and by the environment token otherwise.
* The reply channel: a forged reply (a pickle, a well-formed record followed by a self-stop, a
  flood) neither runs code in the coordinator nor turns into a verdict the kernel did not earn.
* The baseline: the candidate's process is frozen, every thread of it, while a baseline is timed,
  and the baseline workers run in a user's default environment.

Known holes are marked xfail through known_holes.py (see conftest.py).
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import time
import uuid
from pathlib import Path

import pytest

from swarmfactory.harness import isolation
from swarmfactory.harness.evaluate import Harness, HarnessConfig
from swarmfactory.outcome import Outcome
from swarmfactory.problems import load_problem

HERE = Path(__file__).parent
CORRECT = {Outcome.FASTER, Outcome.NOT_FASTER}
BASE = dict(rounds=8, compile_baselines=False, case_timeout_s=5.0)


def source(kernel: str) -> str:
    return (HERE / f"{kernel}.c").read_text()


@pytest.fixture(scope="module")
def filterless():
    """The allow-list and containment as shipped; no text, preprocessor or assembly filter, and
    the built library's load-time code not refused (test_sandbox_v3.py proves that check)."""
    h = Harness(HarnessConfig(static_checks=False, load_checks=False, **BASE))
    yield h
    h.close()


@pytest.fixture(scope="module")
def unsandboxed():
    """Neither filter nor allow-list: only containment stands."""
    h = Harness(HarnessConfig(static_checks=False, load_checks=False, seccomp=False, **BASE))
    yield h
    h.close()


# -- the OS layer alone -------------------------------------------------------------------------
# kernel -> the system calls the verdict may name (None: any rejection will do)
OS_LAYER = {
    "rmsnorm/daemon_raw_syscall": {"fork"},                    # raw `syscall` instruction
    "rmsnorm/macro_hidden_constructor": {"clone", "fork"},     # at load time, under the load filter
    "q4_1_matmul/clone_prefetch_thread": {"clone"},            # glibc's __clone
    "q4_1_matmul/ifunc_patches_coordinator": {"openat", "open"},  # /proc/<ppid>/mem for writing, at load
    "attention_decode/writes_proc_self_mem": {"openat", "open"},
    "rmsnorm/opens_file": {"openat", "open"},
    "rope/renices_the_baseline": {"setpriority"},
    "rmsnorm/pasted_thread_name": {"clone3", "clone"},
    "rmsnorm/spawns_thread": {"clone3", "clone"},
    "softmax/dlsym_thread_finishes_later": {"clone3", "clone"},
    "softmax/blocks_sigsys_then_forks": {"clone", "fork"},
    "rmsnorm/forged_reply_pickle": None,      # None: any rejection (here a stale descriptor)
    "softmax/forged_reply_self_stop": None,
    "rmsnorm/forged_pickle_on_reply_fd": None,   # a malformed reply: crashed
    "softmax/forged_reply_on_reply_fd": None,    # a well-formed reply, then a self-stop: wrong
}
_VERDICTS: dict[str, object] = {}


def os_layer_verdict(harness, kernel: str):
    if kernel not in _VERDICTS:
        _VERDICTS[kernel] = harness.evaluate(load_problem(kernel.split("/")[0]), source(kernel))
    return _VERDICTS[kernel]


@pytest.mark.parametrize("kernel", sorted(OS_LAYER), ids=lambda k: f"os-layer:{k}")
def test_the_os_layer_alone_never_lets_a_hostile_kernel_through(kernel, filterless):
    v = os_layer_verdict(filterless, kernel)
    assert v.outcome not in CORRECT, f"{kernel}: {v.outcome.value}: {v.detail}"
    assert v.outcome in (Outcome.CHEATED, Outcome.CRASHED, Outcome.WRONG), v.detail
    assert "static check" not in v.detail, "the filter was meant to be off"
    if v.outcome is Outcome.CHEATED and "system call" in v.detail:
        assert v.evidence.get("syscall"), v.detail


NAMED = sorted(k for k, calls in OS_LAYER.items() if calls)


@pytest.mark.parametrize("kernel", NAMED, ids=lambda k: f"names-call:{k}")
def test_the_os_layer_names_the_forbidden_call(kernel, filterless):
    v = os_layer_verdict(filterless, kernel)
    assert v.outcome is Outcome.CHEATED, f"{v.outcome.value}: {v.detail}"
    assert v.evidence.get("syscall") in OS_LAYER[kernel], v.detail


LOAD_TIME = ["rmsnorm/macro_hidden_constructor", "q4_1_matmul/ifunc_patches_coordinator"]


@pytest.mark.parametrize("kernel", LOAD_TIME, ids=lambda k: f"isolation-recorded:{k}")
def test_a_rejection_at_load_time_records_the_isolation_in_force(kernel, filterless):
    v = os_layer_verdict(filterless, kernel)
    assert v.outcome is Outcome.CHEATED and v.stage == "load", v.detail
    assert (v.evidence.get("isolation") or {}).get("seccomp") is True, v.evidence


# -- containment alone --------------------------------------------------------------------------
DAEMON = r"""
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
extern char **environ;
#define PIDFILE "@PIDFILE@"
#define SCRUB_ENV @SCRUB@
#define LEAVE_CGROUP @LEAVE@

static void leave_cgroup(void) {            /* root may move itself to the hierarchy's root */
    char line[1024], mount[512] = "";
    FILE *f = fopen("/proc/self/mountinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, " - cgroup2 ")) { sscanf(line, "%*s %*s %*s %*s %511s", mount); break; }
    if (f) fclose(f);
    if (!*mount) return;
    char path[600];
    snprintf(path, sizeof path, "%s/cgroup.procs", mount);
    FILE *p = fopen(path, "w");
    if (p) { fprintf(p, "%d\n", getpid()); fclose(p); }
}

static void daemonise(void) {
    pid_t a = fork();
    if (a < 0) return;
    if (a > 0) { waitpid(a, 0, 0); return; }
    setsid();                               /* out of the driver's process group and session */
    if (fork() != 0) _exit(0);
    FILE *f = fopen(PIDFILE, "w");
    if (f) { fprintf(f, "%d\n", getpid()); fclose(f); }
    if (SCRUB_ENV) for (char **e = environ; *e; e++) memset(*e, 'x', strlen(*e));
    if (LEAVE_CGROUP) leave_cgroup();
    for (int i = 0; i < 2000; i++) { struct timespec t = {0, 10000000}; nanosleep(&t, 0); }  /* 20 s */
    _exit(0);
}

void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    static int started;
    if (!started) { started = 1; daemonise(); }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
}
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _run_daemon(harness, tmp_path, scrub: bool = False, leave_cgroup: bool = False):
    pidfile = tmp_path / f"daemon-{uuid.uuid4().hex[:8]}.pid"
    src = (DAEMON.replace("@PIDFILE@", str(pidfile)).replace("@SCRUB@", "1" if scrub else "0")
           .replace("@LEAVE@", "1" if leave_cgroup else "0"))
    verdict = harness.evaluate(load_problem("rmsnorm"), src, measure=False)
    pid = None
    for _ in range(50):
        if pidfile.exists() and pidfile.read_text().strip():
            pid = int(pidfile.read_text())
            break
        time.sleep(0.1)
    return verdict, pid


def _reap(pid: int | None) -> bool:
    """Was the daemon already dead? (Kills it if not: it is this test's own.)"""
    if pid is None or not _alive(pid):
        return True
    os.kill(pid, signal.SIGKILL)
    return False


@pytest.fixture
def token_only():
    """The environment-token fallback, as on a machine without a writable cgroup hierarchy."""
    old = os.environ.get("SWARMFACTORY_NO_CGROUP")
    os.environ["SWARMFACTORY_NO_CGROUP"] = "1"
    isolation.cgroup_root.cache_clear()
    yield
    if old is None:
        os.environ.pop("SWARMFACTORY_NO_CGROUP", None)
    else:
        os.environ["SWARMFACTORY_NO_CGROUP"] = old
    isolation.cgroup_root.cache_clear()


def _assert_found_and_killed(verdict, pid, mechanism: str):
    dead = _reap(pid)
    assert pid is not None, "the daemon never started (was the allow-list off?)"
    assert verdict.outcome is Outcome.CHEATED, f"{verdict.outcome.value}: {verdict.detail}"
    assert re.search(r"left \d+ process", verdict.detail), verdict.detail
    assert f"found by {mechanism}" in verdict.detail, verdict.detail
    assert verdict.evidence["isolation"]["containment"] == mechanism
    assert dead, f"daemon {pid} outlived the evaluation"


def test_a_daemon_that_leaves_the_session_is_found_by_the_cgroup(unsandboxed, tmp_path):
    isolation.cgroup_root.cache_clear()
    if isolation.cgroup_root() is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    verdict, pid = _run_daemon(unsandboxed, tmp_path)
    _assert_found_and_killed(verdict, pid, "cgroup")


def test_a_daemon_that_leaves_the_session_is_found_by_the_token(unsandboxed, tmp_path, token_only):
    verdict, pid = _run_daemon(unsandboxed, tmp_path)
    _assert_found_and_killed(verdict, pid, "token")


def test_a_daemon_that_scrubs_its_environment_is_found_without_a_cgroup(unsandboxed, tmp_path, token_only):
    verdict, pid = _run_daemon(unsandboxed, tmp_path, scrub=True)
    _assert_found_and_killed(verdict, pid, "token")


def test_a_daemon_that_moves_itself_out_of_the_cgroup_is_found(unsandboxed, tmp_path):
    isolation.cgroup_root.cache_clear()
    if isolation.cgroup_root() is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    if os.geteuid() != 0:
        pytest.skip("only a privileged candidate can write to the parent cgroup")
    verdict, pid = _run_daemon(unsandboxed, tmp_path, leave_cgroup=True)
    _assert_found_and_killed(verdict, pid, "cgroup")


LEAK = '''
import json, sys
from swarmfactory.harness.evaluate import Harness, HarnessConfig
from swarmfactory.problems import load_problem
h = Harness(HarnessConfig(rounds=8, compile_baselines=False, case_timeout_s=5.0, static_checks=False,
                          load_checks=False))  # the load-time code runs: only the sandbox stands
v = h.evaluate(load_problem("swiglu"), open(sys.argv[1]).read(), measure=False)
print(json.dumps({"outcome": v.outcome.value, "detail": v.detail, "evidence": repr(v.evidence)}))
h.close()
'''


def test_load_time_code_cannot_read_the_coordinators_secrets():
    """The coordinator's environment (API keys) must not reach a verdict, whatever the
    candidate reads while its library loads."""
    if isolation.landlock_abi() < 1:
        pytest.skip("this kernel has no Landlock: load-time code can read files here, and only "
                    "plainly written secrets are redacted from verdicts")
    import json
    import subprocess
    import sys

    secret = f"sk-planted-{uuid.uuid4().hex}"
    env = {**os.environ, "SWARMFACTORY_PLANTED_API_KEY": secret}
    out = subprocess.run([sys.executable, "-c", LEAK, str(HERE / "swiglu/ifunc_leaks_coordinator_env.c")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    v = json.loads(out.stdout.strip().splitlines()[-1])
    assert secret not in out.stdout, f"the coordinator's secret reached the verdict: {v['detail']}"
    assert secret.encode().hex() not in out.stdout, f"the secret reached the verdict, encoded: {v['detail']}"
    assert v["outcome"] in ("cheated", "crashed"), v  # it crashes itself once it has written


# -- the reply channel --------------------------------------------------------------------------
MARKER = Path("/tmp/swarmfactory-pwned-forged-reply")


@pytest.fixture
def pickle_spy(monkeypatch):
    """Every pickle the coordinator loads while the test runs."""
    seen: list[bytes] = []
    real_loads = pickle.loads

    def loads(data, *a, **kw):
        seen.append(bytes(data))
        return real_loads(data, *a, **kw)

    monkeypatch.setattr(pickle, "loads", loads)
    return seen


@pytest.mark.parametrize("static", [True, False], ids=["filter-on", "filter-off"])
@pytest.mark.parametrize("kernel", ["rmsnorm/forged_pickle_on_reply_fd", "rmsnorm/forged_reply_pickle"])
def test_a_forged_pickle_reply_runs_no_code_in_the_coordinator(kernel, static, harness, filterless, pickle_spy):
    MARKER.unlink(missing_ok=True)
    h = harness if static else filterless
    v = h.evaluate(load_problem("rmsnorm"), source(kernel))
    time.sleep(0.2)
    assert not MARKER.exists(), "the forged pickle ran in the coordinator"
    assert not any(b"swarmfactory-pwned" in d for d in pickle_spy), "the forged pickle was unpickled"
    assert v.outcome not in CORRECT, v.detail
    if kernel.endswith("on_reply_fd"):  # it reached the reply pipe
        assert v.outcome is Outcome.CRASHED and "malformed reply" in v.detail, f"{v.outcome.value}: {v.detail}"


@pytest.mark.parametrize("static", [True, False], ids=["filter-on", "filter-off"])
@pytest.mark.parametrize("kernel", ["softmax/forged_reply_on_reply_fd", "softmax/forged_reply_self_stop"])
def test_a_forged_well_formed_reply_does_not_become_the_verdict(kernel, static, harness, filterless):
    h = harness if static else filterless
    v = h.evaluate(load_problem("softmax"), source(kernel))
    assert v.outcome not in CORRECT, v.detail
    if kernel.endswith("on_reply_fd"):  # the forged record was read; the outputs were not there
        assert v.outcome is Outcome.WRONG, f"{v.outcome.value}: {v.detail}"


FLOOD = r"""
#include <stdint.h>
#include <string.h>
extern long __write(int fd, const void *buf, unsigned long n);
#define REPLY_FD 4                              /* the driver's fixed reply descriptor */
void swiglu(const float *gate, const float *up, float *y, int64_t n) {
    static char junk[1 << 20];
    memset(junk, 0x50, sizeof junk);
    __write(REPLY_FD, junk, sizeof junk);       /* more than the pipe holds: blocks */
    for (int64_t i = 0; i < n; i++) y[i] = 0.0f;
}
"""


def test_a_flooded_reply_pipe_is_a_failure_not_an_exception(harness):
    t0 = time.monotonic()
    v = harness.evaluate(load_problem("swiglu"), FLOOD)
    assert v.outcome in (Outcome.TIMED_OUT, Outcome.CRASHED), f"{v.outcome.value}: {v.detail}"
    assert time.monotonic() - t0 < 60


# -- the baseline -------------------------------------------------------------------------------
OMP_RMSNORM = r"""
#include <stdint.h>
#include <math.h>
void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = xr[c] * inv * w[c];
    }
}
"""


def _task_states(pid: int) -> dict[int, str]:
    states = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states[int(task.name)] = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
    return states


def test_every_candidate_thread_is_frozen_while_the_baseline_is_timed(harness, monkeypatch):
    from swarmfactory import lifecycle
    from swarmfactory.harness import rounds

    seen: list[dict[int, str]] = []
    real = rounds.sample

    def spy(worker, *args, **kwargs):
        for proc in lifecycle.children():
            if proc.what == "candidate driver" and proc.status is None:
                seen.append(_task_states(proc.pid))
        return real(worker, *args, **kwargs)

    monkeypatch.setattr(rounds, "sample", spy)
    v = harness.evaluate(load_problem("rmsnorm"), OMP_RMSNORM)
    # correct; on a machine busy with other work the rounds may give no figure, but every baseline
    # sample was still taken (and watched) with the candidate's threads there to be frozen
    assert v.outcome in CORRECT or (v.outcome.value == "inconclusive" and "too busy" in v.detail), v.detail
    assert seen, "no baseline sample was taken while a candidate process was alive"
    assert any(len(s) > 1 for s in seen), "the OpenMP pool should be there to freeze"
    running = [s for s in seen if set(s.values()) - {"T", "t"}]
    assert not running, f"candidate threads ran while the baseline was timed: {running[:3]}"


def test_baseline_workers_run_in_the_default_environment(tmp_path):
    from swarmfactory.harness.sandbox import worker_env

    env = worker_env(str(tmp_path))
    assert not {k for k in env if k.startswith(("OMP_", "GOMP_", "KMP_", "MKL_"))}, env
