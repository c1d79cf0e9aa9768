"""Baselines: the fastest thing a user has today for an op, chosen by measurement, per shape.

Every baseline of a problem runs eager and (optionally) under torch.compile in its own worker;
the fastest median per workload shape becomes *the* baseline for that shape and is recorded with
the hardware it was measured on. Workers are kept for reuse across evaluations.
"""

from __future__ import annotations

import threading

import numpy as np

from swarmfactory.harness.sandbox import Worker
from swarmfactory.harness.timing import calibrate, sample
from swarmfactory.harness.verify import CASES, compare, slot_key
from swarmfactory.problems.spec import Case, Problem

EAGER_REFERENCE = "eager-reference"


class BaselinePool:
    """Trusted PyTorch contenders in persistent workers, keyed by (problem, baseline, mode)."""

    def __init__(self, cpus: list[int], timeout: float = 600.0):
        self.cpus, self.timeout = cpus, timeout
        self.workers: dict[tuple, Worker] = {}
        self.ready: set[tuple] = set()
        self.lock = threading.Lock()

    def worker(self, problem: Problem, name: str, mode: str) -> Worker:
        key = (problem.name, problem.spec_hash(), name, mode)
        if key not in self.workers:
            w = Worker(cpus=self.cpus, mem_gb=32, cpu_seconds=1 << 20, isolate_net=False, trusted=True)
            w.request({"op": "load_baseline", "problem": problem.source_path, "name": name,
                       "mode": mode, "threads": len(self.cpus)}, self.timeout, "baseline load")
            self.workers[key] = w
        return self.workers[key]

    def set_inputs(self, problem: Problem, name: str, mode: str, slot: str, inputs: dict, shape) -> Worker:
        w = self.worker(problem, name, mode)
        w.request({"op": "set", "slot": slot, "inputs": inputs,
                   "out_shapes": problem.output_shapes(shape)}, self.timeout, "baseline setup")
        return w

    def choose(self, problem: Problem, shape, compile_too: bool, samples: int = 5) -> dict:
        """Time every baseline x mode on ``shape``; return the fastest as a record."""
        inputs, expected = CASES.get(problem, Case(dict(shape), seed=4242))
        slot = "choose-" + slot_key(shape)
        modes = ("eager", "compile") if compile_too else ("eager",)
        results = []
        for name in problem.baselines:
            for mode in modes:
                try:
                    w = self.set_inputs(problem, name, mode, slot, inputs, shape)
                    out = w.request({"op": "call", "slot": slot}, self.timeout, "baseline check")
                except Exception as exc:  # a baseline that fails on this machine is skipped, loudly
                    results.append({"name": name, "mode": mode, "error": str(exc)})
                    continue
                bad = compare(problem, expected, out["outputs"], f"baseline {name}/{mode}")
                iters = calibrate(w, [slot], 1e6, self.timeout, "baseline")
                times = [sample(w, [slot], iters, self.timeout, "baseline")[0] for _ in range(samples)]
                results.append({"name": name, "mode": mode, "us": float(np.median(times)) / 1e3,
                                "within_tolerance": bad is None})
        timed = [r for r in results if "us" in r]
        if not timed:
            raise RuntimeError(f"no baseline of {problem.name} runs here: {results}")
        best = min(timed, key=lambda r: r["us"])
        return {"name": best["name"], "mode": best["mode"], "us": best["us"], "all": results}

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers.clear()
