"""The candidate's process, seen from the trusted side.

``CandidateProcess`` starts the C driver (driver.c) on a shared ``Arena`` and talks to it in
fixed-size binary records: 64-byte commands in, 32-byte replies out, parsed strictly and read
with a bound on size and time. Nothing it sends is executable or trusted: a reply only says
"done" (and the floating-point control state); every output, input and guard zone is checked
here against the trusted side's own copies.

Time is the trusted side's too. The driver stops itself (SIGSTOP) after each reply; a command
runs from the SIGCONT sent here to the moment the kernel reports the process stopped, so a
forged early reply cannot shorten it, and nothing the candidate leaves running can overlap the
baseline's timing (the whole process is frozen). Long timing samples end asynchronously: the
trusted side stops the process at a random moment the candidate cannot anticipate, and checks
the call counter against the inputs' replayed mutations.
"""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from swarmfactory import lifecycle
from swarmfactory.harness import tracer
from swarmfactory.harness.arena import Arena
from swarmfactory.harness.drivertools import driver_path, syscall_names
from swarmfactory.harness.isolation import Containment, seccomp_state
from swarmfactory.outcome import Outcome, Rejected

CMD = struct.Struct("<IIIIQQII24x")
REPLY = struct.Struct("<IIIIQQ")
MAGIC_CMD, MAGIC_REPLY = 0x53464344, 0x53465250
OP_CALL, OP_BATCH, OP_EXIT, OP_FP = 1, 2, 3, 4
ST_OK, ST_BAD_COMMAND, ST_LOAD_FAILED, ST_NO_SYMBOL, ST_READY, ST_BAD_SLOT = range(6)
EXIT_FORBIDDEN = 159
UNBOUNDED = (1 << 64) - 1
ENV_ALLOW = ("PATH", "LANG", "LC_ALL")
M_MUTATE = 1
@dataclass(frozen=True)
class Reply:
    status: int
    fp_before: int
    fp_after: int
    calls: int
    seccomp: int


# -- the process ------------------------------------------------------------------------------------
class _Watchdog:
    """Kills the process group when a deadline passes (one thread per process, re-armed)."""

    def __init__(self, kill):
        self.kill, self.deadline, self.fired, self.closed = kill, None, False, False
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True, name="sf-watchdog")
        self.thread.start()

    def arm(self, seconds: float) -> None:
        with self.cv:
            self.deadline = time.monotonic() + seconds
            self.cv.notify()

    def disarm(self) -> None:
        with self.cv:
            self.deadline = None

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()

    def _run(self) -> None:
        with self.cv:
            while not self.closed:
                if self.deadline is None:
                    self.cv.wait()
                    continue
                left = self.deadline - time.monotonic()
                if left <= 0:
                    self.fired, self.deadline = True, None
                    self.kill()
                else:
                    self.cv.wait(left)


class CandidateProcess:
    """One candidate library loaded in a fresh, locked-down driver process. One request at a time."""

    def __init__(self, library: str, symbol: str, arena: Arena, cpus: list[int], threads: int,
                 mem_gb: float = 8.0, cpu_seconds: int = 600, seccomp: bool = True,
                 contain: bool = True, load_timeout: float = 30.0, trace: bool = True):
        """The environment is the same whatever the stage (verification or timing) and names
        nothing of the harness: the variables a user's process has (PATH, LANG), a private
        temporary directory as HOME and TMPDIR, and the OpenMP thread count. ``trace``: the
        trusted side reads every thread's floating-point control state and the installed
        filters itself (ptrace) where this machine allows it."""
        self.arena, self.symbol = arena, symbol
        self.tmpdir = lifecycle.temp_dir("tmp")  # mkdtemp's own prefix: the name gives nothing away
        self.log_path = os.path.join(self.tmpdir, "driver.log")
        self.containment = Containment(self.tmpdir, use_cgroup=contain)
        self.trace = trace and tracer.available()[0]
        self.fp_threads: dict[int, int] = {}
        self.stage = "load"
        cmd_r, self.cmd_w = os.pipe()
        self.reply_r, reply_w = os.pipe()
        os.set_blocking(self.reply_r, False)
        env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
        env.update(HOME=self.tmpdir, TMPDIR=self.tmpdir, OMP_NUM_THREADS=str(threads),
                   OMP_THREAD_LIMIT=str(threads))
        argv = [driver_path(), str(cmd_r), str(reply_w), str(arena.fd), str(arena.size), str(threads),
                "1" if seccomp else "0", os.path.abspath(library), symbol]
        # a stopped driver dies with the thread that started it, besides the guard
        limits = lifecycle.Limits(mem_bytes=int(mem_gb * (1 << 30)), cpu_seconds=cpu_seconds, file_bytes=16 << 20,
                                  core_bytes=0, cpus=tuple(cpus), own_network=True, die_with_parent=True)
        self.proc = lifecycle.Child(argv, "candidate driver", env=env, cwd=self.tmpdir, limits=limits,
                                    log=self.log_path, pass_fds=(cmd_r, reply_w, arena.fd),
                                    containment=self.containment, ledger=False)
        os.close(cmd_r)
        os.close(reply_w)
        self.pid = self.proc.pid
        self.watchdog = _Watchdog(self.proc.kill)
        self.isolation = {"seccomp": False, "containment": "process group"}
        try:
            self._start(seccomp, load_timeout)
        except Rejected as rej:
            rej.evidence.setdefault("isolation", dict(self.isolation))
            self.close()
            raise
        except BaseException:
            self.close()
            raise

    def _start(self, seccomp: bool, load_timeout: float) -> None:
        symbol = self.symbol
        # 1. READY: stopped before any candidate code ran, already locked for loading
        self._wait(load_timeout, "load")
        ready = self._take_reply("load")
        if ready.status != ST_READY:
            raise Rejected(Outcome.CRASHED, f"the driver did not start (status {ready.status})", "load")
        mode, filters = seccomp_state(self.pid)
        self.isolation = {"seccomp": mode == 2 and filters >= 1, "containment": self.containment.mechanism,
                          "network": "own namespace" if _own_netns(self.pid) else "shared",
                          # from the driver itself, before any candidate code ran
                          "files": "landlock" if ready.seccomp & 4 else "unrestricted",
                          "clock": "time-stamp counter faults" if ready.seccomp & 8 else "readable"}
        if seccomp and not self.isolation["seccomp"]:
            self.isolation["seccomp_error"] = self.log_tail()
        self.fp_state = ready.fp_before
        self.image = (ready.calls >> 32, ready.calls & 0xFFFFFFFF)
        if self.trace:  # every thread's state before the library loads: the baseline
            self.fp_threads = tracer.fp_states(self.pid)
        self.isolation["fp_state"] = (f"read by the trusted side on {len(self.fp_threads)} threads"
                                      if self.trace else "reported by the driver (ptrace unavailable)")
        # 2. load the library (no code of it may run: the build refuses load-time code), then
        # the serve filter
        os.kill(self.pid, signal.SIGCONT)
        self._wait(load_timeout, "load")
        loaded = self._take_reply("load")
        if loaded.status == ST_LOAD_FAILED:
            raise Rejected(Outcome.BUILD_FAILED, f"cannot load the library: {self.log_tail()}", "load")
        if loaded.status == ST_NO_SYMBOL:
            raise Rejected(Outcome.BUILD_FAILED, f"the library does not export `{symbol}`", "load")
        if loaded.status != ST_OK:
            raise Rejected(Outcome.CRASHED, f"the driver failed to load the library (status {loaded.status})", "load")
        if seccomp:
            mode, filters = seccomp_state(self.pid)
            self.isolation["seccomp"] = mode == 2 and filters >= 2
            self._check_filters()
        self._check_fp(loaded, "load")
        self.threads = self.containment.threads(self.pid)

    def _check_filters(self) -> None:
        """The filters the kernel holds for every thread must be exactly the driver's two
        programs, rebuilt here by a trusted run of the driver: a library that replaced one, or
        kept the serve filter from being installed, is `cheated` whatever the count says."""
        if not tracer.available()[1]:
            self.isolation["filters"] = "counted (the installed programs cannot be read here)"
            return
        expected = expected_filters(self.pid, *self.image)
        try:
            found = tracer.filters(self.pid)
        except tracer.TraceError as exc:
            self.isolation["filters"] = f"counted (reading them failed: {exc.strerror})"
            return
        for tid, progs in found.items():
            if progs != [expected[0], expected[1]]:  # oldest first
                self.kill()
                what = "no filter" if not progs else f"{len(progs)} filter(s) differing from the driver's"
                raise Rejected(Outcome.CHEATED, f"thread {tid} of the candidate's process holds {what} "
                               "after the library loaded (its system-call filter was replaced or never "
                               "installed)", "load", syscall="seccomp")
        self.isolation["filters"] = f"read back: both programs on {len(found)} threads"

    # -- protocol ---------------------------------------------------------------------------------
    def _send(self, op, first, n, iters, seed, mutate, magic=MAGIC_CMD) -> None:
        data = CMD.pack(magic, op, first, n, iters, seed, mutate, 0)
        try:
            os.write(self.cmd_w, data)  # 64 bytes: atomic on a pipe
        except OSError:
            raise self._death(self.stage) from None

    def _wait(self, timeout: float, stage: str) -> None:
        """Block until the process is stopped again; raise Rejected if it died or ran out of time."""
        self.watchdog.arm(timeout)
        try:
            stopped = self.proc.wait_stop()
        finally:
            self.watchdog.disarm()
        if not stopped:
            raise self._death(stage)

    def _take_reply(self, stage: str, allow: set[int] | None = None) -> Reply:
        try:
            data = os.read(self.reply_r, 4096)
        except BlockingIOError:
            data = b""
        except OSError:
            data = b""
        if len(data) != REPLY.size:
            self.kill()
            what = "no reply" if not data else f"a malformed reply of {len(data)} bytes"
            raise Rejected(Outcome.CRASHED, f"the candidate's process stopped with {what} during "
                           f"{stage} (it must not write to the harness's pipe)", stage)
        magic, status, fp_before, fp_after, calls, seccomp = REPLY.unpack(data)
        if magic != MAGIC_REPLY or status > ST_BAD_SLOT or (allow is not None and status not in allow):
            self.kill()
            raise Rejected(Outcome.CRASHED, f"the candidate's process sent a malformed reply during "
                           f"{stage} (magic {magic:#x}, status {status})", stage)
        return Reply(status, fp_before, fp_after, calls, seccomp)

    def _exchange(self, op, first, n, iters, seed, mutate, timeout, stage, deep: bool = True) -> tuple[Reply, int]:
        self.stage = stage
        self._send(op, first, n, iters, seed, mutate)
        t0 = time.perf_counter_ns()
        os.kill(self.pid, signal.SIGCONT)
        self._wait(timeout, stage)
        elapsed = time.perf_counter_ns() - t0
        reply = self._take_reply(stage)
        if reply.status != ST_OK:
            self.kill()
            raise Rejected(Outcome.CRASHED, f"the driver refused a command during {stage} (status "
                           f"{reply.status}: the candidate corrupted its memory?)", stage)
        self._check_fp(reply, stage, deep)
        return reply, elapsed

    def _check_fp(self, reply: Reply, stage: str, deep: bool = True) -> None:
        """Every thread's control state must be what it was before the library loaded: as the
        driver reports it for the calling thread after every call, and (``deep``) read on every
        thread (see ``check_threads``)."""
        if reply.fp_after != reply.fp_before:
            self._fp_changed(reply.fp_before, reply.fp_after, "", stage)
        if deep:
            self.check_threads(stage)

    def check_threads(self, stage: str) -> None:
        """Every thread's control state against its state before the library loaded: read by the
        trusted side itself (ptrace) where it can, else as the driver reports it for every thread
        of its pool, in a command of its own (a parallel region inside a timed command would cost
        the candidate a wake-up). The process must be stopped between commands."""
        if self.trace:
            try:
                now = tracer.fp_states(self.pid)
            except tracer.TraceError:
                now = None  # attaching failed this time: the driver's own report instead
            for tid, state in (now or {}).items():
                base = self.fp_threads.get(tid, self.fp_state)
                if state != base:
                    who = f"{tid} (the main thread)" if tid == self.pid else f"{tid} (an OpenMP worker)"
                    self._fp_changed(base, state, f" on thread {who}", stage)
            if now is not None:
                return
        if stage != "load":
            self._send(OP_FP, 0, 1, 0, 0, 0)
            os.kill(self.pid, signal.SIGCONT)
            self._wait(30.0, stage)
            pool = self._take_reply(stage)
            if pool.fp_after != pool.fp_before:
                self._fp_changed(pool.fp_before, pool.fp_after, " on an OpenMP thread", stage)

    def _fp_changed(self, before: int, after: int, where: str, stage: str) -> None:
        self.kill()
        raise Rejected(Outcome.CHEATED, f"the kernel changed the floating-point control state{where} "
                       f"({_fp_text(before)} -> {_fp_text(after)}) and left it "
                       "changed: a kernel must leave its caller's rounding and denormal modes as "
                       "it found them, on every thread it uses", stage)

    # -- requests ---------------------------------------------------------------------------------
    def call(self, slot: int, timeout: float, stage: str, deep: bool = True) -> Reply:
        """One call; ``deep``: every thread's floating-point state read afterwards (else the
        calling thread's only, as the driver reports it)."""
        return self._exchange(OP_CALL, slot, 1, 1, 0, 0, timeout, stage, deep)[0]

    def batch(self, first: int, n: int, iters: int, seed: int, timeout: float, stage: str) -> int:
        """``iters`` calls rotating over slots first..first+n-1, inputs mutated before each; the
        trusted side's nanoseconds for all of it."""
        reply, elapsed = self._exchange(OP_BATCH, first, n, iters, seed, M_MUTATE, timeout, stage)
        if reply.calls != iters:
            self.kill()
            raise Rejected(Outcome.CRASHED, f"the driver made {reply.calls} calls of {iters}", stage)
        return elapsed

    def run_for(self, first: int, n: int, seed: int, seconds: float, timeout: float, stage: str,
                min_calls: int = 1, stop_at_calls: int | None = None, probe=None,
                probe_every: float = 1e-4) -> tuple[int, int]:
        """Calls rotating over the slots until stopped from here after ``seconds`` or, with
        ``stop_at_calls``, as soon as the driver's counter reaches it (the trusted side watches
        the counter; at most ``seconds`` even so); returns (calls the driver counted, trusted
        nanoseconds). Where fewer than ``min_calls`` were made (a busy machine gave the process no
        CPU), it is continued for further windows and their times add up. ``probe`` is called
        every ``probe_every`` seconds while it runs (the trusted side's writes into its inputs).
        The process is left stopped mid-loop: check what it produced, then ``halt``."""
        self.stage = stage
        self.arena.reset_header()
        self._send(OP_BATCH, first, n, UNBOUNDED, seed, M_MUTATE)
        total, give_up = 0, time.monotonic() + timeout
        while True:
            t0 = time.perf_counter_ns()
            os.kill(self.pid, signal.SIGCONT)
            self._watch(stop_at_calls, t0 + int(seconds * 1e9), probe, int(probe_every * 1e9))
            try:
                os.kill(self.pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
            self._wait(timeout, stage)
            total += time.perf_counter_ns() - t0
            calls = self.arena.counter
            if calls >= min_calls or time.monotonic() > give_up:
                return calls, total

    def _watch(self, target: int | None, until_ns: int, probe, every_ns: int) -> None:
        """Until ``until_ns`` (or the call counter reaching ``target``), calling ``probe`` every
        ``every_ns``. Watching the counter spins (from this side's CPUs); otherwise it sleeps."""
        counter = self.arena.counter_view()
        next_probe = time.perf_counter_ns() + every_ns
        spins = 0
        while True:
            now = time.perf_counter_ns()
            if now >= until_ns or (target is not None and counter[0] >= target):
                return
            if probe is not None and now >= next_probe:
                probe()
                next_probe = now + every_ns
            if target is None:
                wake = min(until_ns, next_probe if probe is not None else until_ns)
                time.sleep(max(0.0, (wake - now) * 1e-9))
            else:
                spins += 1
                if spins & 255 == 0:
                    time.sleep(0)  # yield, should this share a CPU with the candidate

    def halt(self, timeout: float, stage: str) -> None:
        """End a ``run_for`` loop: the driver finishes its call, replies and stops."""
        self.arena.set_halt()
        os.kill(self.pid, signal.SIGCONT)
        self._wait(timeout, stage)
        reply = self._take_reply(stage)
        self._check_fp(reply, stage)

    # -- the end ----------------------------------------------------------------------------------
    def strays(self) -> list[int]:
        return self.containment.strays() if self.proc.poll() is None else self.containment.members()

    def check_contained(self, stage: str) -> None:
        """Before a verdict: nothing but the driver (and its pool threads) may be alive."""
        strays = [p for p in self.containment.members() if p != self.pid]
        if strays:
            detail = ", ".join(f"{p} ({_comm(p)})" for p in strays[:5])
            self.kill()
            raise Rejected(Outcome.CHEATED, f"the candidate left {len(strays)} process(es) running "
                           f"outside the call: {detail}; all were killed "
                           f"(found by {self.containment.mechanism})", stage)
        now = self.containment.threads(self.pid)
        if now is not None and self.threads is not None and now > self.threads:
            raise Rejected(Outcome.CHEATED, f"the candidate's process has {now} threads, "
                           f"{self.threads} after loading: it started threads of its own", stage)

    def kill(self) -> None:
        """SIGKILL to its process group, to itself and to its containment's members (cgroup or
        token); never waits (the watchdog calls it too)."""
        self.proc.kill()

    def close(self) -> None:
        self.watchdog.close()
        self.proc.close()
        for fd in (self.cmd_w, self.reply_r):
            try:
                os.close(fd)
            except OSError:
                pass
        lifecycle.remove_dir(self.tmpdir)

    def log_tail(self, n: int = 600) -> str:
        """The end of what the process wrote, with the coordinator's secrets redacted (defence in
        depth: the sandbox already keeps it from reading them)."""
        return redact(self.proc.log_tail(n))

    def _death(self, stage: str) -> Rejected:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        st, tail = self.proc.status, self.log_tail()
        if self.watchdog.fired:
            return Rejected(Outcome.TIMED_OUT, f"no answer in time during {stage}; the process was killed", stage)
        if os.WIFEXITED(st) and os.WEXITSTATUS(st) == EXIT_FORBIDDEN and "time-stamp counter" in tail:
            return Rejected(Outcome.CHEATED, f"the kernel read the time-stamp counter during {stage} "
                            "(kernels do not time themselves; the sandbox makes rdtsc fault)", stage,
                            syscall="rdtsc")
        if os.WIFEXITED(st) and os.WEXITSTATUS(st) == EXIT_FORBIDDEN:
            m = re.search(r"forbidden system call (\d+)", tail)
            name = syscall_names().get(int(m.group(1)), f"#{m.group(1)}") if m else "unknown"
            return Rejected(Outcome.CHEATED, f"the kernel made the forbidden system call `{name}` "
                            f"during {stage} (kernels compute; they do not start threads or processes, "
                            "open files or sockets, or signal other processes); the sandbox killed it",
                            stage, syscall=name)
        if os.WIFSIGNALED(st) and os.WTERMSIG(st) == signal.SIGSYS:
            # the kernel's seccomp kill: the trap's signal was blocked, so the call went unnamed
            return Rejected(Outcome.CHEATED, f"the kernel made a forbidden system call during {stage} "
                            "with signals blocked (so it could not be named); the sandbox killed it",
                            stage, syscall="unknown")
        if os.WIFSIGNALED(st):
            sig = os.WTERMSIG(st)
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            detail = f"killed by {name} during {stage}"
            if sig == signal.SIGXCPU:
                detail += " (CPU-time limit)"
            elif sig == signal.SIGXFSZ:
                detail += " (it wrote too much output)"
        else:
            detail = f"exited with status {os.WEXITSTATUS(st)} during {stage} (the kernel called exit?)"
        if tail and "swarmfactory-sandbox" not in tail:
            detail += f"; its output ends: {tail[-300:]}"
        return Rejected(Outcome.CRASHED, "the candidate's process " + detail, stage,
                        exit_code=os.WEXITSTATUS(st) if os.WIFEXITED(st) else -os.WTERMSIG(st))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)


def redact(text: str) -> str:
    """``text`` with the values of this process's secret-looking environment variables removed."""
    for name, value in os.environ.items():
        if len(value) >= 6 and _SECRET_NAME.search(name) and value in text:
            text = text.replace(value, f"[{name} redacted]")
    return text


def _fp_text(v: int) -> str:
    if sys.platform == "linux" and os.uname().machine in ("x86_64", "AMD64"):
        mxcsr, cw = v & 0xFFFF, v >> 16
        modes = []
        if mxcsr & 0x8000:
            modes.append("flush-to-zero")
        if mxcsr & 0x0040:
            modes.append("denormals-are-zero")
        rc = (mxcsr >> 13) & 3
        if rc:
            modes.append(("round-down", "round-up", "round-toward-zero")[rc - 1])
        pc = (cw >> 8) & 3
        if pc != 3:
            modes.append(f"x87 precision {('single', 'reserved', 'double')[pc]}")
        if (cw >> 10) & 3:
            modes.append("x87 rounding changed")
        return f"MXCSR {mxcsr:#06x}, x87 control {cw:#06x}" + (f" ({', '.join(modes)})" if modes else "")
    return f"FPCR {v:#x}"


def expected_filters(pid: int, lo_hi: int, hi_hi: int) -> tuple[bytes, bytes]:
    """(load program, serve program) of a driver with this pid and image range, as a trusted run
    of the driver builds them (no candidate code in that process)."""
    out = subprocess.run([driver_path(), "--filters", str(pid), str(lo_hi), str(hi_hi)],
                         capture_output=True, timeout=30, check=True).stdout
    n_load, n_serve = struct.unpack_from("<II", out)
    return out[8:8 + 8 * n_load], out[8 + 8 * n_load:8 + 8 * (n_load + n_serve)]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _own_netns(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return False
