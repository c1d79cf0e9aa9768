"""Verification: fresh inputs per case, poisoned outputs, guard zones, read-only inputs,
determinism, and tolerances that can tell right from trivial.

The reference runs here, on the trusted side, never in the candidate's process. Cases of one
shape reuse the same buffers (same addresses, new contents), so a kernel that caches results by
pointer returns stale outputs and is caught.

Every case must be able to fail. A problem states its atol for inputs of order one; a case
whose floating-point inputs are all smaller (the largest RMS below 1) gets that atol scaled by
it, so a bf16-grade error cannot hide under an atol larger than the outputs. Then trivial outputs (zeros, a constant, an input passed through,
the answer shifted by one element) are compared with the case's reference; where one would
still pass, its atol is tightened to half what that answer would need. The tolerance a problem states must also admit torch's own fp32
result (tests/problems check that for every bundled problem).

Every case also carries torch's own fp32 error, and a candidate may be at most K times as far
from the reference (harness/accuracy.py).
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from swarmfactory import heap
from swarmfactory.outcome import Outcome, Rejected
from swarmfactory.harness.accuracy import ErrorStats, error_vs_torch, torch_errors
from swarmfactory.problems.spec import Case, Problem, to_torch


def slot_key(shape) -> str:
    return json.dumps(dict(shape), sort_keys=True)


@dataclass(frozen=True)
class CaseData:
    inputs: dict[str, Any]
    expected: dict[str, np.ndarray]
    atol: dict[str, Any]            # per output: a float or an array broadcastable to it
    tightened: tuple[str, ...] = ()  # outputs whose atol was tightened, with the trivial answer
    # per output: torch's own fp32 error on this case; empty where the problem has no such bound
    torch_error: dict[str, ErrorStats] = field(default_factory=dict)


def _close(exp: np.ndarray, got: np.ndarray, rtol: float, atol) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        ok = np.abs(got - exp) <= atol + rtol * np.abs(exp)
        ok |= np.isnan(exp) & np.isnan(got)
        ok |= np.isinf(exp) & (got == exp)
    return ok


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def trivial_outputs(expected: np.ndarray, inputs: dict) -> dict[str, np.ndarray]:
    """Answers a kernel could give without computing anything."""
    finite = expected[np.isfinite(expected)]
    triv = {"zeros": np.zeros_like(expected),
            "a constant": np.full_like(expected, float(np.median(finite)) if finite.size else 0.0)}
    if expected.size > 1:
        triv["the answer shifted by one element"] = np.roll(expected.reshape(-1), 1).reshape(expected.shape)
    for k, v in inputs.items():
        if isinstance(v, np.ndarray) and v.shape == expected.shape and v.dtype.kind == "f":
            triv[f"the input `{k}` passed through"] = v.astype(np.float64)
    return {k: v for k, v in triv.items() if not _same(v, expected)}


FP32_FLOOR = 1e-44  # a few fp32 denormal steps: no fp32 kernel can be asked to do better


def input_scale(inputs: dict) -> float:
    """The largest RMS among the case's floating-point inputs (their finite values): below 1
    only when every input is small (the `tiny` distribution), where errors shrink with them."""
    scales = []
    for v in inputs.values():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
            finite = v[np.isfinite(v)].astype(np.float64)
            scales.append(float(np.sqrt(np.mean(finite ** 2))) if finite.size else 0.0)
    return max(scales) if scales else 1.0


def case_tolerance(problem: Problem, expected: dict, inputs: dict) -> tuple[dict, tuple[str, ...]]:
    """Per-output atol for one case, tightened where a trivial answer would pass: to half the
    smallest atol that would admit it (never below what fp32 can resolve; a trivial answer that
    only differs from the truth below that is the truth in fp32)."""
    tol = problem.tolerance
    base = problem.atol_for(expected, inputs) if problem.atol_for else {}
    atol, notes = {}, []
    scale = input_scale(inputs)
    for name, exp in expected.items():
        a = base.get(name, tol.atol)
        if name not in base and scale < 1.0:  # a stated atol is for inputs of order one
            a = max(a * scale, FP32_FLOOR)
        mask = np.isfinite(exp)
        finite = np.abs(exp[mask])
        if finite.size and np.all(finite <= np.broadcast_to(a, exp.shape)[mask]):
            # atol covers every output (zeros would pass): it says nothing at this scale, so the
            # absolute slack becomes rtol of the outputs' typical size
            rms = float(np.sqrt(np.mean(finite ** 2)))
            a = np.minimum(a, max(tol.rtol * rms, FP32_FLOOR))
            notes.append(f"{name}: every output within atol (atol -> {float(np.max(a)):.3g})")
        for label, triv in trivial_outputs(exp, inputs).items():
            if not _close(exp, triv, tol.rtol, a).all():
                continue
            finite = np.isfinite(exp) & np.isfinite(triv)
            with np.errstate(invalid="ignore", over="ignore"):
                slack = np.abs(triv - exp)[finite] - tol.rtol * np.abs(exp)[finite]
            needed = float(slack.max()) if slack.size else 0.0
            if needed <= 2 * FP32_FLOOR:
                continue
            a = np.minimum(a, max(0.5 * needed, FP32_FLOOR))
            notes.append(f"{name}: {label} (atol -> {float(np.max(a)):.3g})")
        atol[name] = a
    return atol, tuple(notes)


def case_cache_budget() -> int:
    """Bytes of cases a process keeps: a 48th of the machine's memory, between 256 MiB and 1 GiB
    (512 MiB on 24 GiB). An evicted case costs its reference again when next drawn."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 16 << 30
    return max(256 << 20, min(1 << 30, total // 48))


class CaseCache:
    """Inputs, reference outputs and tolerances per (problem, case), bounded by bytes
    (``case_cache_budget``); thread-safe."""

    def __init__(self, max_bytes: int | None = None):
        self.max_bytes, self.size = case_cache_budget() if max_bytes is None else max_bytes, 0
        self.items: OrderedDict[tuple, tuple[CaseData, int]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, problem: Problem, case: Case) -> CaseData:
        key = (problem.name, problem.spec_hash(), case.key())
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key][0]
        data = expected_for(problem, problem.case_inputs(case))
        nbytes = sum(v.nbytes for v in data.inputs.values() if isinstance(v, np.ndarray))
        nbytes += sum(v.nbytes for v in data.expected.values())
        with self.lock:
            self.items[key] = (data, nbytes)
            self.size += nbytes
            while self.size > self.max_bytes and len(self.items) > 1:
                _, (_, n) = self.items.popitem(last=False)
                self.size -= n
        return data

    def clear(self) -> None:
        """Forget every case (they are recomputed when next drawn)."""
        with self.lock:
            self.items.clear()
            self.size = 0
        heap.trim()


def _fit_torch_threads() -> None:
    """References run on the CPUs this process may use: torch's default (one thread per core)
    on fewer CPUs oversubscribes them, and its spinning threads slow everything 5-10x."""
    import os

    import torch

    n = max(1, len(os.sched_getaffinity(0)))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def expected_for(problem: Problem, inputs: dict) -> CaseData:
    """The reference outputs (float64), the case's tolerance and torch's own fp32 error for
    ``inputs``."""
    _fit_torch_threads()
    ref = problem.reference(to_torch(inputs))
    expected = {k: np.asarray(v.detach().double().numpy() if hasattr(v, "detach") else v, dtype=np.float64)
                for k, v in ref.items()}
    atol, notes = case_tolerance(problem, expected, inputs)
    return CaseData(inputs, expected, atol, notes, torch_errors(problem, inputs, expected, atol))


CASES = CaseCache()


def compare(problem: Problem, expected: dict[str, np.ndarray], got: dict[str, np.ndarray],
            where: str, atol: dict | None = None) -> str | None:
    """None if ``got`` matches within tolerance (NaN where the reference has NaN, the same
    infinities); else the evidence, in one line."""
    tol = problem.tolerance
    for name, exp in expected.items():
        out = got.get(name)
        if out is None:
            return f"output {name} missing"
        if out.dtype != np.float32 or out.shape != exp.shape:
            return f"output {name} is {out.dtype}{list(out.shape)}, expected float32{list(exp.shape)}"
        a = tol.atol if atol is None else atol.get(name, tol.atol)
        g = out.astype(np.float64)
        ok = _close(exp, g, tol.rtol, a)
        if ok.all():
            continue
        bad = np.argwhere(~ok)
        idx = tuple(int(i) for i in bad[0])
        finite = np.isfinite(g) & np.isfinite(exp)
        err = float(np.max(np.abs(g - exp)[finite])) if finite.any() else float("nan")
        note = ""
        if np.isnan(g[idx]) and not np.isnan(exp[idx]):
            note = " (NaN: the poisoned output was never written, or a read past an input's end?)"
        elif np.isnan(exp[idx]):
            note = " (the reference propagates a NaN input here)"
        a_here = float(np.broadcast_to(a, exp.shape)[idx]) if np.ndim(a) else float(a)
        return (f"{len(bad)} of {exp.size} elements of {name} outside rtol={tol.rtol:g} atol={a_here:.3g} "
                f"on {where}; first at {list(idx)}: got {g[idx]:.7g}, expected {exp[idx]:.7g}{note}; "
                f"max abs error {err:.3g}")
    return None


def describe(problem: Problem, case: Case) -> str:
    extra = "".join(f" {k}={v:g}" for k, v in sorted(case.params.items()))
    return f"case {problem.shape_label(case.shape)} seed={case.seed} dist={case.dist}{extra}"


def order_cases(cases: list[Case]) -> list[Case]:
    """Cheap shapes first so a wrong kernel fails fast; stable otherwise."""
    return sorted(cases, key=lambda c: int(np.prod(list(c.shape.values()))))


def check_slot(group, i: int, problem: Problem, data: CaseData, where: str, stage: str,
               check_inputs: bool = True) -> float | None:
    """Guards, read-only inputs and outputs of slot ``i`` against the trusted copies: within the
    case's tolerance and within K times torch's own fp32 error. Returns the error as a multiple
    of torch's (None where the case has no such bound)."""
    damage = group.damage(i)
    if damage:
        raise Rejected(Outcome.WRONG, f"{damage} on {where} (an out-of-bounds write)", stage)
    changed = group.changed_inputs(i) if check_inputs else []
    if changed:
        raise Rejected(Outcome.CHEATED, f"the kernel modified its input `{changed[0]}` on {where} "
                       "(inputs are read-only)", stage)
    outputs = group.outputs(i)
    failure = compare(problem, data.expected, outputs, where, data.atol)
    if failure:
        raise Rejected(Outcome.WRONG, failure, stage)
    ratio, failure = error_vs_torch(problem, data.expected, outputs, data.atol, data.torch_error, where)
    if failure:
        raise Rejected(Outcome.WRONG, failure, stage, error_vs_torch=round(ratio, 3))
    return ratio


def verify(proc, layout, problem: Problem, cases: list[Case], timeout: float,
           stats: dict | None = None) -> int:
    """Run every case in the candidate's process; raise Rejected on the first failure (its
    evidence names the case). ``layout`` maps a shape to its (SlotGroup, slot index).
    ``stats["error_vs_torch"]``: the largest error as a multiple of torch's over the cases."""
    seen: set[str] = set()
    worst = None
    for case in order_cases(cases):
        try:
            ratio = _verify_case(proc, layout, problem, case, timeout, seen)
        except Rejected as rej:
            rej.stage = "verify"
            rej.evidence.setdefault("case", case.key())
            raise
        if ratio is not None and (worst is None or ratio > worst):
            worst = ratio
    if stats is not None:  # over every pass of one evaluation
        before = stats.get("error_vs_torch")
        if worst is not None and (before is None or worst > before):
            stats["error_vs_torch"] = round(worst, 3)
        stats.setdefault("error_vs_torch", None)
    return len(cases)


_DEEP = random.SystemRandom()


def _verify_case(proc, layout, problem: Problem, case: Case, timeout: float, seen: set[str]) -> float | None:
    data = CASES.get(problem, case)
    group = layout[slot_key(case.shape)]
    where = describe(problem, case)
    group.load(0, data.inputs)
    key = slot_key(case.shape)
    # every thread's floating-point state is read after a shape's first call and a random quarter
    # of the others (a read stops every thread: ~0.1 ms each)
    proc.call(group.first, timeout, f"verify ({where})", deep=key not in seen or _DEEP.random() < 0.25)
    ratio = check_slot(group, 0, problem, data, where, "verify")
    if key not in seen:  # determinism, with a different poison value
        seen.add(key)
        first = group.outputs(0)
        group.poison(0, 1e30)
        proc.call(group.first, timeout, f"verify ({where})", deep=False)
        again = group.outputs(0)
        for name, out in first.items():
            if not np.array_equal(out, again[name], equal_nan=True):
                raise Rejected(Outcome.WRONG, f"nondeterministic: two calls on identical inputs "
                               f"gave different `{name}` on {where} (uninitialised or racy reads)", "verify")
    return ratio
