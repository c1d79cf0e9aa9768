"""This machine's roofs: read bandwidth by working-set size, and peak fp32 FMA throughput.

Measured with a tiny C microbenchmark built by our own C backend (trusted code, in a process of
its own) and kept in the evidence store and in this machine's cache: a measurement whose repeats
agree (``spread`` within ``REUSE_SPREAD``) is reused for ``REUSE_DAYS`` days by every harness
on the same hardware and thread count (``known_or_measured``), instead of costing each one the
half a minute it takes. A kernel's roofline time is
max(bytes / bandwidth at its working set, flops / peak); its fraction is that over its time.

A roof is a model of the machine and is only as good as its measurement: measured while other
work ran, it comes out low and kernels then appear to beat it. So each figure is the median of
``REPEATS`` runs, a measurement first waits (a while) for the load average to drop, and the
record keeps the load it was measured under (``loadavg``, ``quiet``). A fraction above 1 means
the roof is wrong, not that the kernel beat the machine: ``fraction`` returns None for it and
``describe`` says so, and a caller re-measures with ``remeasure`` (which keeps the higher of
the two roofs: a machine does at least what it has been seen to do).
"""

from __future__ import annotations

import ctypes
import os
import statistics
import time

import numpy as np

REPEATS = 5
QUIET_LOAD = 0.5  # 1-minute load average per CPU under which the machine counts as quiet
QUIET_WAIT_S = 60.0  # how long a measurement waits for that before measuring anyway
BEYOND = 1.02  # fractions up to this are timing noise at the roof, not a wrong roof
REUSE_SPREAD = 1.25  # repeats that agree this well were not disturbed: the record is reused
REUSE_DAYS = 7.0
BYTES_PER_TIMING = 1.5e8  # each bandwidth timing reads this much (about 10 ms at 15 GB/s)
KERNEL = 2  # the microbenchmark's version: records of an earlier one are measured again, not reused
            # (1 used 16-lane vectors everywhere, which an AVX2 machine runs far below its peak)

SOURCE = r"""
#include <stdint.h>
#include <string.h>
/* one full register of fp32 lanes: wider generic vectors than the machine has are split by the
   compiler into spills and scalar code (16-lane vectors on an AVX2 machine measured a peak
   14x too low), and the roof would then be beaten by any good kernel */
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vf __attribute__((vector_size(LANES * 4)));
int lanes(void) { return LANES; }
float read_sum(const float *a, int64_t n, int64_t reps) {
    float total = 0.f;
    #pragma omp parallel reduction(+:total)
    {
        vf acc[8];
        memset(acc, 0, sizeof acc);
        for (int64_t r = 0; r < reps; r++) {
            #pragma omp for schedule(static) nowait
            for (int64_t blk = 0; blk < n / (8 * LANES); blk++)
                for (int j = 0; j < 8; j++) { vf v; memcpy(&v, a + blk * 8 * LANES + j * LANES, LANES * 4); acc[j] += v; }
        }
        for (int j = 0; j < 8; j++) for (int l = 0; l < LANES; l++) total += acc[j][l];
    }
    return total;
}
float fma_peak(int64_t iters) {
    float total = 0.f;
    #pragma omp parallel reduction(+:total)
    {
        vf acc[12]; for (int j = 0; j < 12; j++) for (int l = 0; l < LANES; l++) acc[j][l] = (float)(j + l) * 1e-3f;
        vf m; for (int l = 0; l < LANES; l++) m[l] = 0.999999f;
        vf c; for (int l = 0; l < LANES; l++) c[l] = 1e-6f;
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < 12; j++) acc[j] = acc[j] * m + c;
        for (int j = 0; j < 12; j++) for (int l = 0; l < LANES; l++) total += acc[j][l];
    }
    return total;
}
"""

SIZES = (16 << 10, 256 << 10, 2 << 20, 16 << 20, 256 << 20)


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def wait_for_quiet(cpus: int, limit_s: float = QUIET_WAIT_S, poll_s: float = 5.0) -> bool:
    """Wait up to ``limit_s`` for the 1-minute load average to fall below QUIET_LOAD per CPU of
    the machine; True if it did."""
    threshold = QUIET_LOAD * (os.cpu_count() or cpus)
    deadline = time.monotonic() + limit_s
    while _load() > threshold:
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def measure_roofs(cpus: list[int], wait_s: float = 0.0, repeats: int = REPEATS) -> dict:
    """Measure in a fresh process pinned to ``cpus`` (OpenMP reads its thread count at start),
    after waiting up to ``wait_s`` for a quiet machine. Adds ``loadavg`` (1-minute, before and
    after) and ``quiet`` to the record."""
    import json
    import subprocess
    import sys

    quiet = wait_for_quiet(len(cpus), wait_s)
    before = _load()
    env = dict(os.environ, OMP_NUM_THREADS=str(len(cpus)))
    cmd = [sys.executable, "-m", "swarmfactory.harness.roofline", str(len(cpus)), str(repeats)]
    out = subprocess.run(["taskset", "-c", ",".join(map(str, cpus))] + cmd, env=env,
                         capture_output=True, text=True, timeout=600, check=True)
    roofs = json.loads(out.stdout)
    roofs["loadavg"] = [round(before, 2), round(_load(), 2)]
    roofs["quiet"] = quiet and roofs["loadavg"][1] <= QUIET_LOAD * (os.cpu_count() or len(cpus))
    return roofs


def _measure_here(threads: int, repeats: int = REPEATS) -> dict:
    """{"bandwidth": [[bytes, bytes/s], ...], "peak_flops": flops/s, "threads": n, "repeats": r,
    "spread": worst max/min ratio across the repeats}: each figure the median of ``repeats``
    runs, each run the best of a few timings."""
    from swarmfactory.backends import get_backend

    art = get_backend("c").build(SOURCE, "read_sum")
    lib = ctypes.CDLL(art.path)
    lib.read_sum.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.read_sum.restype = ctypes.c_float
    lib.fma_peak.argtypes = [ctypes.c_int64]
    lib.fma_peak.restype = ctypes.c_float
    lanes = int(lib.lanes())
    arrays = {size: np.ones(size // 4, dtype=np.float32) for size in SIZES}
    runs: dict = {size: [] for size in SIZES}
    peaks = []
    iters = 20_000_000
    for _ in range(repeats):
        for size, a in arrays.items():
            reps = max(1, int(BYTES_PER_TIMING // size))
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                lib.read_sum(a.ctypes.data, a.size, reps)
                best = min(best, time.perf_counter() - t0)
            runs[size].append(size * reps / best)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            lib.fma_peak(iters)
            best = min(best, time.perf_counter() - t0)
        peaks.append(2.0 * lanes * 12 * iters * threads / best)
    spread = max(max(v) / min(v) for v in [*runs.values(), peaks])
    return {"bandwidth": [[size, statistics.median(v)] for size, v in runs.items()],
            "peak_flops": statistics.median(peaks), "threads": threads, "repeats": repeats,
            "spread": round(spread, 3), "lanes": lanes, "kernel": KERNEL}


def fraction(roofs: dict, nbytes: float, flops: float, seconds: float) -> float | None:
    """Roofline time over the kernel's time, or None when that exceeds BEYOND: the roof is
    then wrong (measured low), and the fraction unknown until ``remeasure``."""
    frac = roofline_seconds(roofs, nbytes, flops) / seconds
    return frac if frac <= BEYOND else None


def beaten(roofs: dict, nbytes: float, flops: float, seconds: float) -> bool:
    """Whether a kernel that moved ``nbytes`` and did ``flops`` in ``seconds`` beat the roof."""
    return fraction(roofs, nbytes, flops, seconds) is None


def _cache_path(hardware_id: str, threads: int):
    from swarmfactory.hardware import cache_dir

    return cache_dir() / "roofs" / f"{hardware_id}-{threads}.json"


def _reusable(record: dict | None, measured_at: float | None) -> bool:
    return (bool(record) and "bandwidth" in record and record.get("spread", 99) <= REUSE_SPREAD
            and record.get("kernel") == KERNEL
            and measured_at is not None and time.time() - measured_at <= REUSE_DAYS * 86400)


def _remember(path, roofs: dict) -> None:
    import json

    if _reusable(roofs, roofs.get("measured_at")):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(roofs))
            tmp.replace(path)
        except OSError:
            pass


def known_or_measured(cpus: list[int], store=None) -> dict:
    """This machine's roofs at ``len(cpus)`` threads: the latest record of the store or of this
    machine's cache that is reusable (repeats that agree, measured within REUSE_DAYS), else a new
    measurement, recorded in both (the cache only when reusable)."""
    import json

    from swarmfactory.hardware import cpu_fingerprint

    hw, threads = cpu_fingerprint()["id"], len(cpus)
    if store is not None:
        try:
            latest = store.latest_roofs(threads)
        except Exception:  # an unreadable record is measured again
            latest = None
        if latest is not None and _reusable(*latest):
            return dict(latest[0], reused="store")
    path = _cache_path(hw, threads)
    try:
        cached = json.loads(path.read_text())
        if _reusable(cached, cached.get("measured_at")):
            return dict(cached, reused="cache")
    except (OSError, ValueError):
        pass
    roofs = measure_roofs(cpus)
    roofs["measured_at"] = time.time()
    _remember(path, roofs)
    if store is not None:
        try:
            store.put_roofs(threads, roofs)
        except Exception:
            pass
    return roofs


def remeasure(cpus: list[int], old: dict, wait_s: float = QUIET_WAIT_S) -> dict:
    """A roof was beaten: measure again (waiting for a quiet machine) and keep, per figure, the
    higher of the old and new roofs, since a machine does at least what it was seen to do."""
    new = measure_roofs(cpus, wait_s)
    merged = dict(new)
    old_bw = dict((int(s), r) for s, r in old.get("bandwidth", []))
    merged["bandwidth"] = [[s, max(r, old_bw.get(int(s), 0.0))] for s, r in new["bandwidth"]]
    merged["peak_flops"] = max(new["peak_flops"], old.get("peak_flops", 0.0))
    merged["remeasured"] = int(old.get("remeasured", 0)) + 1
    merged["measured_at"] = time.time()
    merged.pop("reused", None)
    from swarmfactory.hardware import cpu_fingerprint

    _remember(_cache_path(cpu_fingerprint()["id"], len(cpus)), merged)  # the next harness starts from it
    return merged


def describe(frac: float | None, roofs: dict | None = None) -> str:
    """A fraction for people: "87%", or, for one beyond the roof, a statement that the roof is
    wrong rather than a figure above 100%."""
    if frac is None or frac > BEYOND:
        load = f", roof measured at load {roofs['loadavg'][0]}" if roofs and roofs.get("loadavg") else ""
        return f"beyond the measured roof (roof too low{load})"
    return f"{min(frac, 1.0):.0%}"


def roofline_seconds(roofs: dict, nbytes: float, flops: float) -> float:
    """The least time the machine needs: memory at the bandwidth of this working set, or compute."""
    bw = roofs["bandwidth"]
    rate = bw[-1][1]
    for size, r in bw:
        if nbytes <= size:
            rate = r
            break
    return max(nbytes / rate, flops / roofs["peak_flops"])


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(_measure_here(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else REPEATS)))
