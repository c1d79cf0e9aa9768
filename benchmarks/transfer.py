"""Does knowledge transfer? Evaluations a search needs to reach a target, warm against cold and
against simple baselines, replayed from recorded measurements.

Every verdict is replayed from the recorded sweep (``benchmarks/knob_sweep.py``: each row a real
build, verification and interleaved timing on the machine that recorded it, with its per-shape
speedups and the contention it was measured under), so every condition and every seed sees the
same figures for the same configuration; only the order of the search differs.

**Targets** (per problem; the count is the search evaluations up to and including the first that
hits it, censored at ``--budget``, marked ``>``):

* ``95%`` / ``85%``: a configuration whose recorded speedup is at least 95% (85%) of the
  *confirmed* best: the sweep's top configurations are measured again (``knob_sweep.py
  --confirm``), each is credited with the lesser of its two measurements (what both support),
  and the best of those sets the bar, so one lucky measurement does not (the sweep's best where
  there are no re-measurements);
* ``top 5``: any of the sweep's five best configurations.

**Conditions.**

* ``cold``: the swarm (real coordinator, default agents, analyst, cost model, bandit) on an empty
  evidence store;
* ``warm: SOURCE / MECHANISM``: the store starts with what an earlier run left. SOURCE is ``other
  problems`` (``--other-sample`` recorded configurations of every other problem on the replayed
  machine), ``other CPU`` (``--machine-sample`` of the same problem on the other recorded machine)
  or ``both``; MECHANISM is ``lessons`` (only the lessons the analyst drew from that evidence: the
  cost model gets no transferred rows), ``cost model`` (the evidence, no lessons) or ``both``;
* baselines with no swarm at all: ``random`` (a random order of the space), ``default-first``
  (the template's defaults, then every configuration one knob away from them, then random: what
  a person would try), ``one-line rule`` (the space ordered by ``log2(vw) - 3 x threads_on``, no
  data at all), ``copy: nearest problem`` (the space ordered by the measured speedups of
  the configurations of the other problem sharing most knobs, matched on the shared knobs) and
  ``copy: other CPU`` (ordered by the same problem's measured speedups on the other machine);
  each copy also ``(sampled)``: from as many rows of its source as a warm store holds
  (``--other-sample``, ``--machine-sample``), not the whole recorded sweep.

The table gives, per target, the median over seeds with its 95% CI, and the ratio to cold's
median with a bootstrap 95% CI (over seeds, both conditions resampled).

    python benchmarks/transfer.py                                   # the four transfer problems
    python benchmarks/transfer.py --problems layernorm --seeds 10 --jobs 2 --json out.json

**Which machines.** ``--native`` picks the replayed machine and ``--other`` "the other CPU" among
the recorded ones (a fingerprint id or its prefix; default: the machine with the most rows, then
the next). The bundled recordings hold an AMD Zen 4 (AVX-512), the same masked to AVX2, and an
AMD Zen 3 (AVX2), so transfer runs between real machines both ways:

    python benchmarks/transfer.py --data benchmarks/data/knob_sweep.jsonl \
        --data benchmarks/data/knob_sweep_zen3.jsonl --native b2ef6eb8b97b --other 87d466a2dc31

**From one model to the next.** ``--data`` may be given several times (the sweeps merge), and
``--sources`` names the problems "other problems" and the nearest-problem copies may draw from.
The second model's derived problems (``swarmfactory problems --from-model FILE``, then
``knob_sweep.py --problems NAME.MODEL,...``) warm from the first model's (the bundled problems
carry SmolLM2-135M's shapes):

    python benchmarks/transfer.py --data benchmarks/data/knob_sweep.jsonl \
        --data benchmarks/data/knob_sweep_gemma.jsonl \
        --problems rmsnorm.gemma-3-270m-q4_k_m,add_rmsnorm.gemma-3-270m-q4_k_m,... \
        --sources add_rmsnorm,attention_decode,geglu,layernorm,q4_1_matmul,q8_0_matmul,rmsnorm,rope,softmax,swiglu
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import zlib
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

from swarmfactory import lifecycle
from swarmfactory.outcome import MEASURED
from swarmfactory.swarm.executors import Executor

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "knob_sweep.jsonl"
TARGETS = "layernorm,add_rmsnorm,geglu,q8_0_matmul"
GOALS = ("95%", "85%", "top 5")
SOURCES = ("other problems", "other CPU", "both")
MECHANISMS = ("lessons", "cost model", "both")
SWARM = ("cold",) + tuple(f"warm: {s} / {m}" for s in SOURCES for m in MECHANISMS)
BASELINES = ("random", "default-first", "one-line rule", "copy: nearest problem", "copy: other CPU",
             "copy: nearest problem (sampled)", "copy: other CPU (sampled)")
CONDITIONS = SWARM + BASELINES


class Reached(Exception):
    """The search hit every target: the trial is over."""


def _key(knobs: dict) -> str:
    from swarmfactory.problems.spec import knob_key

    return knob_key(knobs)


def _verdict(row: dict, detail: str = "replayed from the recorded sweep"):
    from swarmfactory.outcome import Outcome, ShapeTiming, Verdict

    ci = row.get("ci") or [None, None]
    shapes = [ShapeTiming(dict(s["shape"]), 1.0 / s["speedup"], 1.0, None, s["speedup"],
                          (s.get("ci") or [s["speedup"]] * 2)[0], (s.get("ci") or [s["speedup"]] * 2)[1], None)
              for s in row.get("shapes") or [] if s.get("speedup")]
    evidence = {"contention": row["contention"]} if row.get("contention") else {}
    return Verdict(Outcome(row["outcome"]), detail, "measure", speedup=row["speedup"], ci_low=ci[0],
                   ci_high=ci[1], shapes=shapes, evidence=evidence)


class ReplayExecutor(Executor):
    """An executor whose verdicts are the recorded measurements of the configuration proposed; it
    notes the evaluation at which each target was first hit."""

    def __init__(self, problem, rows: list[dict], goals: dict[str, set[str]]):
        self.by_source = {problem.render(r["knobs"]): r for r in rows}
        self.goals, self.submitted, self.hits = goals, 0, {}

    def submit(self, problem, source, cases) -> Future:
        from swarmfactory.outcome import Outcome, Verdict

        self.submitted += 1
        row = self.by_source.get(source)
        fut: Future = Future()
        if row is None:
            fut.set_result(Verdict(Outcome.CRASHED, "not in the recorded sweep", "replay"))
            return fut
        fut.set_result(_verdict(row))
        key = _key(row["knobs"])
        for goal, keys in self.goals.items():
            if goal not in self.hits and key in keys:
                self.hits[goal] = self.submitted
        return fut

    def shutdown(self, wait: bool = True) -> None:
        pass


class StopAtTarget:
    """Progress that ends the run once the executor has hit every target."""

    def __init__(self, executor: ReplayExecutor):
        self.executor = executor

    def start(self, *a): ...
    def stop(self): ...

    def update(self, done, champions, counts):
        if len(self.executor.hits) == len(self.executor.goals):
            raise Reached()


def _record(store, rows: list[dict], hardware: dict, lessons: bool) -> None:
    """Record ``rows`` as evaluations made on ``hardware`` (an earlier run there) and, with
    ``lessons``, let the analyst draw that machine's lessons from them, as that run's end would."""
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
            store.record_verdict(p, cand, _verdict(r, "recorded sweep"), None, validation_set(p, store)[1], "search")
        if lessons:
            Analyst(store).update(list(problems.values()), None, [hardware["id"]])
    finally:
        store.hardware = own


def _prefill(store, groups: list[tuple[list[dict], dict]], mechanism: str, scratch: Path) -> int:
    """What an earlier run left in ``store``: for each (rows, hardware) group, the evidence
    (mechanism ``cost model``), its lessons (``lessons``: drawn in a scratch store and only they
    copied over) or both. Returns the lessons the store holds."""
    from swarmfactory.evidence.store import Store

    if mechanism == "lessons":
        tmp = Store(str(scratch))
        for rows, hw in groups:
            _record(tmp, rows, hw, lessons=True)
        for lesson in tmp.current_lessons():
            store.add_lesson(lesson.problem, lesson.agent, lesson.text, lesson.data, None, lesson.hardware_id)
    else:
        for rows, hw in groups:
            _record(store, rows, hw, lessons=mechanism == "both")
    return len(store.current_lessons())


def swarm_trial(problem, condition: str, seed: int, data: dict, goals: dict[str, set[str]], budget: int,
                other_sample: int, machine_sample: int, workdir: Path, agents: str = "default") -> dict:
    from swarmfactory.config import RunConfig
    from swarmfactory.evidence.store import Store
    from swarmfactory.swarm.coordinator import Coordinator

    tag = f"{problem.name}-{zlib.crc32(condition.encode())}-{seed}"
    store = Store(str(workdir / f"{tag}.db"))
    store.hardware = data["native_hw"]  # the replayed machine is the one the sweep measured
    rng = random.Random(f"{problem.name}:{condition}:{seed}")
    lessons = 0
    if condition != "cold":
        source, mechanism = condition.removeprefix("warm: ").split(" / ")
        groups = []
        if source in ("other problems", "both"):
            rows = []
            for name, prow in data["native"].items():
                if name != problem.name and _is_source(name, data):
                    rows += rng.sample(prow, min(other_sample, len(prow)))
            groups.append((rows, data["native_hw"]))
        if source in ("other CPU", "both"):
            prow = data["other"].get(problem.name, [])
            if not prow:
                raise SystemExit(f"no recorded rows of {problem.name} from another machine in the sweep")
            groups.append((rng.sample(prow, min(machine_sample, len(prow))), data["other_hw"]))
        lessons = _prefill(store, groups, mechanism, workdir / f"{tag}-scratch.db")
    ex = ReplayExecutor(problem, data["native"][problem.name], goals)
    cfg = RunConfig.build(problems=problem.name, budget=budget, agents=agents, parallel=1, seed=seed,
                          remeasure_champions=False)
    t0 = time.monotonic()
    try:
        Coordinator(cfg, store, progress=StopAtTarget(ex), executor=ex).run()
    except Reached:
        pass
    return {"hits": dict(ex.hits), "lessons_at_start": lessons, "seconds": round(time.monotonic() - t0, 1)}


def baseline_order(problem, condition: str, seed: int, data: dict, sample: int | None = None) -> list[str]:
    """The order in which a baseline tries the recorded configurations (knob keys). A ``sampled``
    copy reads ``sample`` seeded rows of its source (the evidence a warm store holds), the plain
    copies every recorded row of it."""
    rows = data["native"][problem.name]
    rng = random.Random(f"{problem.name}:{condition}:{seed}")
    keys = [_key(r["knobs"]) for r in rows]
    rest = keys[:]
    rng.shuffle(rest)
    if condition == "random":
        return rest
    if condition == "default-first":
        default = dict(problem.knob_defaults)
        near = [k for k, r in zip(keys, rows) if sum(r["knobs"].get(n) != v for n, v in default.items()) == 1]
        rng.shuffle(near)
        first = [_key(default)] + near
        return first + [k for k in rest if k not in set(first)]
    if condition == "one-line rule":
        pos = {k: j for j, k in enumerate(rest)}

        def rule(i: int) -> tuple:
            k = rows[i]["knobs"]
            vw = k.get("vw", 1)
            score = math.log2(vw) if isinstance(vw, (int, float)) and vw > 0 else 0.0
            return (-(score - 3.0 * (k.get("threads", "none") not in ("none", 1, "1"))), pos[keys[i]])

        return [keys[i] for i in sorted(range(len(rows)), key=rule)]
    if condition.startswith("copy: other CPU"):
        source = data["other"].get(problem.name, [])
    else:
        source = data["native"].get(nearest_problem(problem.name, data), [])
    if condition.endswith("(sampled)") and sample is not None:
        source = random.Random(f"{problem.name}:{condition}:{seed}:source").sample(source, min(sample, len(source)))
    shared = [n for n in problem.knobs if source and n in source[0]["knobs"]]
    score: dict[str, list[float]] = {}
    for r in source:
        if r["outcome"] in MEASURED and r.get("speedup"):
            score.setdefault(json.dumps([r["knobs"].get(n) for n in shared]), []).append(math.log(r["speedup"]))
    mean = {k: sum(v) / len(v) for k, v in score.items()}

    def rank(i: int) -> tuple:
        s = mean.get(json.dumps([rows[i]["knobs"].get(n) for n in shared]))
        return (s is None, -(s or 0.0), order[keys[i]])

    order = {k: j for j, k in enumerate(rest)}   # ties and unknowns in a random order
    return [keys[i] for i in sorted(range(len(rows)), key=rank)]


def _without_other_cpu(conditions: list[str]) -> list[str]:
    """The conditions that need no recorded rows from another machine."""
    return [c for c in conditions if "other CPU" not in c and "both /" not in c]


def _is_source(name: str, data: dict) -> bool:
    """May ``name``'s recorded rows be what "other problems" transfers from (``--sources``)?"""
    return data.get("sources") is None or name in data["sources"]


def nearest_problem(name: str, data: dict) -> str | None:
    """The other recorded problem (among ``--sources``) whose knobs share the most names (then
    values) with ``name``'s."""
    mine = data["native"][name][0]["knobs"]
    best, score = None, (-1, -1)
    for other, rows in data["native"].items():
        if other == name or not rows or not _is_source(other, data):
            continue
        theirs = rows[0]["knobs"]
        shared = [n for n in mine if n in theirs]
        values = sum(len({r["knobs"].get(n) for r in data["native"][name]} & {r["knobs"].get(n) for r in rows})
                     for n in shared)
        if (len(shared), values) > score:
            best, score = other, (len(shared), values)
    return best


def baseline_trial(problem, condition: str, seed: int, data: dict, goals: dict[str, set[str]], budget: int,
                   sample: int | None = None) -> dict:
    order = baseline_order(problem, condition, seed, data, sample)[:budget]
    hits = {}
    for goal, keys in goals.items():
        at = next((i + 1 for i, k in enumerate(order) if k in keys), None)
        if at is not None:
            hits[goal] = at
    return {"hits": hits, "lessons_at_start": 0, "seconds": 0.0}


def goals_for(name: str, data: dict) -> tuple[dict[str, set[str]], dict]:
    """The target sets (knob keys) of one problem and what they were set from."""
    rows = [r for r in data["native"][name] if r["outcome"] in MEASURED and r.get("speedup")]
    # a configuration's confirmed speedup: what both its sweep measurement and its re-measurement support
    again = data["confirm"].get(name, {})
    confirmed = {_key(r["knobs"]): min(r["speedup"], again[_key(r["knobs"])]) for r in rows if _key(r["knobs"]) in again}
    best_sweep = max(r["speedup"] for r in rows)
    best = max(confirmed.values()) if confirmed else best_sweep
    ranked = sorted(rows, key=lambda r: -r["speedup"])
    goals = {"95%": {_key(r["knobs"]) for r in rows if r["speedup"] >= 0.95 * best},
             "85%": {_key(r["knobs"]) for r in rows if r["speedup"] >= 0.85 * best},
             "top 5": {_key(r["knobs"]) for r in ranked[:5]}}
    return goals, {"best": best, "best_sweep": best_sweep, "confirmed": bool(confirmed),
                   "space": len(data["native"][name]), "at_target": {g: len(k) for g, k in goals.items()}}


def load_data(paths: Path | list[Path], sources: list[str] | None = None, native: str | None = None,
              other: str | None = None) -> dict:
    """The recorded sweep(s) in ``paths`` (JSON lines; several files merge), grouped by machine and
    problem; ``sources``: the problems "other problems" may draw from (None: every other one);
    ``native`` / ``other``: the fingerprint ids (or a prefix) of the replayed machine and of "the
    other CPU" (default: the machine with the most rows, then the next)."""
    paths = [paths] if isinstance(paths, Path) else list(paths)
    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    confirm_rows = [r for r in rows if r.get("confirm")]
    rows = [r for r in rows if not r.get("confirm")]
    by_hw: dict[str, list[dict]] = {}
    for r in rows:
        by_hw.setdefault(r["hardware"]["id"], []).append(r)
    # the machine with the most rows is the replayed one; the next "the other CPU"
    order = sorted(by_hw, key=lambda h: -len(by_hw[h]))
    for pos, want in ((0, native), (1, other)):
        if want:
            match = [h for h in by_hw if h.startswith(want)]
            if len(match) != 1:
                raise SystemExit(f"no single recorded machine has the id {want!r}; recorded: {', '.join(sorted(by_hw))}")
            order.remove(match[0])
            order.insert(pos, match[0])
    merged = lambda rs: {k: v for r in rs for k, v in r["hardware"].items()}   # rows recorded before a field existed lack it
    native_hw = merged(by_hw[order[0]])
    other_hw = merged(by_hw[order[1]]) if len(order) > 1 else None
    group = lambda rs: {n: [r for r in rs if r["problem"] == n] for n in sorted({r["problem"] for r in rs})}
    confirm: dict[str, dict[str, float]] = {}
    for r in confirm_rows:
        if r["hardware"]["id"] == native_hw["id"] and r["outcome"] in MEASURED and r.get("speedup"):
            confirm.setdefault(r["problem"], {})[_key(r["knobs"])] = r["speedup"]
    return {"native": group(by_hw[order[0]]), "other": group(by_hw[order[1]]) if other_hw else {},
            "native_hw": native_hw, "other_hw": other_hw, "confirm": confirm,
            "sources": set(sources) if sources else None}


def _die_with_parent() -> None:
    """A trial worker ends with the replay that started it, even one killed with SIGKILL (the
    pool's workers otherwise outlive it, reparented, until their queue breaks)."""
    from swarmfactory.lifecycle import Limits

    Limits(die_with_parent=True).preexec()()


def _one(args: tuple) -> dict:
    """One trial (run in a worker process)."""
    import logging

    logging.getLogger("swarmfactory").setLevel(logging.ERROR)
    from swarmfactory.problems import load_problem

    name, condition, seed, data, goals, budget, other_sample, machine_sample, workdir, agents, vw_absolute = args
    if vw_absolute:
        from swarmfactory.knowledge import costmodel

        costmodel.VW_AGAINST_LANES = False
    problem = load_problem(name)
    if condition in BASELINES:
        sample = machine_sample if condition.startswith("copy: other CPU") else other_sample
        r = baseline_trial(problem, condition, seed, data, goals, budget, sample)
    else:
        r = swarm_trial(problem, condition, seed, data, goals, budget, other_sample, machine_sample, Path(workdir),
                        agents)
    return {"problem": name, "condition": condition, "seed": seed, **r}


def ratio_ci(a: list[float], b: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """median(a) / median(b) and its percentile-bootstrap 95% CI (each side resampled on its own)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    A, B = np.asarray(a, float), np.asarray(b, float)
    point = float(np.median(A) / np.median(B))
    boots = (np.median(A[rng.integers(0, len(A), (resamples, len(A)))], axis=1)
             / np.median(B[rng.integers(0, len(B), (resamples, len(B)))], axis=1))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return point, float(lo), float(hi)


def summarize(results: list[dict], budget: int) -> list[dict]:
    from swarmfactory.harness.timing import median_ci

    out = []
    for name in dict.fromkeys(r["problem"] for r in results):
        for goal in GOALS:
            cold = None
            for cond in CONDITIONS:
                rs = [r for r in results if r["problem"] == name and r["condition"] == cond]
                if not rs:
                    continue
                vals = [r["hits"].get(goal, budget) for r in rs]
                med, lo, hi = median_ci(vals)
                if cond == "cold":
                    cold = vals
                vs = ratio_ci(vals, cold) if cold and cond != "cold" else None
                out.append({"problem": name, "goal": goal, "condition": cond, "median": med, "ci": [lo, hi],
                            "reached": sum(goal in r["hits"] for r in rs), "seeds": len(rs),
                            "values": [v if goal in r["hits"] else f">{budget}" for v, r in zip(vals, rs)],
                            "vs_cold": vs})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, action="append", default=None,
                    help=f"a recorded sweep (JSON lines; repeat to merge several; default {DATA.relative_to(HERE.parent)})")
    ap.add_argument("--sources", default=None,
                    help="the recorded problems that 'other problems' (and its copy baselines) draw from, "
                         "comma-separated (default: every other recorded problem)")
    ap.add_argument("--native", default=None,
                    help="the replayed machine: a recorded fingerprint id or its prefix (default: the one with most rows)")
    ap.add_argument("--other", default=None,
                    help="'the other CPU': a recorded fingerprint id or its prefix (default: the one with the next most rows)")
    ap.add_argument("--problems", default=TARGETS)
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--budget", type=int, default=80, help="evaluations before a search is censored")
    ap.add_argument("--other-sample", type=int, default=40, help="configurations of each other problem in the warm store")
    ap.add_argument("--machine-sample", type=int, default=40, help="configurations from the other CPU")
    ap.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated; default: all")
    ap.add_argument("--agents", default="default", help="the swarm's agents (as `swarmfactory run --agents`)")
    ap.add_argument("--jobs", type=int, default=1, help="trials run at once (worker processes)")
    ap.add_argument("--vw-absolute", action="store_true",
                    help="ablation: the cost model takes the vector width as is, not against the machine's "
                         "register width (costmodel.VW_AGAINST_LANES)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    sources = [s.strip() for s in args.sources.split(",") if s.strip()] if args.sources else None
    data = load_data(args.data or [DATA], sources, args.native, args.other)
    print(f"replayed machine: {data['native_hw'].get('model')} ({data['native_hw']['id']}); other CPU: "
          + (f"{data['other_hw'].get('model')} ({data['other_hw']['id']})" if data["other_hw"] else "none"),
          file=sys.stderr)
    unknown_sources = sorted(set(sources or ()) - set(data["native"]))
    if unknown_sources:
        ap.error(f"--sources names problems with no recorded rows: {', '.join(unknown_sources)}")
    old = sorted({name for group in ("native", "other") for name, rows in data[group].items()
                  if any("yardstick" not in r for r in rows)})
    if old:
        print(f"note: the rows of {', '.join(old)} were recorded before a multi-threaded baseline was "
              f"also timed on one thread (a stalled team could inflate a shape's speedup; "
              f"benchmarks/data/README.md)", file=sys.stderr)
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        ap.error(f"unknown condition(s) {unknown}; known: {', '.join(CONDITIONS)}")
    if "cold" not in conditions:
        conditions.insert(0, "cold")
    if data["other_hw"] is None:
        conditions = _without_other_cpu(conditions)
    results, setup = [], {}
    with lifecycle.temp_dir_for("sf-transfer-") as tmp:  # the guard removes it after a kill -9 too
        jobs = []
        for name in [s.strip() for s in args.problems.split(",") if s.strip()]:
            if not [r for r in data["native"].get(name, []) if r["outcome"] in MEASURED]:
                print(f"{name}: no recorded rows; skipped", file=sys.stderr)
                continue
            goals, info = goals_for(name, data)
            info["nearest"] = nearest_problem(name, data)
            setup[name] = info
            print(f"{name}: {info['space']} configurations recorded, best {info['best']:.2f}x "
                  f"({'confirmed by re-measurement' if info['confirmed'] else 'one measurement'}; sweep best "
                  f"{info['best_sweep']:.2f}x); configurations at each target: {info['at_target']}; nearest problem "
                  f"{info['nearest']}", file=sys.stderr)
            mine = conditions
            if not data["other"].get(name):
                mine = _without_other_cpu(conditions)
                if mine != conditions:
                    print(f"{name}: no recorded rows from another machine; its other-CPU conditions are skipped",
                          file=sys.stderr)
            jobs += [(name, c, s, data, goals, args.budget, args.other_sample, args.machine_sample, tmp, args.agents,
                      args.vw_absolute) for c in mine for s in range(args.seeds)]
        bar = Progress(TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=Console(stderr=True))
        task = bar.add_task("trials", total=len(jobs))
        with bar:
            if args.jobs > 1:
                with ProcessPoolExecutor(args.jobs, initializer=_die_with_parent) as pool:
                    for r in pool.map(_one, jobs, chunksize=1):
                        results.append(r)
                        bar.advance(task)
            else:
                for job in jobs:
                    results.append(_one(job))
                    bar.advance(task)
    table = summarize(results, args.budget)
    print(f"\nEvaluations to reach each target (median [95% CI] over {args.seeds} seeds; budget {args.budget}, "
          f"censored counts as the budget); vs cold: ratio of medians [bootstrap 95% CI]")
    for name in setup:
        for goal in GOALS:
            print(f"\n{name}, target {goal}{' of the confirmed best' if goal != 'top 5' else ''}:")
            print(f"  {'condition':36s} {'median':>7s} {'95% CI':>14s} {'reached':>8s} {'vs cold':>20s}")
            for t in table:
                if t["problem"] != name or t["goal"] != goal:
                    continue
                vs = (f"{t['vs_cold'][0]:.2f}x [{t['vs_cold'][1]:.2f}, {t['vs_cold'][2]:.2f}]"
                      if t["vs_cold"] else "")
                ci = f"[{t['ci'][0]:.1f}, {t['ci'][1]:.1f}]"
                print(f"  {t['condition']:36s} {t['median']:7.1f} {ci:>14s} {t['reached']:>4d}/{t['seeds']:<3d} {vs:>20s}")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "table": table, "setup": setup,
                                         "native": data["native_hw"], "other": data["other_hw"],
                                         "args": {k: str(v) for k, v in vars(args).items()}}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
