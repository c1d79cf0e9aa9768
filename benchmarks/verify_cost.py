"""What verification costs per problem: seed cases, distinct shapes, the largest case's memory, and
the time to verify the default template (``problem.render()``) on them, nothing timed.

"cold" is the first verification in the process (inputs and float64 references computed);
"warm" the best of ``--repeat`` more (references from the harness's case cache, as every
evaluation after the first in a run). With ``--draws N`` it also verifies N successive drawn
model cases (``problem.model_cases``) on top of the seed cases, each draw cold for its new cases,
as a run's successive evaluations do. Works on any checkout: run it with ``PYTHONPATH=<checkout>``
for before/after figures.

    .venv/bin/python benchmarks/verify_cost.py [--problems all] [--repeat 2] [--draws 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from swarmfactory.harness.evaluate import Harness, HarnessConfig
from swarmfactory.problems import resolve_problems


def case_bytes(problem, shape) -> int:
    """Inputs and outputs of one case at fp32-or-narrower, plus the float64 reference outputs."""
    inputs = problem.make_inputs(dict(shape), np.random.default_rng(0), problem.dists[0])
    n = sum(v.nbytes for v in inputs.values() if isinstance(v, np.ndarray))
    outs = problem.output_shapes(dict(shape))
    return n + sum(12 * math.prod(s) for s in outs.values())  # fp32 output + float64 reference


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default="all")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--draws", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    harness = Harness(HarnessConfig(compile_baselines=False))
    rows = []
    try:
        for p in resolve_problems(args.problems):
            if p.backend != "c" or p.template is None:
                continue
            cases = p.seed_cases()
            shapes = {json.dumps(dict(c.shape), sort_keys=True): c.shape for c in cases}
            big = max(case_bytes(p, s) for s in shapes.values())
            src = p.render()
            t0 = time.monotonic()
            v = harness.evaluate(p, src, cases, measure=False)
            cold = time.monotonic() - t0
            warm = []
            for _ in range(args.repeat):
                t0 = time.monotonic()
                harness.evaluate(p, src, cases, measure=False)
                warm.append(time.monotonic() - t0)
            row = {"problem": p.name, "seed_cases": len(cases), "shapes": len(shapes),
                   "max_case_mb": round(big / 2**20, 1), "outcome": v.outcome.value,
                   "cold_s": round(cold, 2), "warm_s": round(min(warm), 2) if warm else None}
            if args.draws and hasattr(p, "model_cases"):
                drawn = []
                for d in range(args.draws):
                    extra = p.model_cases(d)
                    t0 = time.monotonic()
                    dv = harness.evaluate(p, src, cases + extra, measure=False)
                    drawn.append(time.monotonic() - t0)
                    if dv.outcome.value != "verified":
                        row["draw_failure"] = f"draw {d}: {dv.outcome.value}: {dv.detail[:300]}"
                        break
                row["drawn_s_mean"] = round(sum(drawn) / len(drawn), 2)
                row["drawn_s_max"] = round(max(drawn), 2)
                row["drawn_extra_s"] = round(sum(drawn) / len(drawn) - row["warm_s"], 2) if warm else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        harness.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
