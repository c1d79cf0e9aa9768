"""Measure every configuration of the template problems' knob spaces on this machine.

The rows (problem, knobs, outcome, speedup and its CI, the speedup and CI on each workload shape,
the contention the harness measured, the hardware's fingerprint) are the
recorded data the transfer benchmark replays and the cross-problem cost model's tests score
against. Each row is a real harness evaluation: build, verification on the seed cases, then
interleaved timing against the problem's baseline (fewer rounds than a search run: ``--rounds``).

    python benchmarks/knob_sweep.py --out benchmarks/data/knob_sweep.jsonl [--problems a,b] [--rounds 6]
    SWARMFACTORY_CPU_MASK=avx2 python benchmarks/knob_sweep.py ...   # the same, as an AVX2 machine

Rows are appended as they are measured; a rerun skips what the file already holds for this
hardware, so an interrupted sweep continues where it stopped. ``--confirm K`` then re-measures the
K best configurations of each problem with ``--confirm-rounds`` rounds (rows marked ``confirm``):
the transfer benchmark's targets are set from the best re-measurement, not from one lucky
measurement of the sweep.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time


# how the rows' baselines were timed: rows without this field were recorded before a multi-threaded
# baseline was also timed on one thread in every round (harness/rounds.py SINGLE), when a stalled
# team of threads could inflate a shape's speedup (up to 1900x seen; benchmarks/data/README.md)
YARDSTICK = "per round, the faster of the chosen thread count and one thread"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/data/knob_sweep.jsonl")
    ap.add_argument("--problems", default="all")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--sample", type=int, default=None,
                    help="measure this many configurations per problem (a seeded random subset), not all")
    ap.add_argument("--store", default=None, help="also record every evaluation in this evidence store")
    ap.add_argument("--confirm", type=int, default=0, metavar="K",
                    help="then re-measure the K best configurations of each problem (rows marked confirm)")
    ap.add_argument("--confirm-rounds", type=int, default=12)
    args = ap.parse_args(argv)

    from swarmfactory.agents.base import knob_key
    from swarmfactory.evidence.store import Store
    from swarmfactory.harness.evaluate import Harness, HarnessConfig
    from swarmfactory.hardware import machine_profile
    from swarmfactory.problems import resolve_problems
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    hw = machine_profile()
    done, confirmed, measured = set(), set(), {}
    if os.path.exists(args.out):
        with open(args.out) as fh:
            for line in fh:
                r = json.loads(line)
                if r["hardware"]["id"] == hw["id"]:
                    if r.get("confirm"):
                        confirmed.add((r["problem"], knob_key(r["knobs"])))
                    else:
                        done.add((r["problem"], knob_key(r["knobs"])))
                        if r["outcome"] in ("faster", "not_faster") and r.get("speedup"):
                            measured.setdefault(r["problem"], []).append(r)
    store = Store(args.store) if args.store else None
    harness = Harness(HarnessConfig(rounds=args.rounds, compile_baselines=False), store=store)
    problems = [p for p in resolve_problems(args.problems) if p.knobs]
    todo = []
    for p in problems:
        names = list(p.knobs)
        space = [dict(zip(names, values)) for values in itertools.product(*(p.knobs[n] for n in names))]
        space = [k for k in space if p.valid_knobs(k)]
        if args.sample is not None and args.sample < len(space):
            space = random.Random(f"sweep:{p.name}").sample(space, args.sample)
        todo += [(p, k, False) for k in space if (p.name, knob_key(k)) not in done]
    confirm_harness = None
    if args.confirm:
        confirm_harness = Harness(HarnessConfig(rounds=args.confirm_rounds, compile_baselines=False), store=store)
        for p in problems:
            best = sorted(measured.get(p.name, []), key=lambda r: -r["speedup"])[:args.confirm]
            todo += [(p, r["knobs"], True) for r in best if (p.name, knob_key(r["knobs"])) not in confirmed]
    print(f"{len(todo)} configurations to measure on {hw['model']} ({hw['id']}), {len(done)} already recorded",
          file=sys.stderr)
    bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True))
    task = bar.add_task("sweep", total=len(todo))
    bar.start()
    try:
        with open(args.out, "a") as fh:
            for p, knobs, confirm in todo:
                t0 = time.monotonic()
                h = confirm_harness if confirm else harness
                prep = h.prepare(p, p.render(knobs))
                v = h.rejected_verdict(prep) if prep.rejected is not None else h.measure(prep)
                row = {"problem": p.name, "spec": p.spec_hash(), "knobs": knobs, "outcome": v.outcome.value,
                       "speedup": v.speedup, "ci": [v.ci_low, v.ci_high] if v.speedup else None,
                       "shapes": [{"shape": dict(t.shape), "speedup": t.speedup, "ci": [t.ci_low, t.ci_high]}
                                  for t in v.shapes if t.speedup],
                       "contention": (v.evidence or {}).get("contention"),
                       "seconds": round(time.monotonic() - t0, 2), "loadavg": os.getloadavg()[0],
                       "hardware": {k: hw[k] for k in ("id", "model", "arch", "features", "cpus", "mask", "caches",
                                                       "vendor", "family", "cpu_model", "stepping", "bandwidth_gbs")
                                    if k in hw}}
                row["yardstick"] = YARDSTICK
                if confirm:
                    row["confirm"] = True
                fh.write(json.dumps(row) + "\n")
                fh.flush()
                if store is not None:
                    from swarmfactory.agents.base import candidate_record
                    from swarmfactory.validation import validation_set

                    cand = candidate_record(p, p.render(knobs), "sweep", "sweep", knobs=knobs)
                    store.record_verdict(p, cand, v, None, validation_set(p, store)[1], purpose="sweep")
                bar.advance(task)
    finally:
        bar.stop()
        harness.close()
        if confirm_harness is not None:
            confirm_harness.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
