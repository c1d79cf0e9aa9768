"""Reading a stopped candidate process from the outside (ptrace): what it cannot forge.

The driver reports its floating-point control state and its filters itself, but a kernel runs in
the same process and can forge anything the driver says. While the process is stopped, the
trusted side attaches to every thread in turn (``PTRACE_SEIZE`` + ``PTRACE_INTERRUPT``), reads
its SSE/x87 (or FPCR) control state from the kernel's copy of its registers and, once, the
system-call filters the kernel holds for it (``PTRACE_SECCOMP_GET_FILTER``), then detaches: the
process stays stopped as it was.

Where ptrace is not permitted (no CAP_SYS_PTRACE under a strict Yama scope, or a kernel without
``CONFIG_CHECKPOINT_RESTORE`` for the filters) ``available()`` says so and the harness records
that only the driver's own checks were in force.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import threading
from functools import cache

PTRACE_DETACH = 17
PTRACE_GETREGSET = 0x4204
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_SECCOMP_GET_FILTER = 0x420C
NT_PRFPREG = 2
WALL = 0x40000000
_SYS_PTRACE = {"x86_64": 101, "aarch64": 117}
_LOCK = threading.Lock()  # ptrace requests must come from the thread that attached


class TraceError(OSError):
    pass


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


@cache
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _ptrace(request: int, tid: int, addr: int = 0, data=None) -> int:
    nr = _SYS_PTRACE.get(platform.machine())
    if nr is None:
        raise TraceError(errno.ENOSYS, "ptrace is read here on x86-64 and aarch64 only")
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    res = libc.syscall(ctypes.c_long(nr), ctypes.c_long(request), ctypes.c_long(tid),
                       ctypes.c_void_p(addr), data if data is not None else ctypes.c_void_p(0))
    if res < 0:
        err = ctypes.get_errno()
        raise TraceError(err, f"ptrace({request:#x}, {tid}): {os.strerror(err)}")
    return res


def threads_of(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def _fp_control(buf: bytes) -> int:
    """The control state the driver compares (driver.c fp_state): MXCSR without its sticky flags
    and the x87 control word on x86-64; FPCR on aarch64."""
    if platform.machine() == "x86_64":
        cwd = struct.unpack_from("<H", buf, 0)[0]
        mxcsr = struct.unpack_from("<I", buf, 24)[0]
        return (mxcsr & 0xFFC0) | ((cwd & 0x1F3F) << 16)
    return struct.unpack_from("<I", buf, 516)[0]  # user_fpsimd_state: vregs[32], fpsr, fpcr


class _Attached:
    """One thread seized and stopped for reading; detached on exit (it stays group-stopped)."""

    def __init__(self, tid: int):
        self.tid = tid

    def __enter__(self):
        _ptrace(PTRACE_SEIZE, self.tid)
        try:
            _ptrace(PTRACE_INTERRUPT, self.tid)
            while True:
                try:
                    os.waitpid(self.tid, WALL)
                    break
                except InterruptedError:
                    continue
        except BaseException:
            self._detach()
            raise
        return self

    def fp_control(self) -> int:
        buf = ctypes.create_string_buffer(1024)
        iov = _Iovec(ctypes.cast(buf, ctypes.c_void_p), 1024)
        _ptrace(PTRACE_GETREGSET, self.tid, NT_PRFPREG, ctypes.byref(iov))
        return _fp_control(buf.raw[:iov.len])

    def filters(self, limit: int = 8) -> list[bytes]:
        """The thread's system-call filters, oldest first (the kernel counts index 0 from the
        first installed), as raw BPF instructions."""
        out = []
        for index in range(limit):
            try:
                n = _ptrace(PTRACE_SECCOMP_GET_FILTER, self.tid, index)
            except TraceError as exc:
                if exc.errno in (errno.ENOENT, errno.EINVAL):  # no more filters; none at all
                    break
                raise
            buf = ctypes.create_string_buffer(8 * n)
            _ptrace(PTRACE_SECCOMP_GET_FILTER, self.tid, index, buf)
            out.append(buf.raw)
        return out

    def _detach(self) -> None:
        try:
            _ptrace(PTRACE_DETACH, self.tid)
        except TraceError:
            pass

    def __exit__(self, *exc):
        self._detach()


def fp_states(pid: int) -> dict[int, int]:
    """Every thread's floating-point control state, read while the process is stopped."""
    out = {}
    with _LOCK:
        try:
            for tid in threads_of(pid):
                with _Attached(tid) as t:
                    out[tid] = t.fp_control()
        finally:
            _settle(pid)
    return out


def filters(pid: int) -> dict[int, list[bytes]]:
    """Every thread's installed system-call filters (oldest first)."""
    out = {}
    with _LOCK:
        try:
            for tid in threads_of(pid):
                with _Attached(tid) as t:
                    out[tid] = t.filters()
        finally:
            _settle(pid)
    return out


def _settle(pid: int, timeout: float = 1.0) -> None:
    """Wait until every thread is back in its stop: a detached thread re-enters the group stop
    in the kernel (no user code runs), which on a busy machine waits for a CPU."""
    import time

    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        states = []
        for tid in threads_of(pid):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue
        if all(s in ("T", "t", "Z", "X") for s in states):
            return
        time.sleep(0.0002)


@cache
def available() -> tuple[bool, bool]:
    """(registers readable, filters readable) for a stopped child of this process: probed once
    on a throwaway child that stops itself, a ``lifecycle.Child`` (a stopped process outlives a
    parent killed with -9 unless something ends it: the guard does)."""
    import sys

    from swarmfactory import lifecycle

    child = lifecycle.Child([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"],
                            "tracer probe", limits=lifecycle.Limits(die_with_parent=True), ledger=False)
    regs = flt = False
    try:
        if child.wait_stop():
            try:
                with _LOCK, _Attached(child.pid) as t:
                    t.fp_control()
                    regs = True
                    try:
                        t.filters()
                        flt = True
                    except TraceError:
                        pass
            except TraceError:
                pass
    finally:
        child.close()
    return regs, flt
