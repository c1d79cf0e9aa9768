"""How busy the machine was while we measured: the evidence that a figure was taken on a loaded
machine, so noise is never turned into a verdict, a champion or a lesson.

Readings over a window (``Meter.snapshot`` at both ends, ``Meter.between``):

* ``suffered``: the share of the window during which one of the measured tasks was ready to run
  and waited for a CPU (Linux pressure stall information, ``cpu.pressure`` "some", in
  microseconds): of the contender's own cgroup where it has one, else of the whole machine.
  This is the interference a timing actually suffered.
* ``others``: the share of the measurement CPUs' time used by processes that are not ours
  (/proc/stat busy time on those CPUs, less the CPU time of our processes that run there).
* ``steal``: the share of those CPUs' time the hypervisor took (/proc/stat steal).
* ``mhz``: the current frequency of those CPUs, where cpufreq is readable.

Reading costs a few file reads (microseconds); it is done outside timed windows.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

BUSY = 0.10          # a window in which the contender waited for a CPU more than this is disturbed
QUIET = 0.05         # the machine counts as quiet again below this share of waiting (avg10)
TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Snapshot:
    wall_ns: int
    pressure_us: dict[str, int]                 # source -> cumulative "some" microseconds
    busy_ticks: int                             # the measurement CPUs' non-idle time
    steal_ticks: int
    total_ticks: int
    ours_ns: int                                # our processes' CPU time


@dataclass(frozen=True)
class Reading:
    seconds: float
    suffered: float | None                      # share of the window (None: no PSI here)
    others: float | None
    steal: float | None
    mhz: float | None = None
    sources: dict[str, float] = field(default_factory=dict)  # suffered per pressure source

    def disturbed(self, limit: float = BUSY) -> bool:
        return self.suffered is not None and self.suffered > limit

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in
                (("seconds", self.seconds), ("suffered", self.suffered), ("others", self.others),
                 ("steal", self.steal), ("mhz", self.mhz))}


def pressure_us(path: str | Path) -> int | None:
    """Cumulative "some" stall microseconds of a ``cpu.pressure`` file; None if unreadable."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("some"):
                return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


SYSTEM_PRESSURE = "/proc/pressure/cpu"


@cache
def pressure_available() -> bool:
    return pressure_us(SYSTEM_PRESSURE) is not None


def process_cpu_ns(pid: int) -> int:
    """CPU time of process ``pid`` (all its threads) in nanoseconds, 0 if it is gone."""
    try:
        return time.clock_gettime_ns((~pid << 3) | 2)  # its process-wide CPU clock (CPUCLOCK_SCHED)
    except OSError:
        return 0


def _cpu_ticks(cpus: list[int]) -> tuple[int, int, int]:
    """(busy, steal, total) ticks of ``cpus`` from /proc/stat."""
    busy = steal = total = 0
    want = {f"cpu{c}" for c in cpus}
    try:
        with open("/proc/stat") as f:
            for line in f:
                parts = line.split()
                if not parts or parts[0] not in want:
                    continue
                vals = [int(v) for v in parts[1:9]]
                vals += [0] * (8 - len(vals))
                user, nice, system, idle, iowait, irq, softirq, st = vals
                busy += user + nice + system + irq + softirq
                steal += st
                total += sum(vals)
    except OSError:
        pass
    return busy, steal, total


def cpu_mhz(cpus: list[int]) -> float | None:
    vals = []
    for c in cpus:
        try:
            vals.append(int(Path(f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq").read_text()) / 1e3)
        except (OSError, ValueError):
            return None
    return sum(vals) / len(vals) if vals else None


class Meter:
    """Readings for the measurement CPUs ``cpus``. ``sources``: name -> cpu.pressure file of
    the contenders (a cgroup's); ``ours``: a callable giving the pids whose CPU time is ours
    on those CPUs (the candidate's process, the baseline workers)."""

    def __init__(self, cpus: list[int], sources: dict[str, str | Path] | None = None, ours=None):
        self.cpus = sorted(cpus)
        self.sources = {k: str(v) for k, v in (sources or {}).items()}
        self.ours = ours or (lambda: [])

    def add_source(self, name: str, path: str | Path | None) -> None:
        if path is not None and pressure_us(path) is not None:
            self.sources[name] = str(path)

    def snapshot(self) -> Snapshot:
        pressure = {k: pressure_us(p) for k, p in self.sources.items()}
        if pressure_available():
            pressure["system"] = pressure_us(SYSTEM_PRESSURE)
        busy, steal, total = _cpu_ticks(self.cpus)
        ours = sum(process_cpu_ns(p) for p in self.ours())
        return Snapshot(time.perf_counter_ns(), {k: v for k, v in pressure.items() if v is not None},
                        busy, steal, total, ours)

    def between(self, a: Snapshot, b: Snapshot, source: str | None = None) -> Reading:
        """What happened from ``a`` to ``b``; ``suffered`` from ``source`` where it was read at
        both ends, else the whole machine's pressure."""
        wall = max(1, b.wall_ns - a.wall_ns)
        shares = {k: min(1.0, max(0.0, (b.pressure_us[k] - a.pressure_us[k]) * 1e3 / wall))
                  for k in a.pressure_us if k in b.pressure_us}
        suffered = shares.get(source) if source in shares else shares.get("system")
        ticks = b.total_ticks - a.total_ticks
        others = steal = None
        if ticks > 0:
            capacity_ns = len(self.cpus) * wall
            busy_ns = (b.busy_ticks - a.busy_ticks) * TICK_NS
            others = min(1.0, max(0.0, (busy_ns - (b.ours_ns - a.ours_ns)) / capacity_ns))
            steal = min(1.0, max(0.0, (b.steal_ticks - a.steal_ticks) / ticks))
        return Reading(wall * 1e-9, suffered, others, steal, cpu_mhz(self.cpus), shares)


def machine_pressure_avg10() -> float | None:
    """The share of the last 10 s some task waited for a CPU, machine-wide (PSI avg10)."""
    try:
        for line in Path(SYSTEM_PRESSURE).read_text().splitlines():
            if line.startswith("some"):
                return float(line.split("avg10=", 1)[1].split()[0]) / 100.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def wait_for_quiet(max_s: float, level: float = QUIET, poll_s: float = 0.5) -> tuple[bool, float]:
    """Wait (at most ``max_s``) until the machine's CPU pressure drops below ``level``;
    returns (quiet, seconds waited). Without PSI, returns at once (unknown is not quiet)."""
    t0 = time.monotonic()
    while True:
        now = machine_pressure_avg10()
        if now is None:
            return False, 0.0
        if now < level:
            return True, time.monotonic() - t0
        if time.monotonic() - t0 >= max_s:
            return False, time.monotonic() - t0
        time.sleep(poll_s)
