"""What scale-out costs and what the store takes, measured on this machine.

1. Evaluations per minute, the local executor against the Ray executor (a local Ray cluster on
   this machine's CPUs): the same problems, budget and seed, each trial on a fresh store, run
   interleaved A/B/A/B so machine load hits both alike. Ray's start-up is timed apart from the run.
2. Verdicts per second the store takes, from 1, 4 and 16 concurrent writers (separate processes,
   each with its own connections), repeated and interleaved, two ways: the coordinator's path
   (claim a lease, record problem + candidate + evaluation, release the lease: a transaction per
   store call) and the floor, one INSERT transaction per verdict (the evaluation row alone).
   PostgreSQL (``--pg URL`` or $SWARMFACTORY_PG_URL) and SQLite.

Prints tables (median and the min-max spread of the repeats) and writes them as JSON.

    python benchmarks/scaleout.py [--problems rmsnorm] [--budget 6] [--pairs 2] [--pg URL]
                                  [--writers 1,4,16] [--verdicts 400] [--repeats 3] [--skip-runs | --skip-store]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid

from rich.console import Console
from rich.table import Table


# -- 1. executors ---------------------------------------------------------------------------------
def one_run(executor: str, problems: str, budget: int, rounds: int, parallel: int) -> dict:
    from swarmfactory.config import RunConfig
    from swarmfactory.evidence.store import Store
    from swarmfactory.swarm.coordinator import Coordinator

    with tempfile.TemporaryDirectory(prefix="sf-scaleout-") as tmp, Store(os.path.join(tmp, "e.db")) as store:
        cfg = RunConfig.build(problems=problems, budget=budget, rounds=rounds, parallel=parallel, seed=0,
                              compile_baselines=False, remeasure_champions=False, executor=executor)
        t0 = time.monotonic()
        coord = Coordinator(cfg, store)  # the Ray executor starts its local cluster here
        t1 = time.monotonic()
        run_id = coord.run()
        t2 = time.monotonic()
        n = sum(1 for e in store.evaluations(run_id=run_id) if e.purpose == "search")
    return {"executor": executor, "start_s": t1 - t0, "run_s": t2 - t1, "evaluations": n,
            "per_min": n / ((t2 - t1) / 60), "loadavg": os.getloadavg()[0]}


def bench_executors(args, console) -> list[dict]:
    trials = []
    order = ["local", "ray"]
    for pair in range(args.pairs):
        for executor in (order if pair % 2 == 0 else order[::-1]):  # A B, B A, ...
            with console.status(f"pair {pair + 1}/{args.pairs}: {executor} executor, {args.budget} evaluations..."):
                r = one_run(executor, args.problems, args.budget, args.rounds, args.parallel)
            console.print(f"  {executor:5s} run {r['run_s']:6.1f} s  start {r['start_s']:5.1f} s  "
                          f"{r['per_min']:5.1f} eval/min  load {r['loadavg']:.1f}")
            trials.append(r)
    return trials


# -- 2. the store's record path -------------------------------------------------------------------
def _writer(url: str, n: int, tag: str, start, out, path: str = "coordinator") -> None:
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.evidence.leases import CLAIMED, Leases
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Outcome, ShapeTiming, Verdict
    from swarmfactory.problems import load_problem
    from swarmfactory.tools import tool_versions

    store = Store(url)
    p = load_problem("rmsnorm")
    run_id = store.create_run({"problems": ["rmsnorm"], "bench": tag})
    leases = Leases(store, run_id, ttl_s=120)
    source = p.render()
    shapes = [ShapeTiming(shape={"rows": 64, "cols": c}, candidate_us=3.1, baseline_us=9.8, reference_us=12.0,
                          speedup=3.16, ci_low=3.0, ci_high=3.3, vs_reference=3.9, roofline_fraction=0.4)
              for c in (576, 1536, 49152)]
    verdict = Verdict(Outcome.FASTER, "3.16x", "measure", speedup=3.16, shapes=shapes)
    cands = [candidate_record(p, f"{source}\n/* {tag} {i} */\n", "bench", "loop", run_id=run_id) for i in range(n)]

    def record(cand, verdict, vversion):  # the problem, candidate and evaluation rows, as a coordinator writes them
        store.record_problem(p)
        store.record_candidate(cand)
        store.record_evaluation(cand["id"], p, verdict, run_id, vversion, tools)

    tools = tool_versions()
    record(cands[0], Verdict(Outcome.WRONG, "warm-up", "verify"), "warm")  # connect, caches
    start.wait()
    t0 = time.perf_counter()
    for cand in cands:
        if path == "insert":  # the floor: one INSERT transaction per verdict, nothing else
            store.record_evaluation(cand["id"], p, verdict, run_id, "v1", tools)
            continue
        assert leases.claim(p, cand["id"], "v1").status == CLAIMED
        v = Verdict(Outcome.FASTER, "3.16x the baseline [3.0, 3.3]", "measure", speedup=3.16, ci_low=3.0,
                    ci_high=3.3, vs_reference=3.9, baseline="torch (eager)", shapes=shapes, cases_checked=40,
                    seconds=12.5, evidence={"timing": {"rows=64,cols=576": {"mode": "async", "sets": 2}}})
        record(cand, v, "v1")
        leases.release(p, cand["id"], "v1")
    out.put(time.perf_counter() - t0)
    store.close()


def record_rate(url: str, writers: int, per_writer: int, path: str) -> dict:
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(writers + 1), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, per_writer, uuid.uuid4().hex[:8], start, out, path))
             for _ in range(writers)]
    for pr in procs:
        pr.start()
    start.wait()
    t0 = time.perf_counter()
    times = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t0
    for pr in procs:
        pr.join()
    return {"path": path, "writers": writers, "verdicts": writers * per_writer, "wall_s": wall,
            "per_s": writers * per_writer / wall, "slowest_writer_s": max(times)}


def fresh_pg(server: str):
    from sqlalchemy import create_engine, text

    name = "sf_bench_" + uuid.uuid4().hex[:8]
    admin = create_engine(server.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))

    def drop():
        with admin.connect() as c:
            c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
            c.execute(text(f"DROP DATABASE {name}"))
        admin.dispose()
    return server.rsplit("/", 1)[0] + "/" + name, drop


def bench_store(args, console) -> list[dict]:
    from swarmfactory.evidence.store import Store

    backends = []
    if args.pg:
        backends.append("postgresql")
    else:
        console.print("[yellow]no --pg URL or $SWARMFACTORY_PG_URL: PostgreSQL skipped")
    backends.append("sqlite")
    rows = []
    with tempfile.TemporaryDirectory(prefix="sf-scaleout-") as tmp:
        for rep in range(args.repeats):
            for backend in (backends if rep % 2 == 0 else backends[::-1]):
                for path, writers in [("coordinator", w) for w in args.writers] + [("insert", w) for w in args.writers]:
                    if backend == "postgresql":
                        url, drop = fresh_pg(args.pg)
                    else:
                        url, drop = os.path.join(tmp, f"r{rep}w{writers}.db"), (lambda: None)
                    Store(url).close()  # the schema exists before the writers start
                    try:
                        r = record_rate(url, writers, max(1, args.verdicts // writers), path)
                    finally:
                        drop()
                    r.update(backend=backend, repeat=rep, loadavg=os.getloadavg()[0])
                    console.print(f"  {backend:10s} {path:11s} {writers:2d} writers: {r['per_s']:7.1f} verdicts/s "
                                  f"(load {r['loadavg']:.1f})")
                    rows.append(r)
    return rows


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default="rmsnorm")
    ap.add_argument("--budget", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=2, help="A/B pairs of local and Ray runs (order alternates)")
    ap.add_argument("--pg", default=os.environ.get("SWARMFACTORY_PG_URL"))
    ap.add_argument("--writers", default="1,4,16")
    ap.add_argument("--verdicts", type=int, default=400, help="verdicts per measurement, shared by the writers")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-runs", action="store_true", help="only the store's record path")
    ap.add_argument("--skip-store", action="store_true", help="only the executors")
    ap.add_argument("--json", default="benchmarks/scaleout.json")
    args = ap.parse_args(argv)
    args.writers = [int(w) for w in args.writers.split(",")]
    console = Console(width=160)
    from swarmfactory.hardware import cpu_fingerprint

    hw = cpu_fingerprint()
    console.print(f"{hw['model']} ({hw['cpus']} CPUs), load average {os.getloadavg()[0]:.1f}")
    result = {"hardware": hw, "args": vars(args)}
    if not args.skip_runs:
        trials = result["executors"] = bench_executors(args, console)
        t = Table(title=f"evaluations per minute: {args.problems}, budget {args.budget}, rounds {args.rounds}, "
                        f"parallel {args.parallel}; median [min-max] of {args.pairs}")
        for col in ("executor", "eval/min", "run s", "start-up s"):
            t.add_column(col, justify="right")
        for ex in ("local", "ray"):
            mine = [r for r in trials if r["executor"] == ex]
            t.add_row(ex, _spread([r["per_min"] for r in mine]), _spread([r["run_s"] for r in mine]),
                      _spread([r["start_s"] for r in mine]))
        console.print(t)
    if args.skip_store:
        return _write(args, result, console)
    rows = result["store"] = bench_store(args, console)
    t = Table(title="verdicts per second into the store; coordinator: claim + record (problem, candidate, "
                    "evaluation) + release, a transaction per call; insert: the evaluation row alone; "
                    f"median [min-max] of {args.repeats}")
    for col in ("store", "writers", "coordinator path/s", "insert only/s"):
        t.add_column(col, justify="right")
    for backend in dict.fromkeys(r["backend"] for r in rows):
        for w in args.writers:
            cells = [_spread([r["per_s"] for r in rows if r["backend"] == backend and r["writers"] == w
                              and r["path"] == path]) for path in ("coordinator", "insert")]
            t.add_row(backend, str(w), *cells)
    console.print(t)
    return _write(args, result, console)


def _write(args, result: dict, console) -> int:
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1, default=str)
    console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
