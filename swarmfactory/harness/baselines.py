"""Baselines: the fastest thing a user has today for an op, chosen by measurement, per shape.

Every baseline of a problem runs as a user would run it: the default environment (no OpenMP wait
policy), eager and (optionally) under torch.compile, at each thread count worth trying on the
measurement CPUs (1, powers of two, all of them). The fastest median per workload shape becomes
*the* baseline for that shape and is recorded, settings included, with the hardware it was
measured on. Workers are kept for reuse across evaluations.
"""

from __future__ import annotations

import threading

import numpy as np

from swarmfactory.harness.sandbox import Worker
from swarmfactory.harness.timing import calibrate, sample
from swarmfactory.harness.verify import CASES, compare, slot_key
from swarmfactory.problems.spec import Case, Problem

EAGER_REFERENCE = "eager-reference"


def thread_counts(cpus: int) -> list[int]:
    counts, n = {1, cpus}, 2
    while n < cpus:
        counts.add(n)
        n *= 2
    return sorted(counts)


class BaselinePool:
    """Trusted PyTorch contenders in persistent workers, keyed by (problem, baseline, mode, threads)."""

    def __init__(self, cpus: list[int], timeout: float = 600.0):
        self.cpus, self.timeout = cpus, timeout
        self.workers: dict[tuple, Worker] = {}
        self.lock = threading.Lock()

    def worker(self, problem: Problem, name: str, mode: str, threads: int | None = None) -> Worker:
        threads = threads or len(self.cpus)
        key = (problem.name, problem.spec_hash(), name, mode, threads)
        if key not in self.workers:
            w = Worker(cpus=self.cpus, mem_gb=32, cpu_seconds=1 << 20, isolate_net=False, trusted=True)
            w.request({"op": "load_baseline", "problem": problem.source_path, "name": name,
                       "mode": mode, "threads": threads}, self.timeout, "baseline load")
            self.workers[key] = w
        return self.workers[key]

    def set_inputs(self, problem: Problem, name: str, mode: str, slot: str, inputs: dict, shape,
                   threads: int | None = None) -> Worker:
        w = self.worker(problem, name, mode, threads)
        w.request({"op": "set", "slot": slot, "inputs": inputs,
                   "out_shapes": problem.output_shapes(shape)}, self.timeout, "baseline setup")
        return w

    def choose(self, problem: Problem, shape, compile_too: bool, samples: int = 5) -> dict:
        """Time every baseline x mode x thread count on ``shape``; return the fastest as a record."""
        data = CASES.get(problem, Case(dict(shape), seed=4242))
        slot = "choose-" + slot_key(shape)
        modes = ("eager", "compile") if compile_too else ("eager",)
        results = []
        for name in problem.baselines:
            for mode in modes:
                for threads in thread_counts(len(self.cpus)):
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
                        key = (problem.name, problem.spec_hash(), name, mode, threads)
                        if key in self.workers:
                            self.workers[key].freeze()
                    results.append({"name": name, "mode": mode, "threads": threads,
                                    "us": float(np.median(times)) / 1e3, "within_tolerance": bad is None})
        timed = [r for r in results if "us" in r]
        if not timed:
            raise RuntimeError(f"no baseline of {problem.name} runs here: {results}")
        best = min(timed, key=lambda r: r["us"])
        return {"name": best["name"], "mode": best["mode"], "threads": best["threads"], "us": best["us"],
                "environment": "default (no OpenMP wait policy)", "all": results}

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers.clear()
