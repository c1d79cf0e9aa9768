"""Nothing swarmfactory starts outlives it, however it dies.

Every process we start (trusted baseline workers, candidate drivers, GPU workers, engine servers
started to be measured, local LLM servers) is a ``Child``: started here in a session and process
group of its own, with its limits applied between fork and exec, and *adopted*, by pid and start
time (a pid alone may name another process a moment later). Three layers end them:

1. **Our own exit paths** close what they started (``Child.close``, ``kill_all`` at ``atexit`` and
   when a run is interrupted).
2. **A guard process**, started on the first adoption: a small Python process in a session of its
   own whose standard input is a pipe only we hold. It keeps the list of adopted processes (and
   their cgroups); when the pipe reads end-of-file, because we exited, were killed with SIGKILL,
   or by the OOM killer, it sends SIGKILL to each one's process group (SIGKILL ends a stopped,
   frozen worker too) and cgroup, removes the temporary directories we registered with it
   (``temp_dir``: a worker's home, a build's folder), then exits. No thread or signal handler of
   ours has to run.
3. **A ledger**, where a run, an evaluation or a tuning session has a store: each adopted process
   with our own pid and start time, recorded through the ``Ledger`` the caller hands ``watch``
   (the store's, evidence/processes.py: this module knows nothing of stores). Should the guard
   die with us, the next ``run``, ``run --resume``, ``eval`` or ``engine tune`` on that store ends
   every process recorded there whose owner is gone and whose start time still matches
   (``reap_recorded``): never by name.

``PR_SET_PDEATHSIG`` (``Limits.die_with_parent``) is only an extra: it follows the *thread* that
started a process, and our workers are started by one evaluation thread and used by the next.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Protocol

_LOCK = threading.Lock()
_GUARD: subprocess.Popen | None = None
_GUARD_PID = None  # the process that started _GUARD (a fork must start its own)
_ADOPTED: dict[int, tuple] = {}  # pid -> (start time, what, cgroup, in the ledger too)
_DIRS: set[str] = set()  # temporary directories the guard removes if we die first
_LEDGERS: list = []  # [ledger, users]: where our processes are recorded

# The guard. Lines on stdin: "+ PID START CGROUP_OR_-" adopts, "- PID START" releases, "d PATH"
# and "r PATH" register and forget a temporary directory. At EOF every adopted process whose
# start time still matches is killed with its process group and cgroup, then the directories are
# removed (never through a symbolic link). ``-S``: no site import, a few MB.
GUARD = r"""
import os, shutil, signal, sys, time
def start(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else None
procs = {}
dirs = set()
while True:
    line = sys.stdin.buffer.readline()
    if not line:
        break
    if line[:2] in (b"d ", b"r "):
        path = os.fsdecode(line[2:-1])
        dirs.add(path) if line[:1] == b"d" else dirs.discard(path)
        continue
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
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
"""


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first); [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _state(pid: int) -> str:
    """Its state letter (R, S, T for stopped, Z...); "" if it is gone."""
    fields = _stat(pid)
    return fields[0] if fields else ""


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot, as text); None if it is gone
    or a zombie (dead, waiting to be reaped)."""
    fields = _stat(pid)
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
        for d in _DIRS:
            _GUARD.stdin.write(b"d " + os.fsencode(d) + b"\n")
    try:
        _GUARD.stdin.write(os.fsencode(line))
        _GUARD.stdin.flush()
    except (OSError, ValueError):
        pass


def guard_pid() -> int | None:
    return _GUARD.pid if _GUARD is not None and _GUARD.poll() is None else None


def adopt(pid: int, what: str, cgroup: str | None = None, ledger_too: bool = True) -> None:
    """``pid`` (a process-group leader we started) dies with us, with its group and cgroup.
    ``ledger_too=False``: not in the ledgers (a candidate driver lives for one stage of one
    evaluation and also dies with the thread that started it; the guard covers it)."""
    st = start_time(pid)
    if st is None:
        return
    with _LOCK:
        _ADOPTED[pid] = (st, what, cgroup, ledger_too)
        _guard_send(f"+ {pid} {st} {cgroup or '-'}\n")
        ledgers = [e[0] for e in _LEDGERS] if ledger_too else []
    for ledger in ledgers:
        try:
            ledger.record(pid, st, what, *me(), boot_id())
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
    for ledger in ledgers:
        try:
            ledger.forget(pid, entry[0], boot_id())
        except Exception:
            pass


def _forget_in_child() -> None:
    """A forked child owns none of its parent's processes and directories: its own guard (started
    on its first adoption) must not end or remove them when the child exits."""
    global _LOCK
    _LOCK = threading.Lock()  # another thread may have held it at the fork
    _ADOPTED.clear()
    _DIRS.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def temp_dir(prefix: str) -> str:
    """A new temporary directory (``tempfile.mkdtemp``) that goes when we do: ``remove_dir`` on
    our own exit paths, the guard where we die without running them (SIGKILL, a SIGTERM we do
    not catch, the OOM killer), and where the guard dies with us (a killed process group, a
    container's teardown), the next process of ours that makes one (``sweep_orphaned_dirs``: each
    directory is noted with its owner's pid and start time). A path with a newline (a TMPDIR
    holding one) is not registered."""
    global _SWEPT
    if not _SWEPT:
        _SWEPT = True
        sweep_orphaned_dirs()
    path = tempfile.mkdtemp(prefix=prefix)
    if "\n" not in path:
        with _LOCK:
            _DIRS.add(path)
            _guard_send(f"d {path}\n")
        _note_owner(path)
    return path


def remove_dir(path: str) -> None:
    """Remove a ``temp_dir`` (whatever is in it) and tell the guard it is gone."""
    shutil.rmtree(path, ignore_errors=True)
    with _LOCK:
        if path in _DIRS:
            _DIRS.discard(path)
            _guard_send(f"r {path}\n")
    registry = _owned_registry(create=False)
    if registry:
        try:
            os.unlink(os.path.join(registry, os.path.basename(path)))
        except OSError:
            pass


_SWEPT = False  # this process swept the orphaned directories once


def _owned_registry(create: bool = True) -> str | None:
    """This user's notes of the temporary directories we made (``{tempdir}/sf-owned-UID``): a
    directory of ours, closed to others, never a link; None where it cannot be that."""
    path = os.path.join(tempfile.gettempdir(), f"sf-owned-{os.getuid()}")
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def _note_owner(path: str) -> None:
    """Note ``path`` in the registry under its name: this boot, our pid and start time, the path."""
    registry = _owned_registry()
    if registry is None:
        return
    entry = os.path.join(registry, os.path.basename(path))
    try:
        with open(entry + ".new", "w") as f:
            f.write(f"{boot_id()} {os.getpid()} {start_time(os.getpid())}\n{path}\n")
        os.replace(entry + ".new", entry)
    except OSError:
        pass


def sweep_orphaned_dirs() -> list[str]:
    """Remove the temporary directories noted by owners that are gone (their pid dead or reused,
    or another boot) and that neither we nor the guard removed: the guard died with its owner.
    Only a directory of ours at the noted path, under the noted name, never through a link.
    Returns the directories removed."""
    registry = _owned_registry(create=False)
    if registry is None:
        return []
    removed = []
    try:
        names = [n for n in os.listdir(registry) if not n.endswith(".new")]
    except OSError:
        return []
    for name in names:
        entry = os.path.join(registry, name)
        try:
            with open(entry) as f:
                head, path = f.read().split("\n")[:2]
            boot, pid, st = head.split()
            if boot == boot_id() and start_time(int(pid)) == st:
                continue  # its owner lives
        except (OSError, ValueError):
            continue
        try:
            info = os.lstat(path)
            if (os.path.basename(path) == name and stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        except OSError:
            pass
        try:
            os.unlink(entry)
        except OSError:
            pass
    return removed


@contextmanager
def temp_dir_for(prefix: str) -> Iterator[str]:
    """``temp_dir`` for the length of a ``with`` block."""
    path = temp_dir(prefix)
    try:
        yield path
    finally:
        remove_dir(path)


def adopted() -> dict[int, str]:
    with _LOCK:
        return {pid: e[1] for pid, e in _ADOPTED.items()}


# -- the ledgers ------------------------------------------------------------------------------------
class Ledger(Protocol):
    """Where adopted processes are recorded beyond our own life: a store's ``processes`` table
    (evidence/processes.py's ``ProcessLedger``). ``recorded`` rows have the keys pid, start,
    what, owner_pid and owner_start."""

    def record(self, pid: int, start: str, what: str, owner_pid: int, owner_start: str | None,
               boot: str) -> None: ...

    def forget(self, pid: int, start: str, boot: str) -> None: ...

    def recorded(self, boot: str) -> list[dict]: ...


def record_in(ledger: Ledger) -> None:
    """Record every process adopted from now on (and those alive now) in ``ledger``."""
    with _LOCK:
        for e in _LEDGERS:
            if e[0] is ledger:
                e[1] += 1
                return
        _LEDGERS.append([ledger, 1])
        alive = dict(_ADOPTED)
    for pid, (st, what, _cg, ledger_too) in alive.items():
        if not ledger_too:
            continue
        try:
            ledger.record(pid, st, what, *me(), boot_id())
        except Exception:
            pass


def stop_recording(ledger: Ledger) -> None:
    """One user of ``ledger`` is done (each ``record_in`` is matched by one of these)."""
    with _LOCK:
        for e in _LEDGERS:
            if e[0] is ledger:
                e[1] -= 1
        _LEDGERS[:] = [e for e in _LEDGERS if e[1] > 0]


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and ``pid`` (a stopped process ends too)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def reap_recorded(ledger: Ledger) -> list[dict]:
    """End every process recorded in ``ledger`` on this machine whose owner is gone (its pid dead
    or reused) and whose own start time still matches; forget the records. Returns what was
    ended (a message for the user)."""
    try:
        rows = ledger.recorded(boot_id())
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
            ledger.forget(r["pid"], r["start"], boot_id())
        except Exception:
            pass
    return ended


def watch(ledger: Ledger | None) -> list[dict]:
    """On opening a store for work (``ledger``: its process ledger): end what a dead run left
    there, and remove the temporary directories dead owners left (one line on stderr when
    anything was), then record what we start from now on."""
    if ledger is None:
        return []
    ended = reap_recorded(ledger)
    if ended:
        what = ", ".join(f"{r['what']} {r['pid']}" for r in ended[:6]) + (" ..." if len(ended) > 6 else "")
        print(f"note: ended {len(ended)} process(es) a run that died left behind ({what})", file=sys.stderr)
    gone = sweep_orphaned_dirs()
    if gone:
        print(f"note: removed {len(gone)} temporary folder(s) a process that died left behind", file=sys.stderr)
    record_in(ledger)
    return ended


# -- the child process ------------------------------------------------------------------------------
PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class Limits:
    """What a child may use, applied in it between fork and exec; None (or False): as inherited."""

    mem_bytes: int | None = None  # RLIMIT_AS, its address space
    cpu_seconds: int | None = None  # RLIMIT_CPU: SIGXCPU past it
    file_bytes: int | None = None  # RLIMIT_FSIZE, the largest file it may write: SIGXFSZ past it
    core_bytes: int | None = None  # RLIMIT_CORE (0: no core dumps)
    cpus: tuple[int, ...] | None = None  # its CPU affinity
    own_network: bool = False  # a network namespace of its own, where this machine permits one
    die_with_parent: bool = False  # PR_SET_PDEATHSIG: SIGKILL when the *thread* that started it ends

    def preexec(self):
        """The function the child runs between fork and exec (None: nothing to apply). libc's
        functions are looked up here, in the parent, so the child does as little as it can, and
        the resource limits come last (a lowered address space may fail what follows it)."""
        rlimits = [(which, n) for which, n in ((resource.RLIMIT_AS, self.mem_bytes),
                                               (resource.RLIMIT_CPU, self.cpu_seconds),
                                               (resource.RLIMIT_FSIZE, self.file_bytes),
                                               (resource.RLIMIT_CORE, self.core_bytes)) if n is not None]
        libc = ctypes.CDLL(None, use_errno=True) if self.die_with_parent or self.own_network else None
        prctl = libc.prctl if self.die_with_parent else None
        unshare = getattr(libc, "unshare", None) if self.own_network else None
        cpus = self.cpus
        if not (rlimits or cpus or prctl or unshare):
            return None

        def apply():
            if prctl is not None:
                prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if unshare is not None:
                unshare(CLONE_NEWNET)  # -1 where not permitted: the other layers forbid sockets anyway
            if cpus:
                try:
                    os.sched_setaffinity(0, cpus)
                except OSError:
                    pass
            for which, n in rlimits:
                resource.setrlimit(which, (n, n))
        return apply


class Child:
    """One process we start, limit and end. It gets a session and process group of its own, the
    ``Limits`` given, and is adopted (the guard, the ledgers) until ``close`` reaps it; until then
    ``kill_all`` ends it too. Its surface is Popen's where the callers used Popen's (``pid``,
    ``poll``, ``wait``, ``returncode``, ``kill``), and all waiting for it goes through here, so its
    end is seen once: ``wait_stop`` for a process that stops itself between requests, the raw wait
    status (``status``) for telling a signal from an exit."""

    def __init__(self, argv: list[str], what: str, *, env: dict[str, str] | None = None,
                 cwd: str | None = None, limits: Limits = Limits(), log: str | int | None = None,
                 pass_fds: tuple[int, ...] = (), containment=None, ledger: bool = True):
        """``what``: its name in the guard's and the ledgers' records and in messages. ``log``: a
        path that receives its stdout and stderr (``log_tail`` reads it back), or
        ``subprocess.PIPE``: both as one text stream, ``stdout`` (a long-lived server's events,
        read line by line); otherwise both are discarded. Its stdin is /dev/null.
        ``containment``: a tracker of everything it may start (harness/isolation.py's
        ``Containment``: its cgroup, or its token); the process is moved into it at once, and
        whatever it holds is killed with the process. ``ledger=False``: adopted by the guard but
        recorded in no ledger (a candidate driver lives for one stage of one evaluation)."""
        self.what, self.containment = what, containment
        self.log_path = os.fspath(log) if isinstance(log, (str, os.PathLike)) else None
        self.frozen = False
        self.status: int | None = None  # its wait status once it ended (os.WIFEXITED and the like)
        self._wait_lock = threading.Lock()  # one waitpid at a time: its end is seen once
        self._owner = os.getpid()  # a forked copy of us must not end our children
        self._released = False
        if self.log_path is not None:
            out = err = open(self.log_path, "wb")
        elif log == subprocess.PIPE:
            out, err = subprocess.PIPE, subprocess.STDOUT
        else:
            out = err = subprocess.DEVNULL
        try:
            self._popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                           text=log == subprocess.PIPE, cwd=cwd, env=env, pass_fds=pass_fds,
                                           start_new_session=True, preexec_fn=limits.preexec())
        finally:
            if self.log_path is not None:
                out.close()
        self.pid = self._popen.pid
        self.stdout = self._popen.stdout
        if containment is not None:
            containment.adopt(self.pid)
        cgroup = getattr(containment, "cgroup", None)
        adopt(self.pid, what, str(cgroup) if cgroup else None, ledger_too=ledger)
        with _CHILDREN_LOCK:
            _CHILDREN.add(self)

    @property
    def returncode(self) -> int | None:
        """Popen's: its exit status, or minus the signal that ended it; None while it runs."""
        status = self.status
        return None if status is None else os.waitstatus_to_exitcode(status)

    def _waitpid(self, flags: int) -> int | None:
        """One waitpid, with the wait lock held and its end not seen yet: the status (a stop's
        too, with WUNTRACED), None when nothing changed. An end is recorded, and handed to the
        Popen, which would otherwise wait for the pid itself later (by then another process's)."""
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere: its status is lost
            pid, status = self.pid, 0
        if pid != self.pid:
            return None
        if not os.WIFSTOPPED(status):
            self.status = status
            self._popen.returncode = self.returncode
        return status

    def poll(self) -> int | None:
        """``returncode``, after reaping it if it has ended (None also while another thread waits)."""
        if self.status is None and self._wait_lock.acquire(blocking=False):
            try:
                if self.status is None:
                    self._waitpid(os.WNOHANG)
            finally:
                self._wait_lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its ``returncode`` once it has ended; ``subprocess.TimeoutExpired`` past ``timeout``
        seconds, as Popen's ``wait``."""
        if timeout is None:
            with self._wait_lock:
                while self.status is None:
                    self._waitpid(0)
            return self.returncode
        deadline, delay = time.monotonic() + timeout, 0.0005
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self._popen.args, timeout)
            time.sleep(min(delay, left))
            delay = min(2 * delay, 0.05)
        return self.returncode

    def wait_stop(self) -> bool:
        """Block until it stops (True) or ends (False; ``status`` says how)."""
        with self._wait_lock:
            while self.status is None:
                status = self._waitpid(os.WUNTRACED)
                if status is not None and os.WIFSTOPPED(status):
                    return True
            return False

    def freeze(self) -> None:
        """Stop it (SIGSTOP) while others are timed, so that its threads cannot spin meanwhile;
        returns once the stop has landed (within microseconds; a second at most)."""
        if not self.frozen and self.poll() is None:
            os.kill(self.pid, signal.SIGSTOP)
            self.frozen = True
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and _state(self.pid) not in ("T", "Z", "X", ""):
                time.sleep(20e-6)

    def thaw(self) -> None:
        if self.frozen:
            self.frozen = False
            if self.status is None:
                try:
                    os.kill(self.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def kill(self) -> None:
        """SIGKILL its process group and itself, then everything its containment holds; one we
        froze is continued first (SIGKILL ends a stopped process too, but it must not stay
        ``frozen``). Never waits: a watchdog calls it while the owner waits for the process,
        ``kill_all`` while any thread may."""
        self.thaw()
        if self.status is None:  # once reaped, its pid may be another process's
            kill_tree(self.pid)
        if self.containment is not None:
            self.containment.kill_all()

    def stop(self, grace: float) -> None:
        """Ask it to end (SIGTERM, to it alone: a server shuts down cleanly); ``close`` it, killed,
        if it has not within ``grace`` seconds."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.close()

    def close(self, timeout: float | None = None) -> None:
        """Kill it, reap it (waiting ``timeout`` seconds at most), remove its containment and
        release it (the guard, the ledgers, ``kill_all``). One that outlives ``timeout`` (asleep
        in the kernel) stays adopted: a later ``close`` or the guard ends it."""
        if self._released:
            return
        self.kill()
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        if self.containment is not None:
            self.containment.close()
        if self.status is not None:
            self._released = True
            release(self.pid)
            with _CHILDREN_LOCK:
                _CHILDREN.discard(self)

    def log_tail(self, n: int = 400) -> str:
        """The last ``n`` bytes of its log, as text ("" without one)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""


_CHILDREN: set[Child] = set()  # started and not released yet: what kill_all ends
_CHILDREN_LOCK = threading.Lock()


def children() -> list[Child]:
    """Every child this process started and has not released yet."""
    with _CHILDREN_LOCK:
        return [c for c in _CHILDREN if c._owner == os.getpid()]


def kill_all() -> None:
    """End every child this process started and has not released: an interrupted run must not
    leave kernels spinning, nor an exiting process a frozen worker (registered with ``atexit``).
    All are killed first, then each is reaped (10 s at most)."""
    live = children()
    for c in live:
        c.kill()
    for c in live:
        c.close(timeout=10)


atexit.register(kill_all)
