"""Nothing swarmfactory starts outlives it, however it dies.

Every process we start (trusted baseline workers, candidate drivers, GPU workers, engine servers
started to be measured, local LLM servers) is *adopted* here, by pid and start time (a pid alone
may name another process a moment later). Three layers end them:

1. **Our own exit paths** close what they started (``Worker.close``, ``atexit``, Ctrl-C).
2. **A guard process**, started on the first adoption: a small Python process in a session of its
   own whose standard input is a pipe only we hold. It keeps the list of adopted processes (and
   their cgroups); when the pipe reads end-of-file, because we exited, were killed with SIGKILL,
   or by the OOM killer, it sends SIGKILL to each one's process group (SIGKILL ends a stopped,
   frozen worker too) and cgroup, then exits. No thread or signal handler of ours has to run.
3. **A ledger in the store** (``evidence/processes.py``), where a run, an evaluation or a tuning
   session has one: each adopted process with our own pid and start time. Should the guard die
   with us, the next ``run``, ``run --resume``, ``eval`` or ``engine tune`` on that store ends
   every process recorded there whose owner is gone and whose start time still matches
   (``reap_recorded``): never by name.

``PR_SET_PDEATHSIG`` is not used for these: it follows the *thread* that started a process, and
our workers are started by one evaluation thread and used by the next.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from functools import cache

from swarmfactory.evidence import processes as ledger

_LOCK = threading.Lock()
_GUARD: subprocess.Popen | None = None
_GUARD_PID = None  # the process that started _GUARD (a fork must start its own)
_ADOPTED: dict[int, tuple] = {}  # pid -> (start time, what, cgroup, in the ledger too)
_LEDGERS: list = []  # [store, users]: the stores our processes are recorded in

# The guard. Lines on stdin: "+ PID START CGROUP_OR_-" adopts, "- PID START" releases. At EOF
# every adopted process whose start time still matches is killed with its process group and
# cgroup. ``-S``: no site import, a few MB.
GUARD = r"""
import os, signal, sys, time
def start(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else None
procs = {}
while True:
    line = sys.stdin.buffer.readline()
    if not line:
        break
    parts = line.decode().split()
    if len(parts) >= 3 and parts[0] == "+":
        procs[(int(parts[1]), parts[2])] = parts[3] if len(parts) > 3 and parts[3] != "-" else None
    elif len(parts) >= 3 and parts[0] == "-":
        procs.pop((int(parts[1]), parts[2]), None)
for (pid, st), cg in procs.items():
    if start(pid) == st:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
    if cg:
        try:
            with open(cg + "/cgroup.kill", "w") as f:
                f.write("1")
        except OSError:
            pass
for (pid, st), cg in procs.items():
    if cg:
        for _ in range(100):
            try:
                os.rmdir(cg)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)
"""


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot, as text); None if it is gone
    or a zombie (dead, waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else None


@cache
def boot_id() -> str:
    """This machine's current boot: a pid and start time mean nothing on another one."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        import socket

        return socket.gethostname()


def me() -> tuple[int, str | None]:
    return os.getpid(), start_time(os.getpid())


def _guard_send(line: str) -> None:
    global _GUARD, _GUARD_PID
    if _GUARD is None or _GUARD_PID != os.getpid() or _GUARD.poll() is not None:
        try:
            _GUARD = subprocess.Popen([sys.executable, "-S", "-c", GUARD], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True, close_fds=True)
        except OSError:
            _GUARD = None
            return
        _GUARD_PID = os.getpid()
        for pid, (st, _what, cg, _l) in _ADOPTED.items():  # a restarted guard learns them all again
            _GUARD.stdin.write(f"+ {pid} {st} {cg or '-'}\n".encode())
    try:
        _GUARD.stdin.write(line.encode())
        _GUARD.stdin.flush()
    except (OSError, ValueError):
        pass


def guard_pid() -> int | None:
    return _GUARD.pid if _GUARD is not None and _GUARD.poll() is None else None


def adopt(pid: int, what: str, cgroup: str | None = None, ledger_too: bool = True) -> None:
    """``pid`` (a process-group leader we started) dies with us, with its group and cgroup.
    ``ledger_too=False``: not in the store's ledger (a candidate driver lives for one stage of
    one evaluation and also dies with the thread that started it; the guard covers it)."""
    st = start_time(pid)
    if st is None:
        return
    with _LOCK:
        _ADOPTED[pid] = (st, what, cgroup, ledger_too)
        _guard_send(f"+ {pid} {st} {cgroup or '-'}\n")
        ledgers = [e[0] for e in _LEDGERS] if ledger_too else []
    for store in ledgers:
        try:
            ledger.record(store, pid, st, what, *me(), boot_id())
        except Exception:  # the ledger is a second line of defence, never a reason to fail
            pass


def release(pid: int) -> None:
    """``pid`` has been ended (or waited for) by its owner."""
    with _LOCK:
        entry = _ADOPTED.pop(pid, None)
        if entry is None:
            return
        _guard_send(f"- {pid} {entry[0]}\n")
        ledgers = [e[0] for e in _LEDGERS] if entry[3] else []
    for store in ledgers:
        try:
            ledger.forget(store, pid, entry[0], boot_id())
        except Exception:
            pass


def adopted() -> dict[int, str]:
    with _LOCK:
        return {pid: e[1] for pid, e in _ADOPTED.items()}


def record_in(store) -> None:
    """Record every process adopted from now on (and those alive now) in ``store``'s ledger."""
    with _LOCK:
        for e in _LEDGERS:
            if e[0] is store:
                e[1] += 1
                return
        _LEDGERS.append([store, 1])
        alive = dict(_ADOPTED)
    for pid, (st, what, _cg, ledger_too) in alive.items():
        if not ledger_too:
            continue
        try:
            ledger.record(store, pid, st, what, *me(), boot_id())
        except Exception:
            pass


def stop_recording(store) -> None:
    """One user of ``store`` is done (each ``record_in`` is matched by one of these)."""
    with _LOCK:
        for e in _LEDGERS:
            if e[0] is store:
                e[1] -= 1
        _LEDGERS[:] = [e for e in _LEDGERS if e[1] > 0]


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and ``pid`` (a stopped process ends too)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def reap_recorded(store) -> list[dict]:
    """End every process recorded in ``store`` on this machine whose owner is gone (its pid dead
    or reused) and whose own start time still matches; forget the records. Returns what was
    ended (a message for the user)."""
    try:
        rows = ledger.recorded(store, boot_id())
    except Exception:
        return []
    ended = []
    for r in rows:
        if start_time(r["owner_pid"]) == r["owner_start"]:
            continue  # its owner is alive: a concurrent run's
        if start_time(r["pid"]) == r["start"]:
            kill_tree(r["pid"])
            ended.append(r)
        try:
            ledger.forget(store, r["pid"], r["start"], boot_id())
        except Exception:
            pass
    return ended


def watch(store) -> list[dict]:
    """On opening ``store`` for work: end what a dead run left there (one line on stderr when
    anything was), then record what we start from now on."""
    if store is None:
        return []
    ended = reap_recorded(store)
    if ended:
        what = ", ".join(f"{r['what']} {r['pid']}" for r in ended[:6]) + (" ..." if len(ended) > 6 else "")
        print(f"note: ended {len(ended)} process(es) a run that died left behind ({what})", file=sys.stderr)
    record_in(store)
    return ended
