"""The trusted worker process (our PyTorch baselines) and the requests the harness sends it.

Candidate code never runs here (see candidate.py and driver.c). A trusted worker still runs in
its own process group and session, with an environment reduced to an allow-list (no API keys or
other secrets) and resource limits; every request has a deadline. It speaks length-prefixed
pickle, which is safe only because nothing untrusted can reach its pipes. While another
contender is timed it is frozen (SIGSTOP), so its idle threads cannot spin on the same CPUs.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

from swarmfactory import lifecycle
from swarmfactory.harness import protocol
from swarmfactory.harness.isolation import Containment
from swarmfactory.outcome import Outcome, Rejected

ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
             "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "SWARMFACTORY_CACHE")


def worker_env(tmpdir: str) -> dict[str, str]:
    """The environment a user has, minus secrets: no OpenMP wait policy or thread count (the
    worker sets torch's thread count itself, to the count measured best)."""
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    env.update(HOME=tmpdir, TMPDIR=tmpdir, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    return env


# Set by a process whose workers are all started from its main thread (a Ray worker): workers
# then die with it even when frozen (SIGSTOP) at the time, instead of staying stopped for ever.
# Off elsewhere: the signal follows the *thread* that started the worker, not the process.
DIE_WITH_PARENT = False


def worker_limits(mem_bytes: int, cpu_seconds: int, isolate_net: bool, file_bytes: int,
                  cpus: list[int] | None = None) -> lifecycle.Limits:
    """A worker's limits (a GPU worker's too): no core dumps, a network namespace of its own
    where permitted (the static checks still forbid sockets), death with its parent where
    ``DIE_WITH_PARENT`` says so."""
    return lifecycle.Limits(mem_bytes=mem_bytes, cpu_seconds=cpu_seconds, file_bytes=file_bytes, core_bytes=0,
                            cpus=tuple(cpus) if cpus else None, own_network=isolate_net,
                            die_with_parent=DIE_WITH_PARENT)


class Worker:
    """One sandboxed worker process. Not thread-safe: one request at a time."""

    def __init__(self, cpus: list[int] | None = None, mem_gb: float = 8.0, cpu_seconds: int = 600,
                 isolate_net: bool = True, trusted: bool = False):
        """``trusted``: keep HOME and TMPDIR, so torch.compile's cache persists across runs, and
        allow large files (its precompiled headers); secrets are still stripped."""
        self.tmpdir = lifecycle.temp_dir("sf-worker-")
        self.cpus = sorted(cpus) if cpus else sorted(os.sched_getaffinity(0))
        p_in_r, p_in_w = os.pipe()
        p_out_r, p_out_w = os.pipe()
        env = worker_env(self.tmpdir)
        if trusted:
            for k in ("HOME", "TMPDIR"):
                if k in os.environ:
                    env[k] = os.environ[k]
                else:
                    env.pop(k)
        # a cgroup of its own where the machine allows: its CPU pressure is the contention a
        # baseline's timing suffered (swarmfactory/contention.py), and it is killed whole; no
        # token fallback (a trusted worker keeps our own TMPDIR: no token tells it from us)
        self.containment = Containment(None, use_cgroup=True)
        self.proc = lifecycle.Child(
            [sys.executable, "-m", "swarmfactory.harness.worker", str(p_in_r), str(p_out_w)],
            "baseline worker" if trusted else "worker", env=env, cwd=self.tmpdir,
            limits=worker_limits(int(mem_gb * (1 << 30)), cpu_seconds, isolate_net,
                                 (16 << 30) if trusted else (64 << 20), self.cpus),
            log=os.path.join(self.tmpdir, "worker.log"), pass_fds=(p_in_r, p_out_w), containment=self.containment)
        os.close(p_in_r)
        os.close(p_out_w)
        self.fd_w, self.fd_r = p_in_w, p_out_r

    @property
    def pressure_file(self) -> str | None:
        """Its cgroup's cpu.pressure (None without a cgroup of its own)."""
        cg = self.containment.cgroup
        return str(cg / "cpu.pressure") if cg is not None else None

    def freeze(self) -> None:
        """Stop the whole process while others are timed (its threads cannot spin meanwhile)."""
        self.proc.freeze()

    def thaw(self) -> None:
        self.proc.thaw()

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
        return self.proc.log_tail(n)

    def kill(self) -> None:
        self.proc.close(timeout=10)

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
        lifecycle.remove_dir(self.tmpdir)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

