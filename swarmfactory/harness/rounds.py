"""Interleaved rounds, each with the contention its samples suffered.

A round times, per workload shape, the candidate and the baseline (a multi-threaded baseline also
on one thread: ``SINGLE``; the chosen baseline's rivals: ``RIVAL``; and, every other round, the
eager reference) in alternating order.
While a contender runs, the time it spent ready to run but waiting for a CPU is read from its
cgroup's CPU pressure (Linux PSI; the machine's where it has no cgroup of its own), and over the
whole round the share of the measurement CPUs' time that processes other than ours used
(/proc/stat, less our processes' CPU time). A round is *disturbed* when a contender waited more
than ``contention.BUSY`` of its timed time *and* other processes used more than ``OTHERS_BUSY``
of the CPUs meanwhile: a wait with nobody else running is the contender's own threads waiting for
each other (an OpenMP pool beside its caller), not interference. It is not always the same in
every round (a team can stall for whole rounds waiting for a wake-up of one of its own), which
is why a multi-threaded yardstick is also timed on one thread (``verdicts.yardstick_times``). A
disturbed round is not evidence. It is replaced by another, up to as many rounds again, after
waiting (bounded) for other processes to leave the measurement CPUs; with fewer than
``min_clean`` clean rounds the measurement says so instead of giving a figure.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from swarmfactory import contention
from swarmfactory.contention import pressure_us
from swarmfactory.harness.timing import sample

WAIT_PER_ROUND_S = 5.0     # waiting for a quieter machine before a replacement round
WAIT_TOTAL_S = 30.0        # ... and over one measurement
OTHERS_BUSY = 0.05         # other processes' share of the measurement CPUs that makes a wait theirs
SINGLE = "baseline, one thread"  # a multi-threaded yardstick's one-thread runner, timed beside it
RIVAL = "baseline, rival "       # + a number: a rival of the chosen baseline, timed beside it


def yardsticks(s: dict) -> list[str]:
    """The runners of a shape's setup whose fastest time in a round is that round's yardstick:
    the chosen baseline, its one-thread runner, its rivals (``baselines.rivals``)."""
    return [n for n in s["times"] if n == "baseline" or n == SINGLE or n.startswith(RIVAL)]


@dataclass
class RoundsLog:
    """What the rounds of one measurement saw."""

    planned: int
    run: int = 0
    clean: list[int] = field(default_factory=list)       # indices of the clean rounds
    suffered: list[dict[str, float]] = field(default_factory=list)  # per round: contender -> share
    others: list[float | None] = field(default_factory=list)  # per round: other processes' CPU share
    waited_s: float = 0.0
    machine: dict = field(default_factory=dict)          # the whole measurement: others, steal, mhz
    source: str = ""                                     # where the pressure was read, per contender

    @property
    def disturbed(self) -> int:
        return self.run - len(self.clean)

    def worst(self, name: str) -> float:
        vals = [r[name] for r in self.suffered if name in r]
        return max(vals) if vals else 0.0

    def other(self, i: int) -> float | None:
        """Round ``i``'s share of the measurement CPUs other processes used (None: unknown)."""
        return self.others[i] if i < len(self.others) else None

    def mean(self, name: str, clean_only: bool = False, theirs: bool = False) -> float:
        """The mean share ``name`` waited over the rounds (``clean_only``: the figure's); with
        ``theirs``, only the waits other processes caused (rounds where they ran)."""
        idx = self.clean if clean_only else range(len(self.suffered))
        vals = [self.suffered[i][name] if not theirs or _theirs(self.other(i)) else 0.0
                for i in idx if self.suffered[i].get(name) is not None]
        return sum(vals) / len(vals) if vals else 0.0


def _theirs(others: float | None) -> bool:
    """Other processes ran on the measurement CPUs during a round (unknown counts as yes)."""
    return others is None or others > OTHERS_BUSY


class _Pressure:
    """Stall time of one contender while it runs: its cgroup's, else the machine's."""

    def __init__(self, path: str | None):
        self.path = path if path and pressure_us(path) is not None else None
        self.machine = self.path is None and contention.pressure_available()
        self.shared = False  # this process's threads may run on the contender's CPUs

    def read(self) -> int | None:
        if self.path:
            return pressure_us(self.path)
        return pressure_us(contention.SYSTEM_PRESSURE) if self.machine else None

    def share(self, before: int | None, after: int | None, window_ns: float) -> float | None:
        if before is None or after is None or window_ns <= 0:
            return None
        return min(1.0, max(0.0, (after - before) * 1e3 / window_ns))


def run_rounds(timer, setups: list[dict], rounds: int, timeout: float, min_clean: int,
               candidate_pressure: str | None, measure_cpus: list[int], ours=None) -> RoundsLog:
    """Rounds until ``rounds`` clean ones or ``rounds`` more were tried; appends each round's
    timings to ``s["times"]`` (all of them: the caller keeps the clean ones, ``log.clean``).
    Where this thread shares the measurement CPUs (no others to keep to), the CPU time this
    process spent during a candidate's sample (its probes, its checks) is taken off the stall:
    that wait is the harness's own, the same in every round, not other work."""
    log = RoundsLog(planned=rounds)
    cand = _Pressure(candidate_pressure)
    cand.shared = bool(set(os.sched_getaffinity(0)) & set(measure_cpus))
    workers = {id(w): _Pressure(w.pressure_file) for s in setups for w in s["workers"].values()}
    base = [workers[id(s["workers"]["baseline"])] for s in setups]
    where = lambda p: "cgroup" if p.path else ("machine" if p.machine else "unavailable")  # noqa: E731
    log.source = f"candidate: {where(cand)}, baseline: {'/'.join(sorted({where(b) for b in base}))}"
    meter = contention.Meter(list(measure_cpus), ours=ours or (lambda: [os.getpid()]))
    start = meter.snapshot()
    r = 0
    while len(log.clean) < rounds and r < 2 * rounds:
        if r >= rounds and log.waited_s < WAIT_TOTAL_S:  # a replacement: wait for quiet first
            log.waited_s += _wait_for_others(meter, min(WAIT_PER_ROUND_S, WAIT_TOTAL_S - log.waited_s))
        before = meter.snapshot()
        suffered = _round(timer, setups, r, rounds, timeout, cand, workers)
        others = meter.between(before, meter.snapshot()).others
        log.suffered.append(suffered)
        log.others.append(others)
        if all(v is None or v <= contention.BUSY for v in suffered.values()) or not _theirs(others):
            log.clean.append(r)
        r += 1
        log.run = r
        if r >= rounds and len(log.clean) + (2 * rounds - r) < min_clean:
            break  # even every remaining round clean would not be enough
    # over the whole measurement: the measurement CPUs' time other processes used, the
    # hypervisor's steal, the frequency at the end
    reading = meter.between(start, meter.snapshot())
    log.machine = {k: v for k, v in reading.as_dict().items() if k in ("others", "steal", "mhz")}
    return log


def _wait_for_others(meter: contention.Meter, max_s: float, window_s: float = 0.5) -> float:
    """Wait (at most ``max_s``) for a window in which other processes used under
    ``contention.QUIET`` of the measurement CPUs; returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 + window_s <= max_s:
        a = meter.snapshot()
        time.sleep(window_s)
        others = meter.between(a, meter.snapshot()).others
        if others is not None and others < contention.QUIET:
            break
    return time.monotonic() - t0


def _round(timer, setups: list[dict], r: int, rounds: int, timeout: float, cand: _Pressure,
           workers: dict[int, _Pressure]) -> dict:
    """One round over every shape; the share of its timed time each contender waited
    (``workers``: each trusted worker's pressure, by ``id``)."""
    stall = {"candidate": 0.0, "baseline": 0.0}
    timed = {"candidate": 0.0, "baseline": 0.0}
    known = {"candidate": True, "baseline": True}
    for s in setups:
        # the eager reference only informs the "vs eager" column: every other round
        order = ["candidate"] + yardsticks(s) + (["reference"] if r % 4 in (0, 3) else [])
        if r % 2:
            order.reverse()
        for name in order:
            if name == "candidate":
                p0, t0, own0 = cand.read(), time.perf_counter_ns(), time.process_time_ns()
                per_call, ns = None, 0.0
                while per_call is None:  # audits are checked, not timed
                    per_call = timer.sample(s, r in (0, rounds - 1))
                    ns += timer.last_ns
                p1 = cand.read()
                if cand.shared and p0 is not None and p1 is not None:  # our own share of the wait
                    p1 = max(p0, p1 - (time.process_time_ns() - own0) // 1000)
                share = cand.share(p0, p1, ns if cand.path else time.perf_counter_ns() - t0)
                s["times"][name].append(per_call)
            else:
                w = s["workers"][name]
                p = workers[id(w)]
                w.thaw()
                try:
                    p0, t0 = p.read(), time.perf_counter_ns()
                    per_call, reply = sample(w, s["slots"], s["iters"][name], timeout, f"measure ({name})")
                    share = p.share(p0, p.read(), reply["ns"] if p.path else time.perf_counter_ns() - t0)
                finally:
                    w.freeze()
                s["times"][name].append(per_call)
                if name == "reference":
                    continue
                ns = reply["ns"]
            who = "candidate" if name == "candidate" else "baseline"  # every yardstick runner's waits are the yardstick's
            if share is None:
                known[who] = False
            else:
                stall[who] += share * ns
                timed[who] += ns
    return {k: (stall[k] / timed[k] if known[k] and timed[k] > 0 else None) for k in stall}
