"""Harness throughput: C candidates fully evaluated (static, build, verify, measure) per minute.

Takes a fixed, seeded sample of valid knob configurations of every bundled problem's template
and evaluates them the way a run does: the coordinator's CPU split (measurements pinned apart
from builds and verifications), two evaluations in flight, one measurement at a time, the
default run settings (20 rounds, eager and compiled baselines). Baselines are chosen, the seed
cases' references computed (every evaluation after a problem's first finds them cached) and the
build cache is emptied before the clock starts, so the figure is a run's steady state with
fresh builds. With ``--draws`` every candidate also gets the next draw of its problem's
full-size model cases, as a run's coordinator adds them (``Problem.model_cases``; those are
new to every evaluation). Prints candidates per minute and the time per stage.

    .venv/bin/python benchmarks/throughput.py [--per-problem 6] [--problems all] [--draws] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter

from swarmfactory.hardware import cpu_fingerprint, environment_snapshot
from swarmfactory.harness.evaluate import Harness, HarnessConfig
from swarmfactory.problems import resolve_problems
from swarmfactory.swarm.coordinator import Coordinator
from swarmfactory.swarm.executors import LocalExecutor


def sample_configs(problem, n: int, rng: random.Random) -> list[dict]:
    space = [dict(zip(problem.knobs, values)) for values in itertools.product(*problem.knobs.values())]
    space = [k for k in space if problem.valid_knobs(k) and k != dict(problem.knob_defaults)]
    rng.shuffle(space)
    return space[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default="all")
    ap.add_argument("--per-problem", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--draws", action="store_true", help="add each problem's next model-case draw per candidate")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    os.environ["SWARMFACTORY_CACHE"] = tempfile.mkdtemp(prefix="sf-throughput-")
    problems = resolve_problems(args.problems)
    measure, verify = Coordinator._cpu_split(2)
    harness = Harness(HarnessConfig(measure_cpus=measure, verify_cpus=verify))
    if verify:  # as a run does: builds and references stay off the measurement CPU
        os.sched_setaffinity(0, verify)
    executor = LocalExecutor(harness, parallel=2)
    rng = random.Random(args.seed)
    jobs = [(p, p.render(k)) for p in problems for k in sample_configs(p, args.per_problem, rng)]
    rng.shuffle(jobs)
    try:
        print(f"warming up: baselines and roofs for {len(problems)} problems", flush=True)
        for p in problems:  # the chosen baselines and the eager references, loaded and warm
            for shape in p.workload:
                harness.baseline_for(p, shape)
            harness.evaluate(p, p.render(), cases=p.seed_cases()[:1])
            harness.evaluate(p, p.render(), cases=p.seed_cases(), measure=False)  # references cached
        if any(p.roofline for p in problems):
            harness.roofs()
        shutil.rmtree(os.environ["SWARMFACTORY_CACHE"], ignore_errors=True)
        print(f"evaluating {len(jobs)} candidates", flush=True)
        t0 = time.monotonic()
        draws = Counter()

        def cases(p):
            if not args.draws or not hasattr(p, "model_cases"):
                return p.seed_cases()
            draws[p.name] += 1
            return p.seed_cases() + p.model_cases(draws[p.name] - 1)

        futures = [executor.submit(p, src, cases(p)) for p, src in jobs]
        verdicts = [f.result() for f in futures]
        wall = time.monotonic() - t0
    finally:
        executor.shutdown()
        harness.close()
        shutil.rmtree(os.environ["SWARMFACTORY_CACHE"], ignore_errors=True)
    outcomes = Counter(v.outcome.value for v in verdicts)
    for (p, _), v in zip(jobs, verdicts):
        if not v.outcome.correct:
            print(f"  {p.name}: {v.outcome.value}: {v.detail[:300]}")
    per_min = len(verdicts) / wall * 60
    print(f"{len(verdicts)} candidates in {wall:.1f} s: {per_min:.1f} per minute "
          f"({', '.join(f'{k} {n}' for k, n in sorted(outcomes.items()))})")
    print(f"mean seconds per candidate (stages overlap): {sum(v.seconds for v in verdicts) / len(verdicts):.2f}; "
          f"cases per candidate: {sum(v.cases_checked for v in verdicts) / len(verdicts):.0f}")
    env = environment_snapshot()
    print(f"{cpu_fingerprint()['model']}, load average at the end {env['loadavg']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"per_minute": per_min, "wall_s": wall, "outcomes": outcomes, "n": len(verdicts),
                       "hardware": cpu_fingerprint(), "environment": env}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
