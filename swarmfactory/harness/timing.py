"""Timing: samples of >= 1 ms, interleaved contenders, per-round ratios, bootstrap CIs.

The worker reports how long its loop took; the coordinator brackets the request with its own
clock and refuses a report longer than the bracket (a patched timer cannot hide).
"""

from __future__ import annotations

import time

import numpy as np

from swarmfactory.outcome import Outcome, Rejected

MAX_ITERS = 1 << 22


def sample(worker, slots: list[str], iters: int, timeout: float, stage: str,
           outputs: bool = False) -> tuple[float, dict]:
    """One timed loop of ``iters`` calls rotating over ``slots``; returns (ns per call, reply)."""
    t0 = time.perf_counter_ns()
    reply = worker.request({"op": "time", "slots": slots, "iters": iters, "outputs": outputs},
                           timeout, stage)
    wall = time.perf_counter_ns() - t0
    ns = reply["ns"]
    if not 0 < ns <= wall:
        raise Rejected(Outcome.CHEATED, f"the worker reported {ns} ns for a loop the coordinator "
                       f"saw take {wall} ns (timer tampering?)", stage)
    return ns / iters, reply


def calibrate(worker, slots: list[str], min_sample_ns: float, timeout: float, stage: str) -> int:
    """Smallest iteration count (a multiple of the slots, so each is called) whose loop takes
    at least ``min_sample_ns`` at the fastest of three loops."""
    def whole(n: float) -> int:  # the least multiple of the slots at or above n
        return -(-int(n) // len(slots)) * len(slots)

    iters = len(slots)
    sample(worker, slots, 3, timeout, stage)  # warm-up: caches, lazy init, compilation
    while iters < MAX_ITERS:
        per_call, _ = sample(worker, slots, iters, timeout, stage)
        if per_call * iters >= min_sample_ns:
            # the least of three sizes the sample: one slow loop on a busy machine (a stall, the
            # other contender's caches) would otherwise leave every later sample short of the length
            for _ in range(2):
                per_call = min(per_call, sample(worker, slots, iters, timeout, stage)[0])
            need = whole(min_sample_ns / max(per_call, 1e-3))
            return int(min(MAX_ITERS, max(iters, need)))
        grown = max(iters * 2, int(iters * min_sample_ns / max(per_call * iters, 1.0) * 1.2))
        iters = whole(grown)
    return iters


def median_ci(values, resamples: int = 2000, level: float = 0.95, seed: int = 0, block: int | None = None):
    """Median with a percentile-bootstrap confidence interval over ``values`` taken in time
    order (one per round). Rounds are resampled in blocks of consecutive ones (a circular block
    bootstrap; ``block`` defaults to about n^(1/3)): a machine that drifts during a measurement
    (frequency, caches, other work) makes neighbouring rounds alike, and resampling them one by
    one would give an interval narrower than what the next measurement will see."""
    data = np.asarray(values, dtype=float)
    med = float(np.median(data))
    n = len(data)
    if n < 3 or np.all(data == data[0]):
        return med, med, med
    size = block if block is not None else max(1, round(n ** (1 / 3)))
    size = min(max(1, size), n)
    rng = np.random.default_rng(seed)
    nblocks = -(-n // size)
    starts = rng.integers(0, n, (resamples, nblocks))
    idx = (starts[:, :, None] + np.arange(size)[None, None, :]).reshape(resamples, -1)[:, :n] % n
    meds = np.median(data[idx], axis=1)
    alpha = (1 - level) / 2
    return med, float(np.quantile(meds, alpha)), float(np.quantile(meds, 1 - alpha))


def geomean(values) -> float:
    values = np.asarray(values, dtype=float)
    return float(np.exp(np.mean(np.log(values))))
