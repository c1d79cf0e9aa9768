"""Containment for candidate processes: where nothing may outlive an evaluation.

The first line is the driver's system-call allow-list (no new threads or processes at all). This
module is the second: it finds whatever a candidate process might still have left behind and
kills it, by the strongest means this machine offers:

* ``cgroup``: a cgroup v2 of its own per candidate process (where the hierarchy is writable: as
  root, or under a delegated subtree). Every descendant stays in it whatever it does with process
  groups and sessions; ``cgroup.kill`` ends them all at once.
* ``token``: otherwise, every process whose environment carries the evaluation's private
  temporary directory (``TMPDIR``, a random path inherited through fork, double fork and setsid
  alike, and a variable every process may have: it names nothing of the harness) is found in
  /proc and killed.
* the process group of the driver is always killed as well.

A ``Containment`` is handed to the process's ``lifecycle.Child``, which moves the process into it
and kills what it holds whenever it kills the process.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from functools import cache
from pathlib import Path

_COUNTER = iter(range(1 << 62))
_LOCK = threading.Lock()


@cache
def cgroup_root() -> Path | None:
    """This process's own cgroup v2 directory, if we may create children in it."""
    if os.environ.get("SWARMFACTORY_NO_CGROUP") == "1":
        return None
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        own = [ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
               if ln.startswith("0::")]
    except OSError:
        return None
    if not own:
        return None
    for line in mounts:
        parts = line.split(" - ")
        if len(parts) == 2 and parts[1].split()[0] == "cgroup2":
            base = Path(parts[0].split()[4]) / own[0].lstrip("/")
            probe = base / f"swarmfactory-probe-{os.getpid()}"
            try:
                probe.mkdir()
                probe.rmdir()
                return base
            except OSError:
                continue
    return None


class Containment:
    """Tracks one candidate process and everything it may have started."""

    def __init__(self, token: str | None, use_cgroup: bool = True):
        """``token``: the candidate process's private TMPDIR (unique to this evaluation); None:
        without a cgroup, nothing is tracked beyond the process group (a trusted worker's)."""
        self.token = token
        self.cgroup: Path | None = None
        root = cgroup_root() if use_cgroup else None
        if root is not None:
            with _LOCK:
                n = next(_COUNTER)
            path = root / f"swarmfactory-{os.getpid()}-{n}"
            try:
                path.mkdir()
                self.cgroup = path
            except OSError:
                self.cgroup = None
        self.pid: int | None = None

    @property
    def mechanism(self) -> str:
        return "cgroup" if self.cgroup else "token" if self.token else "process group"

    def adopt(self, pid: int) -> bool:
        """Move ``pid`` (and its threads) into the cgroup. False if that failed."""
        self.pid = pid
        if self.cgroup is None:
            return False
        try:
            (self.cgroup / "cgroup.procs").write_text(str(pid))
            return True
        except OSError:
            self._remove()
            self.cgroup = None
            return False

    def members(self) -> list[int]:
        """Every live process that belongs to the evaluation, the driver included."""
        if self.cgroup is not None:
            try:
                text = (self.cgroup / "cgroup.procs").read_text()
                return sorted(int(x) for x in text.split())
            except OSError:
                return []
        if self.token is None:
            return []
        found = []
        needle = f"TMPDIR={self.token}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
        return sorted(found)

    def threads(self, pid: int) -> int | None:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("Threads:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return None

    def strays(self) -> list[int]:
        """Processes other than the driver that belong to the evaluation."""
        return [p for p in self.members() if p != self.pid]

    def kill_all(self) -> None:
        if self.cgroup is not None:
            try:
                (self.cgroup / "cgroup.kill").write_text("1")
            except OSError:
                pass
        for pid in self.members():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        self.kill_all()
        self._remove()

    def _remove(self) -> None:
        if self.cgroup is None:
            return
        for _ in range(50):  # killed processes leave the cgroup within moments
            try:
                self.cgroup.rmdir()
                return
            except OSError:
                time.sleep(0.01)


@cache
def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0: none): the driver's file-system limits."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return max(0, int(libc.syscall(444, None, 0, 1)))  # landlock_create_ruleset(VERSION)
    except (OSError, AttributeError):
        return 0


def seccomp_state(pid: int) -> tuple[int, int]:
    """(Seccomp mode, number of filters) of ``pid`` as the kernel reports them; (0, 0) if unknown."""
    mode = filters = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Seccomp:"):
                mode = int(line.split()[1])
            elif line.startswith("Seccomp_filters:"):
                filters = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return mode, filters
