"""The engine's attention (``qstep.c``'s ``q_attend``, as ``sf_op_attention`` runs it) at the
shapes of SmolLM2 (9 query heads over 3 kv heads, head 64) and Gemma 3 270M (4 over 1, head 256),
and, with ``--model``, one native step on a 256-token prompt chunk at growing positions.

Attention: each case is ``rows`` decode rows, each over its own cache of ``--positions``
positions; one row's cache stays in L2/L3, 64 rows' stream from memory. The step picks its loop
by the bytes its decode rows read (``ATTEND_STREAM_BYTES``: over 16 MB a layer, one key at a
time; else 8 keys at a time); the "loop" column says which one a case ran. Each case is first
checked against fp64, then timed: the best of ``--rounds`` samples of calls run in C (no Python
between them). Reported: ms per call and G multiply-adds a second (QK and PV), with the
contention read around each case (the share of the CPUs other processes took, and steal).

The chunk step (``--model FILE.gguf``): the engine's native block step on 256 prompt tokens of one
sequence at positions 0, 256, 512, 768 and 1536, logits for its last row only, on the engine's
default threads (one per available core); the best of ``--rounds`` runs each. The step's matrix products are the same at every position, so the growth
is its attention over the cache.

    .venv/bin/python benchmarks/engine_attention.py [--threads 1] [--rounds 5] [--positions 1024]
                                                    [--model FILE.gguf]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from swarmfactory.contention import Meter
from swarmfactory.engine.native import element_ops

STREAM_BYTES = 16 << 20  # qstep.c's ATTEND_STREAM_BYTES
CASES = [  # name, rows, heads, kv heads, head size
    ("smollm2", 1, 9, 3, 64), ("smollm2", 8, 9, 3, 64), ("smollm2", 64, 9, 3, 64),
    ("gemma3", 1, 4, 1, 256), ("gemma3", 8, 4, 1, 256), ("gemma3", 64, 4, 1, 256),
]


def attention_case(rows: int, heads: int, kv: int, seq: int, d: int, rounds: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(rows, heads, d, generator=gen)
    k, v = (torch.randn(rows, kv, seq, d, generator=gen) for _ in range(2))
    call = element_ops.attention({"q": q, "k": k, "v": v, "batch": rows, "heads": heads, "kv_heads": kv,
                                  "seq": seq, "head_dim": d, "scale": d ** -0.5})
    kk, vv = (x.double().repeat_interleave(heads // kv, dim=1) for x in (k, v))
    ref = (torch.softmax(q.double().unsqueeze(2) @ kk.transpose(-1, -2) * d ** -0.5, -1) @ vv).squeeze(2)
    err = (call().double() - ref).abs().max().item()
    if err > 1e-4:
        raise SystemExit(f"attention {rows}x{heads}/{kv}x{seq}x{d}: max error {err:.2e} against fp64")
    macs = 2 * rows * heads * seq * d
    n = max(3, int(3e8 // macs))  # calls per sample: about 0.1 s
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        call.loop(n)
        best = min(best, (time.perf_counter() - t0) / n)
    return {"ms": best * 1e3, "gmacs": macs / best / 1e9, "err": err,
            "loop": "streamed" if rows * kv * seq * d * 8 > STREAM_BYTES else "in cache"}


def chunk_steps(model: str, rounds: int) -> list[tuple[int, float]]:
    from swarmfactory.engine import Engine, EngineConfig

    native = Engine(EngineConfig(model=model, max_batch=4, max_seq_len=2048)).native
    if native is None:
        raise SystemExit(f"{model}: the engine runs no native step on this machine")
    n, ids = 256, torch.randint(100, 1000, (256,), generator=torch.Generator().manual_seed(0))
    out = []
    for start in (0, 256, 512, 768, 1536):
        slots, pos = torch.zeros(n, dtype=torch.long), torch.arange(start, start + n)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            native(ids, slots, pos, torch.tensor([n - 1]))
            best = min(best, time.perf_counter() - t0)
        out.append((start, best * 1e3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--model", default=None, help="also time the native step on a 256-token chunk of this GGUF")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    meter = Meter(sorted(os.sched_getaffinity(0)), ours=lambda: [os.getpid()])
    print(f"attention, {args.positions} positions, {args.threads} thread(s), best of {args.rounds}")
    print(f"{'model':8} {'rows':>4} {'heads':>7} {'head':>4} {'loop':>9} {'ms':>8} {'GMAC/s':>7} {'others':>6} "
          f"{'steal':>5}")
    for name, rows, heads, kv, d in CASES:
        a = meter.snapshot()
        r = attention_case(rows, heads, kv, args.positions, d, args.rounds)
        c = meter.between(a, meter.snapshot())
        print(f"{name:8} {rows:>4} {heads:>3}/{kv:<3} {d:>4} {r['loop']:>9} {r['ms']:>8.3f} {r['gmacs']:>7.1f} "
              f"{c.others or 0:>6.0%} {c.steal or 0:>5.0%}")
    if args.model:
        torch.set_num_threads(max(1, args.threads))
        a = meter.snapshot()
        steps = chunk_steps(args.model, args.rounds)
        c = meter.between(a, meter.snapshot())
        print(f"\nnative step, 256-token chunk of {os.path.basename(args.model)} (others {c.others or 0:.0%}, "
              f"steal {c.steal or 0:.0%}):")
        for start, ms in steps:
            print(f"  at {start:>5}: {ms:7.1f} ms  ({256 / ms * 1e3:5.0f} tok/s)")


if __name__ == "__main__":
    main()
