"""Verification: fresh inputs per case, poisoned outputs, read-only inputs, determinism.

The reference runs here, in the coordinator's process, never in the worker. Cases for the same
shape reuse the worker's buffers, so a kernel that caches results between calls (by pointer)
returns stale outputs and is caught.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from swarmfactory.harness.outcome import Outcome, Rejected
from swarmfactory.harness.worker import digest
from swarmfactory.problems.spec import Case, Problem, to_torch


def slot_key(shape) -> str:
    return json.dumps(dict(shape), sort_keys=True)


class CaseCache:
    """Inputs and reference outputs per (problem, case), bounded by bytes; thread-safe."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes, self.size = max_bytes, 0
        self.items: OrderedDict[tuple, tuple[dict, dict, int]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, problem: Problem, case: Case) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        key = (problem.name, problem.spec_hash(), case.key())
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                inputs, expected, _ = self.items[key]
                return inputs, expected
        inputs = problem.make_inputs(case.shape, np.random.default_rng(case.seed), case.dist)
        ref = problem.reference(to_torch(inputs))
        expected = {k: np.asarray(v.detach().double().numpy() if hasattr(v, "detach") else v,
                                  dtype=np.float64) for k, v in ref.items()}
        nbytes = sum(v.nbytes for v in inputs.values() if isinstance(v, np.ndarray))
        nbytes += sum(v.nbytes for v in expected.values())
        with self.lock:
            self.items[key] = (inputs, expected, nbytes)
            self.size += nbytes
            while self.size > self.max_bytes and len(self.items) > 1:
                _, (_, _, n) = self.items.popitem(last=False)
                self.size -= n
        return inputs, expected


CASES = CaseCache()


def compare(problem: Problem, expected: dict[str, np.ndarray], got: dict[str, np.ndarray],
            where: str) -> str | None:
    """None if ``got`` matches within tolerance; else the evidence, in one line."""
    tol = problem.tolerance
    for name, exp in expected.items():
        out = got.get(name)
        if out is None:
            return f"output {name} missing"
        if out.dtype != np.float32 or out.shape != exp.shape:
            return f"output {name} is {out.dtype}{list(out.shape)}, expected float32{list(exp.shape)}"
        g = out.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            ok = np.abs(g - exp) <= tol.atol + tol.rtol * np.abs(exp)
            ok |= np.isnan(exp) & np.isnan(g)
            ok |= np.isinf(exp) & (g == exp)
        if ok.all():
            continue
        bad = np.argwhere(~ok)
        idx = tuple(int(i) for i in bad[0])
        finite = np.isfinite(g) & np.isfinite(exp)
        err = float(np.max(np.abs(g - exp)[finite])) if finite.any() else float("nan")
        note = " (NaN: the poisoned output was never written?)" if np.isnan(g[idx]) and not np.isnan(exp[idx]) else ""
        return (f"{len(bad)} of {exp.size} elements of {name} outside rtol={tol.rtol:g} atol={tol.atol:g} "
                f"on {where}; first at {list(idx)}: got {g[idx]:.7g}, expected {exp[idx]:.7g}{note}; "
                f"max abs error {err:.3g}")
    return None


def describe(problem: Problem, case: Case) -> str:
    return f"case {problem.shape_label(case.shape)} seed={case.seed} dist={case.dist}"


def order_cases(cases: list[Case]) -> list[Case]:
    """Cheap shapes first so a wrong kernel fails fast; stable otherwise."""
    return sorted(cases, key=lambda c: int(np.prod(list(c.shape.values()))))


def verify(worker, problem: Problem, cases: list[Case], timeout: float) -> int:
    """Run every case in ``worker``; raise Rejected on the first failure (its evidence names the
    case). Returns the number of cases checked."""
    seen_slots: set[str] = set()
    for case in order_cases(cases):
        try:
            _verify_case(worker, problem, case, timeout, seen_slots)
        except Rejected as rej:
            rej.stage = "verify"
            rej.evidence.setdefault("case", case.key())
            raise
    return len(cases)


def _verify_case(worker, problem: Problem, case: Case, timeout: float, seen_slots: set[str]) -> None:
    inputs, expected = CASES.get(problem, case)
    slot = slot_key(case.shape)
    where = describe(problem, case)
    worker.request({"op": "set", "slot": slot, "inputs": inputs,
                    "out_shapes": problem.output_shapes(case.shape)}, timeout, "verify")
    reply = worker.request({"op": "call", "slot": slot}, timeout, f"verify ({where})")
    sent = digest(inputs)
    for name, h in reply["inputs"].items():
        if sent.get(name) != h:
            raise Rejected(Outcome.CHEATED, f"the kernel modified its input `{name}` on {where} "
                           "(inputs are read-only)", "verify")
    failure = compare(problem, expected, reply["outputs"], where)
    if failure:
        raise Rejected(Outcome.WRONG, failure, "verify")
    if slot not in seen_slots:  # determinism, with a different poison value
        seen_slots.add(slot)
        again = worker.request({"op": "call", "slot": slot, "poison": 1e30}, timeout, f"verify ({where})")
        for name, first in reply["outputs"].items():
            if not np.array_equal(first, again["outputs"][name], equal_nan=True):
                raise Rejected(Outcome.WRONG, f"nondeterministic: two calls on identical inputs "
                               f"gave different `{name}` on {where} (uninitialised or racy reads)", "verify")
