"""This machine's roofs: read bandwidth by working-set size, and peak fp32 FMA throughput.

Measured once per hardware fingerprint with a tiny C microbenchmark built by our own C backend
(trusted code, run in-process) and kept in the evidence store. A kernel's roofline time is
max(bytes / bandwidth at its working set, flops / peak); its fraction is that over its time.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

SOURCE = r"""
#include <stdint.h>
#include <string.h>
typedef float vf __attribute__((vector_size(64)));
float read_sum(const float *a, int64_t n, int64_t reps) {
    float total = 0.f;
    #pragma omp parallel reduction(+:total)
    {
        vf acc[8];
        memset(acc, 0, sizeof acc);
        for (int64_t r = 0; r < reps; r++) {
            #pragma omp for schedule(static) nowait
            for (int64_t blk = 0; blk < n / 128; blk++)
                for (int j = 0; j < 8; j++) { vf v; memcpy(&v, a + blk * 128 + j * 16, 64); acc[j] += v; }
        }
        for (int j = 0; j < 8; j++) for (int l = 0; l < 16; l++) total += acc[j][l];
    }
    return total;
}
float fma_peak(int64_t iters) {
    float total = 0.f;
    #pragma omp parallel reduction(+:total)
    {
        typedef float wf __attribute__((vector_size(64)));
        wf acc[12]; for (int j = 0; j < 12; j++) for (int l = 0; l < 16; l++) acc[j][l] = (float)(j + l) * 1e-3f;
        wf m; for (int l = 0; l < 16; l++) m[l] = 0.999999f;
        wf c; for (int l = 0; l < 16; l++) c[l] = 1e-6f;
        for (int64_t i = 0; i < iters; i++)
            for (int j = 0; j < 12; j++) acc[j] = acc[j] * m + c;
        for (int j = 0; j < 12; j++) for (int l = 0; l < 16; l++) total += acc[j][l];
    }
    return total;
}
"""

SIZES = (16 << 10, 256 << 10, 2 << 20, 16 << 20, 256 << 20)


def measure_roofs(cpus: list[int]) -> dict:
    """Measure in a fresh process pinned to ``cpus`` (OpenMP reads its thread count at start)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS=str(len(cpus)))
    cmd = [sys.executable, "-m", "swarmfactory.harness.roofline", str(len(cpus))]
    out = subprocess.run(["taskset", "-c", ",".join(map(str, cpus))] + cmd, env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


def _measure_here(threads: int) -> dict:
    """{"bandwidth": [[bytes, bytes/s], ...], "peak_flops": flops/s, "threads": n}."""
    from swarmfactory.backends import get_backend

    art = get_backend("c").build(SOURCE, "read_sum")
    lib = ctypes.CDLL(art.path)
    lib.read_sum.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.read_sum.restype = ctypes.c_float
    lib.fma_peak.argtypes = [ctypes.c_int64]
    lib.fma_peak.restype = ctypes.c_float
    bw = []
    for size in SIZES:
        a = np.ones(size // 4, dtype=np.float32)
        reps = max(1, int(5e8 // size))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            lib.read_sum(a.ctypes.data, a.size, reps)
            best = min(best, time.perf_counter() - t0)
        bw.append([size, size * reps / best])
    iters = 20_000_000
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        lib.fma_peak(iters)
        best = min(best, time.perf_counter() - t0)
    flops = 2.0 * 16 * 12 * iters * threads / best
    return {"bandwidth": bw, "peak_flops": flops, "threads": threads}


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

    print(json.dumps(_measure_here(int(sys.argv[1]))))
