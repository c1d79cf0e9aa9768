"""Do verdicts hold on a busy machine? The same candidates measured again and again, on a quiet
machine and under a synthetic load, with the harness as it is.

Each candidate (a bundled template, default knobs) is evaluated ``--repeats`` times in each
condition, the conditions alternating (quiet, loaded, quiet, ...), with a run's CPU split where
the machine has two CPUs or more (measurements on the first, builds and verification on the
rest). The load: a CPU hog pinned to the measurement CPU (always busy, or busy ``--duty`` of every
100 ms) and a memory-bandwidth hog (a numpy copy of 256 MiB, over and over) on the others. Printed per candidate: every verdict with its interval
and the contention it was taken under; then, over all of them:

* interval overlap: the share of pairs of 95% intervals of the same candidate that overlap
  (measured verdicts only), within each condition and across the two;
* flips: candidates called `faster` in one measurement and `not_faster` in another (an
  `inconclusive` one, where the harness has it, is not a flip: it makes no claim).

    .venv/bin/python benchmarks/noise.py [--problems rmsnorm,softmax,swiglu] [--repeats 4] [--json out.json]

Run it with another copy of the project first on PYTHONPATH to measure that harness instead.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

from swarmfactory.api import evaluate
from swarmfactory.evidence.store import Store
from swarmfactory.harness.evaluate import HarnessConfig
from swarmfactory.lifecycle import kill_tree
from swarmfactory.outcome import MEASURED
from swarmfactory.problems import load_problem

CPU_HOG = "while True: pass"
# a hog busy ``duty`` of every 100 ms: other work that leaves the measurement CPU now and then
DUTY_HOG = ("import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < {busy}: pass\n"
            "    time.sleep({idle})")
MEM_HOG = ("import numpy as np\na = np.ones(1 << 25); b = np.empty_like(a)\n"
           "while True: np.copyto(b, a); np.copyto(a, b)")


def start_load(measure: list[int], others: list[int], duty: float = 1.0) -> list[subprocess.Popen]:
    procs = []
    hog = CPU_HOG if duty >= 1.0 else DUTY_HOG.format(busy=0.1 * duty, idle=0.1 * (1.0 - duty))
    for cpus, code in ((measure, hog), (others or measure, MEM_HOG)):
        cmd = ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, "-c", code]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
    time.sleep(2.0)  # the hogs at full speed before anything is measured
    return procs


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        kill_tree(p.pid)  # its process group, and it
        p.wait()


def overlap(a: dict, b: dict) -> bool:
    return a["ci_low"] <= b["ci_high"] and b["ci_low"] <= a["ci_high"]


def pair_stats(results: list[dict]) -> tuple[int, int]:
    measured = [r for r in results if r["outcome"] in MEASURED]
    pairs = list(itertools.combinations(measured, 2))
    return sum(overlap(a, b) for a, b in pairs), len(pairs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default="rmsnorm,softmax,swiglu")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--duty", type=float, default=1.0,
                    help="the CPU hog's share of every 100 ms on the measurement CPU (1: always busy)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    os.environ.setdefault("SWARMFACTORY_CACHE", tempfile.mkdtemp(prefix="sf-noise-"))
    cpus = sorted(os.sched_getaffinity(0))
    measure, others = cpus[:1], cpus[1:]
    config = HarnessConfig(rounds=args.rounds, measure_cpus=tuple(measure), verify_cpus=tuple(others or measure))
    # a store of its own, as a user's: baselines chosen once, every verdict recorded (the harness
    # learns from them how much a figure moves between evaluations here)
    store = Store(os.path.join(tempfile.mkdtemp(prefix="sf-noise-store-"), "e.db"))
    problems = [load_problem(p) for p in args.problems.split(",")]
    results: dict[str, dict[str, list[dict]]] = {p.name: {"quiet": [], "loaded": []} for p in problems}
    try:
        for rep in range(args.repeats):
            for condition in ("quiet", "loaded"):
                load = start_load(measure, others, args.duty) if condition == "loaded" else []
                try:
                    for p in problems:
                        v = evaluate(p, p.render(), store, config)
                        c = v["evidence"].get("contention") or {}
                        row = {"outcome": v["outcome"], "speedup": v["speedup"], "ci_low": v["ci_low"],
                               "ci_high": v["ci_high"], "suffered": c.get("suffered"),
                               "disturbed": c.get("disturbed_rounds"), "rounds": c.get("rounds"),
                               "at": time.strftime("%H:%M:%S")}
                        results[p.name][condition].append(row)
                        fig = (f"{v['speedup']:.2f}x [{v['ci_low']:.2f}, {v['ci_high']:.2f}]" if v["speedup"] else "-")
                        busy = (f" waited {c['suffered']:.0%}, {c.get('disturbed_rounds')}/{c.get('rounds')} "
                                "rounds disturbed" if c else "")
                        print(f"{row['at']} {condition:6} {p.name:12} {v['outcome']:12} {fig}{busy}", flush=True)
                finally:
                    stop_load(load)
    finally:
        store.close()
    print()
    total_ok = total = flips = 0
    print(f"{'problem':12} {'quiet overlap':>14} {'loaded overlap':>15} {'across':>8}  verdicts (quiet | loaded)")
    for name, by in results.items():
        q, lq = pair_stats(by["quiet"]), pair_stats(by["loaded"])
        across = [(a, b) for a in by["quiet"] for b in by["loaded"]
                  if {a["outcome"], b["outcome"]} <= set(MEASURED)]
        xa = sum(overlap(a, b) for a, b in across)
        ok = q[0] + lq[0] + xa
        n = q[1] + lq[1] + len(across)
        total_ok, total = total_ok + ok, total + n
        outcomes = {r["outcome"] for r in by["quiet"] + by["loaded"]}
        flip = set(MEASURED) <= outcomes
        flips += flip
        print(f"{name:12} {q[0]:>6}/{q[1]:<7} {lq[0]:>7}/{lq[1]:<7} {xa:>3}/{len(across):<4} "
              f"{' '.join(r['outcome'][:4] for r in by['quiet'])} | {' '.join(r['outcome'][:4] for r in by['loaded'])}"
              f"{'  FLIP' if flip else ''}")
    share = total_ok / total if total else float("nan")
    print(f"\ninterval pairs overlapping: {total_ok}/{total} ({share:.0%}); candidates flipping between "
          f"faster and not_faster: {flips} of {len(results)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "overlap": share, "flips": flips}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
