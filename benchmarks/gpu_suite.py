"""The GPU suite's seed kernels against the best public baselines, and a short swarm run.

On a GPU: each problem's seed kernel (its template's defaults) is verified compiled (edge and
interpreter shapes, and one case per timed shape) and timed against every public baseline that is
importable here (the fastest one per shape is the yardstick; the others are listed with their
time or why they are unavailable), per docs/gpu.md. Then a short swarm run (knob agents) on the
suite. Prints tables; ``--json`` writes the numbers.

``--dry-run`` (any machine): the same flow through Triton's interpreter on the small shapes,
without timing (verdicts read `verified`: not timed); baselines are listed as available or not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="interpreter path on CPU, tiny shapes, no timing")
    ap.add_argument("--problems", default="gpu", help="'gpu' (the suite) or a comma-separated list")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds per shape (default 6)")
    ap.add_argument("--swarm-budget", type=int, default=6, help="evaluations in the short swarm run (0: none)")
    ap.add_argument("--swarm-time", default="120s", help="wall-clock cap of the swarm run")
    ap.add_argument("--store", default=None, help="evidence store (default: a fresh one under /tmp)")
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    return ap.parse_args()


def cases_for(problem, interpret: bool):
    from swarmfactory.harness.gpu import interpret_cases
    from swarmfactory.problems.spec import Case

    small, _ = interpret_cases(problem, problem.seed_cases())
    if interpret:
        return small
    edge = [c for c in problem.seed_cases() if dict(c.shape) in [dict(s) for s in problem.edge_shapes]]
    timed = [Case(dict(s), seed=4242 + i, origin="workload") for i, s in enumerate(problem.workload)]
    return small + edge + timed


def main() -> int:
    args = parse()
    if args.dry_run:
        os.environ["SWARMFACTORY_NO_GPU"] = "1"
    from swarmfactory.harness.evaluate import Harness, HarnessConfig
    from swarmfactory.harness.gpu import cuda_available
    from swarmfactory.problems import resolve_problems

    gpu = cuda_available()
    if not gpu and not args.dry_run:
        print("gpu_suite: no CUDA device visible to torch; use --dry-run for the interpreter path", file=sys.stderr)
        return 3
    t_start = time.monotonic()
    problems = resolve_problems(args.problems)
    harness = Harness(HarnessConfig(rounds=args.rounds, case_timeout_s=20.0))
    rows = []
    try:
        for p in problems:
            t0 = time.monotonic()
            prep = harness.prepare(p, p.render(), cases_for(p, not gpu))
            v = harness.rejected_verdict(prep) if prep.rejected else harness.measure(prep)
            rows.append({"problem": p.name, "shapes_from": p.shapes_from, "outcome": v.outcome.value,
                         "detail": v.detail, "cases": v.cases_checked, "seconds": round(time.monotonic() - t0, 1),
                         "baselines": v.evidence.get("baselines") or baselines_here(p),
                         "shapes": [dict(s.__dict__) for s in v.shapes]})
            print_problem(rows[-1])
    finally:
        harness.close()
    swarm = None
    if args.swarm_budget:
        import swarmfactory

        store = args.store or f"/tmp/sf-gpu-suite-{os.getpid()}.db"
        swarm = swarmfactory.run(args.problems if not args.dry_run else problems[0].name, store=store,
                                 budget=args.swarm_budget, time_s=_seconds(args.swarm_time), parallel=1,
                                 rounds=args.rounds, remeasure_champions=gpu)
        print(f"\nswarm run {swarm['run_id']} ({args.swarm_budget} evaluations max; store {store}):")
        for prow in swarm["problems"]:
            champ = prow["champion"]
            print(f"  {prow['problem']:<22} {prow['evaluations']:>3} evals  outcomes {prow['outcomes']}  "
                  f"champion {('%.2fx' % champ['speedup']) if champ and champ.get('speedup') else '-'}")
    print(f"\ntotal {time.monotonic() - t_start:.0f} s ({'GPU, compiled' if gpu else 'dry run: Triton interpreter on CPU, not timed'})")
    if args.json:
        Path(args.json).write_text(json.dumps({"gpu": gpu, "problems": rows,
                                               "swarm": swarm and swarm.get("run_id")}, indent=1, default=str))
    return 0


def _seconds(text: str) -> float:
    from swarmfactory.config import parse_duration

    return parse_duration(text)


def baselines_here(problem) -> dict:
    """Each baseline set up on a small shape here (set-up is cheap: torch.compile compiles lazily),
    untimed: installed or why not."""
    import numpy as np

    from swarmfactory.problems.spec import to_torch
    from swarmfactory.problems.suites.gpu.common import BaselineUnavailable

    shape = dict(problem.interpret_shapes[-1])
    inputs = to_torch(problem.make_inputs(shape, np.random.default_rng(0), problem.dists[0]))
    out = {}
    for name, setup in problem.baselines.items():
        try:
            setup(inputs)
            out[name] = "set up (not timed: no GPU)"
        except BaselineUnavailable as exc:
            out[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - a library's failure is reported, not raised
            out[name] = f"unavailable here ({type(exc).__name__}: {exc})"[:200]
    return out


def print_problem(row: dict) -> None:
    print(f"\n{row['problem']}  [{row['outcome']}]  {row['cases']} cases, {row['seconds']} s  -- shapes: {row['shapes_from']}")
    print(f"  {row['detail']}")
    if row["shapes"]:
        print(f"  {'shape':<44} {'kernel us':>10} {'baseline us':>12} {'speedup [95% CI]':>24}")
        for s in row["shapes"]:
            label = "x".join(f"{k}={v}" for k, v in s["shape"].items())
            print(f"  {label:<44} {s['candidate_us']:>10.2f} {s['baseline_us']:>12.2f} "
                  f"{s['speedup']:>8.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]")
    for name, state in row["baselines"].items():
        print(f"  baseline {name}: {state.removeprefix(name + ': ')}")


if __name__ == "__main__":
    sys.exit(main())
