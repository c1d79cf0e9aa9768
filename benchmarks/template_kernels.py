"""Each bundled problem's default template kernel against its baseline and the eager reference.

Prints one row per workload shape: baseline (the faster of eager and torch.compile, chosen by
measurement), eager reference and kernel times, speedups with 95% bootstrap CIs, and the fraction
of this machine's roofline the kernel reaches. Writes the same as JSON.

    .venv/bin/python benchmarks/template_kernels.py [--problems all] [--no-compile] [--json out.json]

(Not ``kernels.py``: a script's folder comes first on ``sys.path``, and transformers imports a
package named ``kernels`` wherever it finds one, so ``engine_vs_peers.py`` failed loading the HF
model.)
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from swarmfactory.hardware import cpu_fingerprint
from swarmfactory.harness.evaluate import Harness, HarnessConfig
from swarmfactory.problems import resolve_problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default="all")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true", help="eager baselines only")
    ap.add_argument("--json", default="benchmarks/template_kernels.json")
    args = ap.parse_args(argv)
    console = Console(width=200)
    harness = Harness(HarnessConfig(rounds=args.rounds, compile_baselines=not args.no_compile))
    rows = []
    try:
        for problem in resolve_problems(args.problems):
            with console.status(f"{problem.name}: verify and measure the default kernel..."):
                v = harness.evaluate(problem, problem.render())
            if not v.shapes:
                console.print(f"[red]{problem.name}: {v.outcome.value}: {v.detail}")
                rows.append({"problem": problem.name, "outcome": v.outcome.value, "detail": v.detail})
                continue
            for s in v.shapes:
                rows.append({"problem": problem.name, "outcome": v.outcome.value,
                             "baseline": harness.baseline_for(problem, s.shape), **vars(s)})
    finally:
        harness.close()
    t = Table(title=f"default template kernels vs baselines on {cpu_fingerprint()['model']}")
    for col in ("problem", "shape", "baseline", "baseline us", "reference us", "kernel us",
                "vs baseline [95% CI]", "vs reference", "roofline"):
        t.add_column(col, justify="left" if col in ("problem", "shape", "baseline") else "right")
    for r in rows:
        if "shape" not in r:
            t.add_row(r["problem"], "-", "-", "-", "-", "-", r["outcome"], "-", "-")
            continue
        b = r["baseline"]
        t.add_row(r["problem"], "x".join(str(x) for x in r["shape"].values()), f"{b['name']} ({b['mode']})",
                  f"{r['baseline_us']:.2f}", f"{r['reference_us']:.2f}", f"{r['candidate_us']:.2f}",
                  f"{r['speedup']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]", f"{r['vs_reference']:.2f}x",
                  f"{r['roofline_fraction']:.0%}" if r["roofline_fraction"] else "-")
    console.print(t)
    with open(args.json, "w") as f:
        json.dump({"hardware": cpu_fingerprint(), "rows": rows}, f, indent=1, default=str)
    console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
