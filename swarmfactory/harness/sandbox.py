"""The trusted worker process (our PyTorch baselines) and the requests the harness sends it.

Candidate code never runs here (see candidate.py and driver.c). A trusted worker still runs in
its own process group and session, with an environment reduced to an allow-list (no API keys or
other secrets) and resource limits; every request has a deadline. It speaks length-prefixed
pickle, which is safe only because nothing untrusted can reach its pipes. While another
contender is timed it is frozen (SIGSTOP), so its idle threads cannot spin on the same CPUs.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref

from swarmfactory import lifecycle
from swarmfactory.harness import protocol
from swarmfactory.harness.isolation import Containment
from swarmfactory.harness.outcome import Outcome, Rejected

ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
             "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "SWARMFACTORY_CACHE")
CLONE_NEWNET = 0x40000000
_LIVE: "weakref.WeakSet[Worker]" = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def kill_all() -> None:
    """Kill every live worker and candidate process (an interrupted run must not leave kernels
    spinning)."""
    from swarmfactory.harness import candidate

    with _LIVE_LOCK:
        workers = list(_LIVE)
    for w in workers:
        w.kill()
    candidate.kill_all()
    import sys

    gpu = sys.modules.get("swarmfactory.harness.gpu")  # loaded only where a GPU problem ran
    if gpu is not None:
        gpu.kill_all()


def worker_env(tmpdir: str) -> dict[str, str]:
    """The environment a user has, minus secrets: no OpenMP wait policy or thread count (the
    worker sets torch's thread count itself, to the count measured best)."""
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    env.update(HOME=tmpdir, TMPDIR=tmpdir, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    return env


atexit.register(lambda: kill_all())  # a frozen worker must not outlive the process that froze it


# Set by a process whose workers are all started from its main thread (a Ray worker): workers
# then die with it even when frozen (SIGSTOP) at the time, instead of staying stopped for ever.
# Off elsewhere: the signal follows the *thread* that started the worker, not the process.
DIE_WITH_PARENT = False
PR_SET_PDEATHSIG = 1


def _limits(mem_bytes: int, cpu_seconds: int, isolate_net: bool, fsize: int):
    die_with_parent = DIE_WITH_PARENT

    def apply():
        if die_with_parent:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if isolate_net:
            try:
                ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET)
            except Exception:
                pass  # not permitted here: the static checks still forbid sockets
    return apply


class Worker:
    """One sandboxed worker process. Not thread-safe: one request at a time."""

    def __init__(self, cpus: list[int] | None = None, mem_gb: float = 8.0, cpu_seconds: int = 600,
                 isolate_net: bool = True, trusted: bool = False):
        """``trusted``: keep HOME and TMPDIR, so torch.compile's cache persists across runs, and
        allow large files (its precompiled headers); secrets are still stripped."""
        self.tmpdir = tempfile.mkdtemp(prefix="sf-worker-")
        self.cpus = sorted(cpus) if cpus else sorted(os.sched_getaffinity(0))
        self.frozen = False
        p_in_r, p_in_w = os.pipe()
        p_out_r, p_out_w = os.pipe()
        self.log_path = os.path.join(self.tmpdir, "worker.log")
        log = open(self.log_path, "wb")
        cmd = [sys.executable, "-m", "swarmfactory.harness.worker", str(p_in_r), str(p_out_w)]
        if self.cpus != sorted(os.sched_getaffinity(0)) and shutil.which("taskset"):
            cmd = ["taskset", "-c", ",".join(map(str, self.cpus))] + cmd
        env = worker_env(self.tmpdir)
        if trusted:
            for k in ("HOME", "TMPDIR"):
                if k in os.environ:
                    env[k] = os.environ[k]
                else:
                    env.pop(k)
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmpdir,
            env=env, pass_fds=(p_in_r, p_out_w), start_new_session=True,
            preexec_fn=_limits(int(mem_gb * (1 << 30)), cpu_seconds, isolate_net,
                               (16 << 30) if trusted else (64 << 20)))
        log.close()
        os.close(p_in_r)
        os.close(p_out_w)
        self.fd_w, self.fd_r = p_in_w, p_out_r
        # a cgroup of its own where the machine allows: its CPU pressure is the contention a
        # baseline's timing suffered (swarmfactory/contention.py), and it is killed whole
        self.containment = Containment(self.tmpdir, use_cgroup=True)
        self.containment.adopt(self.proc.pid)
        cg = self.containment.cgroup
        lifecycle.adopt(self.proc.pid, "baseline worker" if trusted else "worker", str(cg) if cg else None)
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pressure_file(self) -> str | None:
        """Its cgroup's cpu.pressure (None without a cgroup of its own)."""
        cg = self.containment.cgroup
        return str(cg / "cpu.pressure") if cg is not None else None

    def freeze(self) -> None:
        """Stop the whole process while others are timed (its threads cannot spin meanwhile)."""
        if not self.frozen and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.frozen = True
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and _state(self.proc.pid) not in ("T", "Z", "X", ""):
                time.sleep(20e-6)  # the stop lands within microseconds; wait for it

    def thaw(self) -> None:
        if self.frozen:
            self.frozen = False
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def request(self, msg: dict, timeout: float, stage: str) -> dict:
        """Send ``msg``; return the reply or raise Rejected (crash / timeout / error)."""
        self.thaw()
        try:
            protocol.send(self.fd_w, msg)
        except (BrokenPipeError, OSError):
            raise self._death(stage) from None
        ready, _, _ = select.select([self.fd_r], [], [], timeout)
        if not ready:
            self.kill()
            raise Rejected(Outcome.TIMED_OUT, f"no answer within {timeout:.1f}s during {stage} "
                           f"({msg['op']}); the worker was killed", stage)
        try:
            reply = protocol.recv(self.fd_r)
        except (EOFError, OSError):
            raise self._death(stage) from None
        if "error" in reply:
            raise Rejected(Outcome.CRASHED, f"worker error during {stage}: {reply['error']}", stage)
        return reply

    def _death(self, stage: str) -> Rejected:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        tail = self.log_tail()
        if code is not None and code < 0:
            what = f"killed by signal {signal.Signals(-code).name}"
        else:
            what = f"exited with status {code} (the kernel called exit?)"
        detail = f"the worker {what} during {stage}" + (f"; its output ends: {tail}" if tail else "")
        return Rejected(Outcome.CRASHED, detail, stage, exit_code=code)

    def log_tail(self, n: int = 400) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace").strip()
        except OSError:
            return ""

    def kill(self) -> None:
        self.thaw()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.containment.cgroup is not None:  # (its token fallback would match our own TMPDIR)
            self.containment.close()
        if self.proc.returncode is not None:
            lifecycle.release(self.proc.pid)

    def close(self) -> None:
        self.thaw()
        if self.proc.poll() is None:
            try:
                protocol.send(self.fd_w, {"op": "exit"})
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for fd in (self.fd_w, self.fd_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

