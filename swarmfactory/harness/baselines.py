"""Baselines: the fastest thing a user has today for an op, chosen by measurement, per shape.

Every baseline of a problem runs as a user would run it: the default environment (no OpenMP wait
policy), eager and (optionally) under torch.compile, at each thread count worth trying on the
measurement CPUs (1, powers of two, all of them). The fastest median per workload shape becomes
*the* baseline for that shape and is recorded, settings included, with the hardware it was
measured on.

A choice is made from a few samples on one input set with warm caches; in a measurement's
rounds the inputs rotate, and the order of close contenders can change (a dequantise-then-matmul
chosen at 262 us read 504 us in the rounds of the same evening, where the engine's own kernel it
had beaten by a few percent held its figure; identical code then read 1.3-1.7x faster than
"the baseline"). So the chosen baseline is not the yardstick alone: its ``rivals`` (the other
contenders within ``RIVAL_RATIO`` of it when chosen, and always the engine's own kernel, which is
what a kernel must beat) are timed beside it in every round, and each round's yardstick is the
fastest of them (``verdicts.yardstick_times``).

Workers are kept for reuse across evaluations, within a budget: one worker per (problem,
baseline) serves every mode and thread count (a torch import is most of a worker's memory), and
the pool holds at most ``max_workers`` workers and ``max_bytes`` resident bytes, sized from the
machine; past either, the least recently used worker that the current measurement does not hold
is closed (it is started again, in a second or two, if a later evaluation needs it).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np

from swarmfactory.harness.sandbox import Worker
from swarmfactory.harness.timing import calibrate, sample
from swarmfactory.harness.verify import CASES, compare, slot_key
from swarmfactory.problems.spec import Case, Problem

EAGER_REFERENCE = "eager-reference"
RIVAL_RATIO = 2.0   # a contender this many times slower than the chosen one when chosen is no rival
MAX_RIVALS = 2      # rivals timed beside the chosen baseline in every round, at most


def thread_counts(cpus: int, most: int | None = None) -> list[int]:
    """The thread counts a baseline is timed on: 1, the powers of two below ``cpus``, and
    ``cpus``; none above ``most`` (``Problem.baseline_threads``) where given."""
    counts, n = {1, cpus}, 2
    while n < cpus:
        counts.add(n)
        n *= 2
    return sorted(c for c in counts if most is None or c <= most)


def resident_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def default_budget(cpus: int) -> tuple[int, int]:
    """(workers, resident bytes) the pool may hold on this machine: two per measurement CPU plus
    two (a measurement holds a baseline and the eager reference), at most eight; and a
    sixteenth of the machine's memory, between 1 and 4 GiB (a worker is 200-450 MB)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        total = 16 << 30
    return min(8, 2 + 2 * max(1, cpus)), int(min(4 << 30, max(1 << 30, total // 16)))


class BaselineHandle:
    """One runner (mode, thread count) of a baseline's worker: requests name it; everything else
    (freeze, thaw, the process, its pressure file) is the worker's."""

    def __init__(self, worker: Worker, mode: str, threads: int):
        self.worker, self.runner = worker, [mode, threads]

    def request(self, msg: dict, timeout: float, stage: str) -> dict:
        return self.worker.request({**msg, "runner": self.runner}, timeout, stage)

    def __getattr__(self, name):
        return getattr(self.worker, name)


class BaselinePool:
    """Trusted PyTorch contenders in persistent workers, one per (problem, baseline), within a
    budget of workers and resident bytes."""

    def __init__(self, cpus: list[int], timeout: float = 600.0, max_workers: int | None = None,
                 max_bytes: int | None = None):
        self.cpus, self.timeout = cpus, timeout
        workers, nbytes = default_budget(len(cpus))
        self.max_workers = max(2, max_workers or workers)
        self.max_bytes = max_bytes or nbytes
        self.workers: "OrderedDict[tuple, Worker]" = OrderedDict()  # least recently used first
        self.handles: dict[tuple, BaselineHandle] = {}
        self.held: set[tuple] = set()  # the current measurement's workers: never evicted
        self.peak = {"workers": 0, "bytes": 0}
        self.evicted = 0
        self.lock = threading.RLock()

    def hold_none(self) -> None:
        """A new measurement starts: the workers the last one used may be evicted again."""
        with self.lock:
            self.held.clear()

    def release(self) -> None:
        """A measurement ended: its workers may be evicted, and are, down to the budget (a worker
        grows while it measures, past what its admission counted)."""
        with self.lock:
            self.held.clear()
            self._evict(room_for=0)

    def resident(self) -> int:
        return sum(resident_bytes(w.proc.pid) for w in self.workers.values())

    def _evict(self, room_for: int) -> None:
        """Close least recently used workers not held until ``room_for`` more fit the budget."""
        for key in list(self.workers):
            if len(self.workers) + room_for <= self.max_workers and self.resident() <= self.max_bytes:
                return
            if key in self.held:
                continue
            self._drop(key)
            self.evicted += 1

    def _drop(self, key: tuple) -> None:
        w = self.workers.pop(key)
        for hk in [hk for hk in self.handles if hk[0] == key]:
            del self.handles[hk]
        w.close()

    def worker(self, problem: Problem, name: str, mode: str, threads: int | None = None) -> BaselineHandle:
        threads = threads or len(self.cpus)
        key = (problem.name, problem.spec_hash(), name)
        with self.lock:
            self.held.add(key)
            if key in self.workers and self.workers[key].proc.poll() is not None:
                self._drop(key)  # killed (a request timed out): a fresh one serves from now on
            if key not in self.workers:
                self._evict(room_for=1)
                self.workers[key] = Worker(cpus=self.cpus, mem_gb=32, cpu_seconds=1 << 20,
                                           isolate_net=False, trusted=True)
            self.workers.move_to_end(key)
            w = self.workers[key]
            hkey = (key, mode, threads)
            if hkey not in self.handles:
                try:
                    w.request({"op": "load_baseline", "problem": problem.source_path, "name": name,
                               "mode": mode, "threads": threads}, self.timeout, "baseline load")
                except Exception:
                    if w.proc.poll() is not None:  # dead: a later request starts a fresh one
                        self._drop(key)
                    raise
                self.handles[hkey] = BaselineHandle(w, mode, threads)
            self.peak["workers"] = max(self.peak["workers"], len(self.workers))
            self.peak["bytes"] = max(self.peak["bytes"], self.resident())
            return self.handles[hkey]

    def set_inputs(self, problem: Problem, name: str, mode: str, slot: str, inputs: dict, shape,
                   threads: int | None = None) -> BaselineHandle:
        w = self.worker(problem, name, mode, threads)
        reply = w.request({"op": "set", "slot": slot, "inputs": inputs,
                           "out_shapes": problem.output_shapes(shape)}, self.timeout, "baseline setup")
        w.native = bool(reply.get("native"))  # the engine's own C, timed in a C loop: no Python dispatch
        return w

    def choose(self, problem: Problem, shape, compile_too: bool, samples: int = 5) -> dict:
        """Time every baseline x mode x thread count on ``shape``; return the fastest as a record."""
        data = CASES.get(problem, Case(dict(shape), seed=4242))
        slot = "choose-" + slot_key(shape)
        modes = ("eager", "compile") if compile_too else ("eager",)
        results = []
        for name in problem.baselines:
            for mode in modes:
                for threads in thread_counts(len(self.cpus), problem.baseline_threads):
                    try:
                        w = self.set_inputs(problem, name, mode, slot, data.inputs, shape, threads)
                        out = w.request({"op": "call", "slot": slot}, self.timeout, "baseline check")
                        bad = compare(problem, data.expected, out["outputs"], f"baseline {name}/{mode}", data.atol)
                        iters = calibrate(w, [slot], 1e6, self.timeout, "baseline")
                        times = [sample(w, [slot], iters, self.timeout, "baseline")[0] for _ in range(samples)]
                    except Exception as exc:  # a baseline that fails on this machine is skipped, loudly
                        results.append({"name": name, "mode": mode, "threads": threads, "error": str(exc)})
                        continue
                    finally:
                        key = (problem.name, problem.spec_hash(), name)
                        if key in self.workers:
                            self.workers[key].freeze()
                    results.append({"name": name, "mode": mode, "threads": threads,
                                    "us": float(np.median(times)) / 1e3, "within_tolerance": bad is None,
                                    "native": w.native})
        timed = [r for r in results if "us" in r]
        if not timed:
            raise RuntimeError(f"no baseline of {problem.name} runs here: {results}")
        best = min(timed, key=lambda r: r["us"])
        return {"name": best["name"], "mode": best["mode"], "threads": best["threads"], "us": best["us"],
                "native": best["native"], "environment": "default (no OpenMP wait policy)", "all": results}

    def close(self) -> None:
        with self.lock:
            for w in self.workers.values():
                w.close()
            self.workers.clear()
            self.handles.clear()
            self.held.clear()


def rivals(choice: dict, ratio: float = RIVAL_RATIO, most: int = MAX_RIVALS) -> list[dict]:
    """The contenders timed beside the chosen baseline in every round (``choice["all"]``, the
    record ``BaselinePool.choose`` made): per other baseline or mode, its fastest thread count
    that ran within tolerance, where it was within ``ratio`` of the chosen one's figure or runs the
    engine's own code (``native``); the engine's first, then the fastest, at most ``most``. The
    chosen one's own one-thread runner is not among them (``rounds.SINGLE`` times it where the
    chosen one runs on several threads)."""
    best = choice.get("us")
    picked: dict[tuple, dict] = {}
    for r in choice.get("all") or []:
        if "us" not in r or not r.get("within_tolerance", True):
            continue
        if r["name"] == choice["name"] and r["mode"] == choice["mode"]:
            continue  # the chosen one itself, at another thread count: SINGLE covers one thread
        if not (r.get("native") or (best and r["us"] <= ratio * best)):
            continue
        key = (r["name"], r["mode"])
        if key not in picked or r["us"] < picked[key]["us"]:
            picked[key] = r
    ordered = sorted(picked.values(), key=lambda r: (not r.get("native"), r["us"]))
    return [{k: r[k] for k in ("name", "mode", "threads", "us", "native") if k in r} for r in ordered[:most]]
