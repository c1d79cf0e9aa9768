"""The native GGUF linear kernel (``qnative``) against what the engine would run instead, at
Gemma 3 270M's shapes: K=640 -> N=1024 (q), 256 (k, v), 2048 (gate, up); K=1024 -> 640 (attn
output); K=2048 -> 640 (down); the tied embedding as output head (N=262144, K=640, Q8_0).

Each type whose block fits K (the K-quants need K % 256 == 0) at M = 1, 4, 16, 64 rows:
``qnative`` with fp32 and with bf16 activations; ``kernels.Dense`` with the weight dequantised
to fp32 (sgemm) and to bf16 (oneDNN prepacked, or fp32 sgemm on bf16-rounded weights where
this CPU has no bf16 path); torch's int4 kernel where it applies (Q4_1: ``int4pack``, Q8_0:
``int4x2``; bf16 only); where this build runs a type on its packed copy (qlinear.c, the
32-element types with vpdpbusd), ``stored fp32``: the stored layout's kernel, fp32. The weights are random blocks with realistic scales (speed does not
depend on the values); each shape's result is checked against the dequantised reference first.

Each contender rotates over copies of its weights covering twice the last-level cache, so every
call reads them from memory as in a model's decode step (``--warm``: one copy, cache-resident).
Timing: in-process (the engine's own kernels, not a candidate's), all contenders interleaved in
ABBA order over ``--rounds`` rounds, each sample >= 1 ms of calls rotating over 4 inputs;
each contender at the faster of 1 and ``--threads`` threads (measured first: on a busy
machine a fork/join kernel can lose a scheduler slice per call to its second thread);
reported: median time per call, GB/s of stored weights read per call, and the median ratio
(contender / qnative, > 1: qnative faster) with a 95% block-bootstrap interval. The machine's
contention is read around every row (swarmfactory.contention: the share of time our threads
waited for a CPU, other processes' share of the CPUs, steal) and the load average at both ends.

With ``--clock cpu`` the samples are the calling thread's CPU time and every contender runs on
one thread: on a machine busy with other work, wall time mostly says how much CPU the process
was given; CPU time still compares what each kernel costs.

    .venv/bin/python benchmarks/qlinear.py [--rounds 10] [--threads N] [--ms 1,4,16,64] [--clock wall|cpu]
                                           [--shapes all] [--warm] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from rich.console import Console
from rich.table import Table

from swarmfactory.contention import Meter
from swarmfactory.engine.capabilities import check
from swarmfactory.engine.gguf_loader import QuantTensor
from swarmfactory.engine.kernels import Dense, Int4Pack, Int4x2, Weight, kernel_class
from swarmfactory.engine.native import qlinear as ql
from swarmfactory.hardware import cache_sizes, cpu_fingerprint, environment_snapshot
from swarmfactory.harness.timing import median_ci

SHAPES = [  # (op, K, N)
    ("q", 640, 1024), ("k/v", 640, 256), ("gate/up", 640, 2048),
    ("o", 1024, 640), ("down", 2048, 640), ("lm_head", 640, 262144),
]
LM_HEAD_TYPES = (QT.Q8_0,)  # the file's tied embedding


CLOCK = time.perf_counter_ns  # or time.thread_time_ns (--clock cpu)


def per_call(fn, xs, min_ns: float = 1e6) -> tuple[int, float]:
    """Calls per sample (>= min_ns of them) and a first estimate, after a warm-up."""
    for x in xs:
        fn(x)
    n = 1
    while True:
        t0 = CLOCK()
        for i in range(n):
            fn(xs[i % len(xs)])
        dt = CLOCK() - t0
        if dt >= min_ns:
            return n, dt / n
        n = max(n * 2, int(n * min_ns / max(dt, 1) * 1.2))


def sample(fn, xs, n: int, threads: int) -> float:
    torch.set_num_threads(threads)  # torch's kernels and qnative's (it reads torch's count)
    t0 = CLOCK()
    for i in range(n):
        fn(xs[i % len(xs)])
    return (CLOCK() - t0) / n


def best_threads(fn, xs, n: int, most: int) -> int:
    """The faster of 1 and ``most`` threads for this contender (median of 3 samples each): on a
    busy machine a fork/join kernel can lose a scheduler slice per call to its second thread."""
    if most <= 1:
        return 1
    med = {t: sorted(sample(fn, xs, n, t) for _ in range(3))[1] for t in (1, most)}
    return min(med, key=med.get)


def measure(contenders: dict, xs: dict, rounds: int, most: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """ns per call of each contender per round (ABBA order, the mean of its two samples), each at
    its best thread count (returned too)."""
    names = list(contenders)
    torch.set_num_threads(most)
    iters = {k: per_call(contenders[k], xs[k])[0] for k in names}
    threads = {k: best_threads(contenders[k], xs[k], iters[k], most) for k in names}
    times: dict[str, list[float]] = {k: [] for k in names}
    gc.disable()
    try:
        for _ in range(rounds):
            got: dict[str, list[float]] = {k: [] for k in names}
            for k in names + names[::-1]:
                got[k].append(sample(contenders[k], xs[k], iters[k], threads[k]))
            for k in names:
                times[k].append(sum(got[k]) / 2)
    finally:
        gc.enable()
        torch.set_num_threads(most)
    return times, threads


class Rotating:
    """Copies of one kernel (each with its own weights), called in turn: with copies covering
    twice the last-level cache, every call reads its weights from memory, as a model's layers
    do in a decode step (one matrix called again and again would stay in cache)."""

    def __init__(self, cls, weight: Weight, dtype: torch.dtype, nbytes: int, cache_bytes: int):
        self.kernels = [cls(weight, dtype) for _ in range(max(1, -(-2 * cache_bytes // max(nbytes, 1))))]
        self.i = 0

    def __call__(self, x):
        k = self.kernels[self.i]
        self.i = (self.i + 1) % len(self.kernels)
        return k(x)


def _stored(weight: Weight, dtype: torch.dtype):
    """qnative on the stored blocks, no packed copy (what a build without vpdpbusd runs)."""
    k = kernel_class("qnative")(weight, dtype)
    k.packed.unpack()
    return k


def weights_for(qtype: QT, K: int, N: int, seed: int) -> tuple[Weight, Weight]:
    """Random blocks of ``qtype`` and the same weight dequantised, as an fp32 tensor."""
    part = ql.random_part(qtype, N, K, seed, name=f"{qtype.name}[{N}x{K}]")
    dense = QuantTensor(part.name, QT.F32, N, K, ql.dequantize(part).numpy())
    return Weight([part]), Weight([dense])


def verify(kernel, weight: Weight, K: int) -> None:
    """qnative's result on the first rows (all of them for the smaller shapes) within its bound."""
    rows = min(weight.rows, 4096)
    part = weight.parts[0].take(np.arange(rows)) if rows < weight.rows else weight.parts[0]
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(K)) * 2
    y = kernel(x)[:, :rows].double()
    ref = ql.Reference(Weight([part]))
    if not ((y - ref.exact(x)).abs() <= ref.bound(x)).all():
        raise SystemExit(f"qnative is outside its error bound on {weight.name}: not timing it")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="most threads per contender (each runs at the faster of 1 and this)")
    ap.add_argument("--ms", default="1,4,16,64", help="activation rows per call")
    ap.add_argument("--shapes", default="all", help="comma-separated ops of SHAPES (q, k/v, ..., lm_head)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: the calling thread's CPU time, every contender on one thread (what each "
                         "kernel costs, without the time a busy machine did not give it)")
    ap.add_argument("--warm", action="store_true",
                    help="call one copy of each weight (it stays in cache) instead of rotating over copies")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    global CLOCK
    if args.clock == "cpu":
        CLOCK, args.threads = time.thread_time_ns, 1
    torch.set_num_threads(args.threads)
    Ms = [int(m) for m in args.ms.split(",")]
    shapes = SHAPES if args.shapes == "all" else [s for s in SHAPES if s[0] in args.shapes.split(",")]
    console = Console(width=220)
    loaded = ql.loaded()
    if loaded.lib is None:
        console.print(f"[red]qnative is unavailable here: {loaded.reason}")
        return 1
    int4_ok = check("int4pack").ok
    cpus = sorted(os.sched_getaffinity(0))
    meter = Meter(cpus, ours=lambda: [os.getpid()])
    env = {"cpu": cpu_fingerprint(), "start": environment_snapshot(), "threads": args.threads, "clock": args.clock,
           "qnative_isa": loaded.isa, "dense_bf16": Dense.path(torch.bfloat16), "int4pack": int4_ok}
    qnative = kernel_class("qnative")
    cache = 0 if args.warm else 1024 * max(cache_sizes().values(), default=32 * 1024)
    env["rotated_over_bytes"] = 2 * cache
    rows = []
    for op, K, N in shapes:
        fits = [t for t in sorted(ql.QTYPES) if K % (256 if t in ql.K_QUANTS else 32) == 0]
        types = LM_HEAD_TYPES if op == "lm_head" else fits
        for qtype in types:
            weight, dense_w = weights_for(qtype, K, N, seed=K + N)
            stored = sum(p.blocks().numel() for p in weight.parts)
            verify(qnative(weight, torch.float32), weight, K)
            kern = {dt: Rotating(qnative, weight, dt, stored, cache) for dt in (torch.float32, torch.bfloat16)}
            packs = loaded.lib.sf_qlinear_pack_bytes(int(qtype), N, K) > 0
            bf16_bytes = (2 if check("bf16_prepack").ok else 4) * N * K
            base = {"dense fp32": (Rotating(Dense, dense_w, torch.float32, 4 * N * K, cache), torch.float32),
                    "dense bf16": (Rotating(Dense, dense_w, torch.bfloat16, bf16_bytes, cache), torch.bfloat16)}
            del dense_w
            if packs:  # this build runs the type on a packed copy: the stored layout's kernel beside it
                base["stored fp32"] = (Rotating(_stored, weight, torch.float32, stored, cache), torch.float32)
            if int4_ok and qtype in (QT.Q4_1, QT.Q8_0):
                int4 = Int4Pack if qtype == QT.Q4_1 else Int4x2
                int4_bytes = N * K // (2 if qtype == QT.Q4_1 else 1)
                base[int4.name] = (Rotating(int4, weight, torch.bfloat16, int4_bytes, cache), torch.bfloat16)
            for M in Ms:
                g = torch.Generator().manual_seed(M)
                x32 = [torch.randn(M, K, generator=g) for _ in range(4)]
                xs = {torch.float32: x32, torch.bfloat16: [x.bfloat16() for x in x32]}
                contenders = {"qnative fp32": kern[torch.float32], "qnative bf16": kern[torch.bfloat16]}
                inputs = {"qnative fp32": xs[torch.float32], "qnative bf16": xs[torch.bfloat16]}
                for name, (k, dt) in base.items():
                    contenders[name], inputs[name] = k, xs[dt]
                with console.status(f"{op} {qtype.name} K={K} N={N} M={M}"):
                    a = meter.snapshot()
                    times, threads = measure(contenders, inputs, args.rounds, args.threads)
                    reading = meter.between(a, meter.snapshot())
                row = {"op": op, "K": K, "N": N, "type": qtype.name, "M": M, "stored_bytes": stored,
                       "contention": reading.as_dict(), "loadavg": list(os.getloadavg()), "threads": threads,
                       "us": {}, "ratio": {}}
                for name, t in times.items():
                    row["us"][name] = float(np.median(t)) / 1e3
                    if not name.startswith("qnative"):
                        ours = times["qnative bf16" if base[name][1] == torch.bfloat16 else "qnative fp32"]
                        row["ratio"][name] = median_ci([b / o for b, o in zip(t, ours)])
                rows.append(row)
            del kern, base
            gc.collect()
    env["end"] = environment_snapshot()
    _print(console, rows, env)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)
    return 0


def _print(console: Console, rows: list[dict], env: dict) -> None:
    cpu = env["cpu"]
    clock = "CPU time" if env["clock"] == "cpu" else "wall time"
    rotated = env["rotated_over_bytes"] >> 20
    clock += f", weights rotated over {rotated} MiB" if rotated else ", warm weights"
    t = Table(title=f"qnative ({env['qnative_isa']}) vs the engine's alternatives on {cpu['model']}: "
                    f"us ({clock}) per call "
                    f"(threads, the faster of 1 and {env['threads']}); ratio = their time / qnative's "
                    f"(>1: qnative faster), median [95% CI]")
    for col in ("op", "K", "N", "type", "M", "qnative fp32 us", "GB/s", "qnative bf16 us", "stored us", "ratio   ",
                "dense fp32 us", "ratio", "dense bf16 us", "ratio ", "int4 us", "ratio  ", "waited", "others", "load"):
        t.add_column(col, justify="left" if col in ("op", "type") else "right")
    for r in rows:
        us = r["us"]
        int4 = next((k for k in ("int4pack", "int4x2") if k in us), None)
        c = r["contention"]

        def rc(name, r=r):
            if name not in r["ratio"]:
                return "-"
            med, lo, hi = r["ratio"][name]
            return f"{med:.2f} [{lo:.2f}, {hi:.2f}]"

        def tu(name, r=r):
            return f"{r['us'][name]:.1f} ({r['threads'][name]})"
        stored = "stored fp32" in us
        t.add_row(r["op"], str(r["K"]), str(r["N"]), r["type"], str(r["M"]), tu("qnative fp32"),
                  f"{r['stored_bytes'] / us['qnative fp32'] / 1e3:.1f}", tu("qnative bf16"),
                  tu("stored fp32") if stored else "-", rc("stored fp32"), tu("dense fp32"), rc("dense fp32"), tu("dense bf16"), rc("dense bf16"),
                  tu(int4) if int4 else "-", rc(int4) if int4 else "-",
                  "-" if c["suffered"] is None else f"{c['suffered']:.0%}",
                  "-" if c["others"] is None else f"{c['others']:.0%}", f"{r['loadavg'][0]:.2f}")
    console.print(t)
    s, e = env["start"], env["end"]
    console.print(f"'stored': qnative fp32 on the stored blocks, without the packed copy this build runs "
                  f"(qlinear.c). dense bf16 runs as: {env['dense_bf16']}; torch int4 kernel usable: {env['int4pack']}. "
                  f"Load average (1/5/15 min) at start {s['loadavg']}, at end {e['loadavg']}; "
                  f"'waited': share of each row's time some task waited for a CPU (PSI), "
                  f"'others': other processes' share of these {cpu['cpus']} CPUs.")


if __name__ == "__main__":
    sys.exit(main())
