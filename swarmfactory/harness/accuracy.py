"""Accuracy against torch's own: how far a kernel's outputs may be from the float64 reference.

A fixed tolerance is not enough: it must admit torch's worst case, so a kernel 50x less
accurate than torch almost everywhere fits under it. So every case also carries torch's own
fp32 error (the problem's fp32 torch path on the same inputs, against the same float64
reference), and a candidate's error may be at most K times it, plus a floor of a few fp32 ulps.
The error of an output ``y`` is, per element where ``y`` and the reference ``r`` are finite,
``|y - r| / (|r| + a)``, ``a`` the larger of the case's atol and the output's RMS (relative on
the elements that make the output's scale, a few ulps of that scale on those far below it),
summarised twice: its maximum (a local blunder) and its median (an approximation that is worse
almost everywhere, which the maximum misses where a few ill-conditioned elements dominate
torch's own maximum). Cases whose inputs repeat one magnitude (``repeated_input``) keep the
fixed tolerance only. K and the measured ratios: docs/architecture.md, "Accuracy against
torch's own".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swarmfactory.problems.spec import Problem, lower_precision, to_torch


@dataclass(frozen=True)
class ErrorStats:
    """One output's error against the float64 reference (see ``relative_errors``); for torch's
    own, ``floor``: what a candidate may add to K times it on that case."""

    max: float
    median: float
    floor: float = 0.0
    scale: float | None = None  # the output's RMS (``output_scale``), computed once per case


# -- the bound from torch's own error --------------------------------------------------------------
# K: a candidate's error (max and median) may be at most this multiple of torch's fp32 error on
# the same case. Chosen by measurement (docs/architecture.md, "Accuracy against torch's own").
TORCH_ERROR_MULTIPLE = 16.0
# ... plus this, in units of the relative error: two fp32 ulps (2^-23 is one ulp at the bottom of
# a binade), so where torch happens to be exact a kernel is not asked to be.
TORCH_ERROR_FLOOR = 2.0 ** -22
# ... and, for a problem that declares the length n of its fp32 sums (``Problem.fp32_sum_terms``),
# this many fp32 half-ulps times sqrt(n): what adding them in another order costs.
REORDER_ULPS = 4.0


def error_multiple(problem: Problem) -> float:
    k = problem.torch_error_multiple
    return TORCH_ERROR_MULTIPLE if k is None else float(k)


def fp32_torch_path(problem: Problem):
    """The problem's torch fp32 computation (setup -> fn), or None where it has no such bound:
    its own ``fp32_torch``, else the first baseline that is not a bf16 one, else ``eager``. GPU
    problems (harness/gpu.py) do not use the bound yet."""
    if problem.backend != "c" or error_multiple(problem) <= 0:
        return None
    if problem.fp32_torch is not None:
        return problem.fp32_torch
    for name, setup in problem.baselines.items():
        if not lower_precision(name):
            return setup
    return problem.eager


def output_scale(expected: np.ndarray) -> float:
    """The RMS of an output's finite reference values."""
    finite = expected[np.isfinite(expected)] if not np.isfinite(expected).all() else expected
    return float(np.sqrt(np.mean(np.square(finite, dtype=np.float64)))) if finite.size else 0.0


def relative_errors(expected: np.ndarray, got: np.ndarray, atol, scale: float | None = None) -> np.ndarray:
    """|got - expected| / (|expected| + a) per element where both are finite (flattened), ``a``
    the larger of the case's atol and the output's scale (its RMS, ``output_scale``). Above ``a``
    an error is relative, below it absolute: a few ulps of the output's scale on an element that
    cancels to near 0, or on one 1e30 times smaller than the rest, is what any fp32 evaluation
    may cost."""
    scale = output_scale(expected) if scale is None else scale
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    exp = expected.reshape(-1)
    mask = np.isfinite(exp) & np.isfinite(got)
    whole = bool(mask.all())
    e, g = (exp, got.copy()) if whole else (exp[mask], got[mask])
    if np.ndim(atol):
        a = np.broadcast_to(np.asarray(atol, dtype=np.float64), expected.shape).reshape(-1)
        a = np.maximum(a if whole else a[mask], scale)
    else:
        a = max(float(atol), scale)
    g -= e
    np.abs(g, out=g)
    den = np.abs(e)
    den += a
    with np.errstate(invalid="ignore", divide="ignore"):
        np.divide(g, den, out=g)
    if np.ndim(a) or not a > 0:  # 0 / 0 only where the output, its atol and its scale are all 0
        g[np.isnan(g)] = 0.0
    return g


def error_stats(expected: np.ndarray, got: np.ndarray, atol, scale: float | None = None) -> ErrorStats | None:
    err = relative_errors(expected, got, atol, scale)
    if not err.size:
        return None
    mid = err.size // 2
    err.partition(mid)  # the upper median, in place (err is a fresh array)
    return ErrorStats(float(err[mid:].max()), float(err[mid]))


REPEATED_SHARE = 0.5  # inputs whose values repeat this much get the fixed tolerance only


def repeated_input(inputs: dict) -> str | None:
    """The name of a floating-point input of at least 8 elements whose finite values share one
    magnitude for at least half of them (the ``constant`` and ``alternating`` distributions), or
    None. A sum of identical terms is exact in torch's tree order and some n/4 ulps off in a
    sequential one: a bound from torch's error there would judge the order of a kernel's
    additions, not its accuracy."""
    for name, v in inputs.items():
        if not (isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size >= 8):
            continue
        mags = np.abs(v[np.isfinite(v)])
        if mags.size < 8:
            continue
        if mags.size > 8192:  # a strided sample first: generic inputs are told apart cheaply
            sample = mags[:: mags.size // 4096]
            if np.unique(sample, return_counts=True)[1].max() < 0.5 * REPEATED_SHARE * sample.size:
                continue
        _, counts = np.unique(mags, return_counts=True)
        if counts.max() >= max(8, REPEATED_SHARE * mags.size):
            return name
    return None


def torch_errors(problem: Problem, inputs: dict, expected: dict, atol: dict) -> dict[str, ErrorStats]:
    """Torch's own fp32 answer on ``inputs``, its error per output against ``expected``. A
    problem whose fp32 path cannot run on these inputs gets no bound on this case."""
    setup = fp32_torch_path(problem)
    if setup is None or repeated_input(inputs) is not None:
        return {}
    try:
        out = setup(to_torch(inputs))()
    except Exception:  # noqa: BLE001 - e.g. a library kernel that needs n % 16 == 0
        return {}
    outs = out if isinstance(out, (tuple, list)) else (out,)
    floor = TORCH_ERROR_FLOOR
    if problem.fp32_sum_terms is not None:
        floor += REORDER_ULPS * 2.0 ** -24 * float(np.sqrt(max(1, int(problem.fp32_sum_terms(inputs)))))
    stats = {}
    for arg, o in zip(problem.outputs, outs):
        y = np.asarray(o.detach().float().numpy() if hasattr(o, "detach") else o, dtype=np.float32)
        exp = expected.get(arg.name)
        if exp is None or y.shape != exp.shape:
            continue
        scale = output_scale(exp)
        st = error_stats(exp, y, atol[arg.name], scale)
        if st is not None:
            stats[arg.name] = ErrorStats(st.max, st.median, floor, scale)
    return stats


def error_vs_torch(problem: Problem, expected: dict[str, np.ndarray], got: dict[str, np.ndarray],
                   atol: dict, torch_error: dict[str, ErrorStats], where: str) -> tuple[float | None, str | None]:
    """The candidate's error as a multiple of torch's (the worse of max and median, over the
    outputs; <= K means accepted) and, where it exceeds K, the evidence in one line. The ratio
    is error / (torch's + floor / K), so a case where torch is exact allows the floor."""
    k = error_multiple(problem)
    worst, failure = None, None
    for name, t in torch_error.items():
        if name not in got or name not in expected:
            continue
        c = error_stats(expected[name], got[name], atol[name], t.scale)
        if c is None:
            continue
        floor = t.floor or TORCH_ERROR_FLOOR
        for label, ce, te in (("max", c.max, t.max), ("median", c.median, t.median)):
            ratio = ce / (te + floor / k)
            if worst is not None and ratio <= worst:
                continue
            worst = ratio
            if ratio > k:  # the evidence names the worst excess
                failure = (f"{label} error {ce:.2g} of {name} is {ratio:.0f}x torch fp32's own ({te:.2g}) on {where}; "
                           f"allowed {k:g}x (per element |y - ref| / (|ref| + max(atol, RMS of ref)); "
                           f"bound {k:g} x torch's + {floor:.2g})")
    return worst, failure
