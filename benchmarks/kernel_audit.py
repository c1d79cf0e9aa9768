"""What the engine's audit of kernel-factory code costs while serving (engine/audit.py).

The native decoder's step with a q4_1_packed_matvec kernel audited against the decoder's own
loop (as the engine does it, and every call), against the same kernel unaudited and the
built-in decoder; and one linear
op on a q4_1_matmul library with its audit (first call per batch size, then a random share)
against the library alone. Real SmolLM2 weights; times are medians of interleaved rounds.

    .venv/bin/python benchmarks/kernel_audit.py [--batches 1,16,64] [--rounds 15] [--threads 2]
        [--knobs '{"offset": "fused"}']

The kernel is q4_1_packed_matvec's template with --knobs (default: the fused offset, a variant
with its own rounding order), built as the harness builds it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _median_ms(fn, rounds: int) -> float:
    fn()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main(argv=None) -> int:
    from rich.console import Console
    from rich.table import Table

    from swarmfactory.backends.c import CBackend
    from swarmfactory.engine.gguf_loader import load_gguf, resolve_model_path
    from swarmfactory.engine.kernels import Weight
    from swarmfactory.engine.kv_cache import KVCache
    from swarmfactory.engine.native import NativeDecoder, load_checked
    from swarmfactory.engine.native.matvec import External
    from swarmfactory.engine.supply import BuiltKernel, NoSupply
    from swarmfactory.engine.native_seam import kernel_class
    from swarmfactory.hardware import cpu_fingerprint
    from swarmfactory.problems import load_problem

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--knobs", default='{"offset": "fused"}')
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    console = Console(width=160)
    torch.set_num_threads(args.threads)

    gg = load_gguf(resolve_model_path(None))
    hp = gg.hparams
    problem = load_problem("q4_1_packed_matvec")
    src = problem.render(json.loads(args.knobs))
    art = CBackend().build(src, problem.name, prototype=problem.c_prototype, checks=True)
    # no store: a finding is logged, not recorded
    mv = BuiltKernel("bench", problem.name, "", art.path, src, "benchmark", problem.tolerance.rtol,
                     problem.tolerance.atol)
    said = NoSupply().on_wrong
    lib, isa, _ = load_checked()
    import ctypes

    kernel = ctypes.CDLL(art.path, mode=ctypes.RTLD_LOCAL)
    every = External(lib, mv, kernel, said)
    every.ext = every.new_ext(audit=True, share=1)
    libs = {"built-in decoder": lib, "kernel, audited": External(lib, mv, kernel, said, audit=True),
            "kernel, every call audited": every, "kernel, no audit": External(lib, mv, kernel, said, audit=False)}
    max_b = max(batches)
    kv = KVCache(hp.n_layers, max_b, hp.n_kv_heads, 256, hp.head_dim, torch.float32)
    decs = {name: NativeDecoder(gg, kv, max_b, args.threads, lb) for name, lb in libs.items()}
    console.print(f"cpu {cpu_fingerprint()['model']}, {args.threads} threads, native path {isa.name}; "
                  f"kernel: q4_1_packed_matvec's template with {args.knobs}")
    t = Table(title="native decode step (ms, median)")
    for col in ("batch", *decs, "audit cost", "every call"):
        t.add_column(col, justify="right")
    for b in batches:
        tok = torch.randint(0, hp.vocab_size, (b,))
        slots, pos = torch.arange(b), torch.full((b,), 100)
        times = {}
        for _ in range(2):  # interleaved: each decoder twice, the faster round kept
            for name, dec in decs.items():
                ms = _median_ms(lambda d=dec: d(tok, slots, pos), args.rounds)
                times[name] = min(times.get(name, ms), ms)
        cost = times["kernel, audited"] / times["kernel, no audit"] - 1
        cost1 = times["kernel, every call audited"] / times["kernel, no audit"] - 1
        t.add_row(str(b), *(f"{times[n]:.2f}" for n in decs), f"{cost:+.1%}", f"{cost1:+.1%}")
    console.print(t)
    ext = libs["kernel, audited"].ext
    console.print(f"audited kernel: {ext.calls} calls, {ext.audited} audited, dropped: {bool(ext.bad)}")

    q = load_problem("q4_1_matmul")
    qart = CBackend().build(q.render(), q.name, prototype=q.c_prototype, checks=True)
    weight = Weight([gg.tensor("blk.3.ffn_down.weight")])
    audited = kernel_class(qart.path, name="bench_audited")(weight, torch.float32)
    plain = kernel_class(qart.path, name="bench_plain", check=False)(weight, torch.float32)
    t = Table(title=f"one linear op on the q4_1_matmul template [{weight.rows} x {weight.cols}] (ms, median)")
    for col in ("rows", "library alone", "library + audit", "audit cost"):
        t.add_column(col, justify="right")
    for b in batches:
        x = torch.randn(b, weight.cols)
        times = {}
        for _ in range(2):
            for name, k in (("plain", plain), ("audited", audited)):
                ms = _median_ms(lambda k=k: k(x), args.rounds * 4)
                times[name] = min(times.get(name, ms), ms)
        t.add_row(str(b), f"{times['plain']:.3f}", f"{times['audited']:.3f}", f"{times['audited'] / times['plain'] - 1:+.1%}")
    console.print(t)
    st = type(audited).audit_state
    console.print(f"audited library: {st['calls']} calls, {st['audited']} audited, dropped: {st['dropped'] is not None}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
