"""Does knowledge transfer? Evaluations needed to reach 95% of the best known speedup, cold vs warm.

For each target problem the swarm (the real coordinator, the default agents, the analyst, the
cost model, the bandit) searches its knob space three ways, each with several seeds:

* ``cold``: an empty evidence store;
* ``warm: other problems``: the store holds a run's worth of evidence of every *other* problem on
  this machine (``--other-sample`` configurations each) and the lessons the analyst drew from it;
* ``warm: other CPU``: the store holds the *same* problem's evidence from another machine (the
  recorded sweep's other hardware: ``--machine-sample`` configurations) and that machine's lessons.

Every verdict is replayed from recorded measurements (``benchmarks/knob_sweep.py``: each a real
build, verification and interleaved timing on the recorded machine), so all three conditions and
all seeds see the same figures for the same configuration; only the search differs. The count is
the number of search evaluations up to and including the first whose speedup reaches 95% of the
best the full sweep of the problem found. A search that has not reached it within ``--budget``
evaluations counts as the budget (censored, marked ``>``).

    python benchmarks/transfer.py                              # the four transfer problems, 5 seeds
    python benchmarks/transfer.py --problems layernorm --seeds 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

from swarmfactory.outcome import MEASURED
from swarmfactory.swarm.executors import Executor

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "knob_sweep.jsonl"
TARGETS = "layernorm,add_rmsnorm,geglu,q8_0_matmul"
CONDITIONS = ("cold", "warm: other problems", "warm: other CPU")


class Reached(Exception):
    """The search reached the target speedup: the trial is over."""


class ReplayExecutor(Executor):
    """An executor whose verdicts are the recorded measurements of the configuration proposed."""

    def __init__(self, problem, rows: list[dict], target: float):
        from swarmfactory.agents.base import knob_key

        self.by_source = {problem.render(r["knobs"]): r for r in rows}
        self.by_key = {knob_key(r["knobs"]): r for r in rows}
        self.target, self.submitted, self.hit = target, 0, None

    def submit(self, problem, source, cases) -> Future:
        from swarmfactory.outcome import Outcome, Verdict

        self.submitted += 1
        row = self.by_source.get(source)
        fut: Future = Future()
        if row is None:
            fut.set_result(Verdict(Outcome.CRASHED, "not in the recorded sweep", "replay"))
            return fut
        ci = row.get("ci") or [None, None]
        fut.set_result(Verdict(Outcome(row["outcome"]), "replayed from the recorded sweep", "measure",
                               speedup=row["speedup"], ci_low=ci[0], ci_high=ci[1]))
        if self.hit is None and row["outcome"] in MEASURED and row["speedup"] >= self.target:
            self.hit = self.submitted
        return fut

    def shutdown(self, wait: bool = True) -> None:
        pass


class StopAtTarget:
    """Progress that ends the run once the executor has replayed a configuration at the target."""

    def __init__(self, executor: ReplayExecutor):
        self.executor = executor

    def start(self, *a): ...
    def stop(self): ...

    def update(self, done, champions, counts):
        if self.executor.hit is not None:
            raise Reached()


def _verdict(row: dict):
    from swarmfactory.outcome import Outcome, Verdict

    ci = row.get("ci") or [None, None]
    return Verdict(Outcome(row["outcome"]), "recorded sweep", "measure", speedup=row["speedup"],
                   ci_low=ci[0], ci_high=ci[1])


def _prefill(store, rows: list[dict], hardware: dict) -> None:
    """Record ``rows`` as evaluations made on ``hardware`` (an earlier run there), then let the
    analyst draw that machine's lessons from them, as that run's end would have."""
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.knowledge.analyst import Analyst
    from swarmfactory.problems import load_problem
    from swarmfactory.validation import validation_set

    own = store.hardware
    store.hardware = hardware
    try:
        problems = {}
        for r in rows:
            p = problems.setdefault(r["problem"], load_problem(r["problem"]))
            cand = candidate_record(p, p.render(r["knobs"]), "sweep", "recorded", knobs=r["knobs"])
            store.record_verdict(p, cand, _verdict(r), None, validation_set(p, store)[1], "search")
        Analyst(store).update(list(problems.values()), None, [hardware["id"]])
    finally:
        store.hardware = own


def trial(problem, condition: str, seed: int, data: dict, target: float, budget: int,
          other_sample: int, machine_sample: int, workdir: Path) -> dict:
    from swarmfactory.config import RunConfig
    from swarmfactory.evidence.store import Store
    from swarmfactory.swarm.coordinator import Coordinator

    native_hw, other_hw = data["native_hw"], data["other_hw"]
    store = Store(str(workdir / f"{problem.name}-{condition.split()[-1]}-{seed}.db"))
    store.hardware = native_hw  # the replayed machine is the one the sweep measured
    rng = random.Random(f"{problem.name}:{condition}:{seed}")
    if condition == "warm: other problems":
        rows = []
        for name, prow in data["native"].items():
            if name != problem.name:
                rows += rng.sample(prow, min(other_sample, len(prow)))
        _prefill(store, rows, native_hw)
    elif condition == "warm: other CPU":
        prow = data["other"].get(problem.name, [])
        if not prow:
            raise SystemExit(f"no recorded rows of {problem.name} from another machine in the sweep")
        _prefill(store, rng.sample(prow, min(machine_sample, len(prow))), other_hw)
    ex = ReplayExecutor(problem, data["native"][problem.name], target)
    cfg = RunConfig.build(problems=problem.name, budget=budget, agents="default", parallel=1, seed=seed,
                          remeasure_champions=False)
    t0 = time.monotonic()
    try:
        Coordinator(cfg, store, progress=StopAtTarget(ex), executor=ex).run()
    except Reached:
        pass
    return {"problem": problem.name, "condition": condition, "seed": seed,
            "evaluations": ex.hit if ex.hit is not None else budget, "reached": ex.hit is not None,
            "seconds": round(time.monotonic() - t0, 1)}


def load_data(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_hw: dict[str, list[dict]] = {}
    for r in rows:
        by_hw.setdefault(r["hardware"]["id"], []).append(r)
    # the machine with the most rows is the replayed one; another is "the other CPU"
    order = sorted(by_hw, key=lambda h: -len(by_hw[h]))
    native_hw = by_hw[order[0]][0]["hardware"]
    other_hw = by_hw[order[1]][0]["hardware"] if len(order) > 1 else None
    group = lambda rs: {n: [r for r in rs if r["problem"] == n] for n in sorted({r["problem"] for r in rs})}
    return {"native": group(by_hw[order[0]]), "other": group(by_hw[order[1]]) if other_hw else {},
            "native_hw": native_hw, "other_hw": other_hw}


def summarize(results: list[dict], budget: int) -> list[dict]:
    from swarmfactory.harness.timing import median_ci

    out = []
    for name in dict.fromkeys(r["problem"] for r in results):
        cold = None
        for cond in CONDITIONS:
            rs = [r for r in results if r["problem"] == name and r["condition"] == cond]
            if not rs:
                continue
            vals = [r["evaluations"] for r in rs]
            med, lo, hi = median_ci(vals)
            cold = med if cond == "cold" else cold
            out.append({"problem": name, "condition": cond, "median": med, "ci": [lo, hi],
                        "reached": sum(r["reached"] for r in rs), "seeds": len(rs),
                        "values": [v if r["reached"] else f">{budget}" for v, r in zip(vals, rs)],
                        "vs_cold": (med / cold) if cold else None})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--problems", default=TARGETS)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=80, help="evaluations before a search is censored")
    ap.add_argument("--other-sample", type=int, default=40, help="configurations of each other problem in the warm store")
    ap.add_argument("--machine-sample", type=int, default=40, help="configurations from the other CPU")
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    import logging

    logging.getLogger("swarmfactory").setLevel(logging.ERROR)
    from swarmfactory.problems import load_problem

    data = load_data(args.data)
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    if data["other_hw"] is None:
        conditions = [c for c in conditions if c != "warm: other CPU"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in [s.strip() for s in args.problems.split(",") if s.strip()]:
            problem = load_problem(name)
            rows = [r for r in data["native"].get(name, []) if r["outcome"] in MEASURED]
            if not rows:
                print(f"{name}: no recorded rows; skipped", file=sys.stderr)
                continue
            best = max(r["speedup"] for r in rows)
            target = 0.95 * best
            hits = sum(r["speedup"] >= target for r in rows)
            print(f"{name}: {len(data['native'][name])} configurations recorded, best {best:.2f}x, "
                  f"target {target:.2f}x ({hits} configurations reach it)", file=sys.stderr)
            for cond in conditions:
                for seed in range(args.seeds):
                    r = trial(problem, cond, seed, data, target, args.budget, args.other_sample,
                              args.machine_sample, Path(tmp))
                    r.update(best=best, target=target, configurations_at_target=hits,
                             space=len(data["native"][name]))
                    results.append(r)
                    print(f"  {cond:22s} seed {seed}: {r['evaluations']}{'' if r['reached'] else ' (censored)'}"
                          f" evaluations ({r['seconds']} s)", file=sys.stderr)
    table = summarize(results, args.budget)
    print(f"\nEvaluations to reach 95% of the best known speedup (median [95% CI] over {args.seeds} seeds; "
          f"budget {args.budget})")
    print(f"{'problem':14s} {'condition':22s} {'median':>7s} {'95% CI':>14s} {'vs cold':>8s}  per seed")
    for t in table:
        vs = f"{t['vs_cold']:.2f}x" if t["vs_cold"] is not None and t["condition"] != "cold" else ""
        print(f"{t['problem']:14s} {t['condition']:22s} {t['median']:7.1f} "
              f"{'[' + format(t['ci'][0], '.1f') + ', ' + format(t['ci'][1], '.1f') + ']':>14s} {vs:>8s}  "
              f"{', '.join(map(str, t['values']))}")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "table": table, "native": data["native_hw"],
                                         "other": data["other_hw"]}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
