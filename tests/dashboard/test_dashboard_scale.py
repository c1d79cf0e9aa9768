"""The dashboard stays responsive with 100,000 evaluations in a SQLite store: every endpoint answers
(first time, nothing cached) well within a generous bound, and the figures it shows are the ones
inserted. The times are printed; the bound only catches a per-request O(n) blow-up in Python."""

import random
import time
from datetime import datetime, timedelta, timezone

import pytest
from dashboard_support import get, serving
from sqlalchemy import insert

N_EVALUATIONS = 100_000
N_CANDIDATES = 5_000
BOUND_S = 5.0
OUTCOMES = ["faster", "not_faster", "wrong", "cheated", "build_failed", "crashed", "timed_out"]
AGENTS = ["seed", "knob-blocking", "knob-vectorisation", "knob-threading", "knob-unrolling", "crossover",
          "model-guided", "random-restart", "llm:openai:gpt-4o-mini"]
PROBLEMS = ["rmsnorm", "softmax", "swiglu", "rope"]


def fill(path: str, seed: int = 0) -> dict:
    """Bulk-insert a store: 3 runs (the newest running), 5,000 candidates in lineage chains,
    100,000 evaluations, champions, found cases and lessons. Returns what was inserted, counted."""
    from swarmfactory.evidence import schema as S
    from swarmfactory.evidence.store import Store

    rng = random.Random(seed)
    st = Store(path)
    t0 = datetime.now(timezone.utc) - timedelta(hours=3)
    runs = [f"run{k:05d}" for k in range(3)]
    hw = st.hardware["id"]
    shapes = [{"shape": {"rows": r, "cols": 576}, "candidate_us": 3.0, "baseline_us": 6.0, "reference_us": 9.0,
               "speedup": 2.0, "ci_low": 1.9, "ci_high": 2.1, "vs_reference": 3.0, "roofline_fraction": 0.4}
              for r in (1, 8, 128)]
    cands, evals, counts = [], [], {"run_outcomes": {}, "chain_end": None}
    for i in range(N_CANDIDATES):
        parent = [f"c{i - 1:019d}"] if i % 50 else []  # chains of 50: deep lineages
        cands.append({"id": f"c{i:019d}", "problem": PROBLEMS[i % 4], "backend": "c",
                      "source": f"/* candidate {i} */\nvoid k(float *x) {{ x[0] = {i}; }}\n", "flags": [],
                      "knobs": {"vw": 8, "unroll": i % 4}, "parents": parent, "agent": AGENTS[i % len(AGENTS)],
                      "operator": "mutate", "generation": i % 50, "run_id": runs[i * 3 // N_CANDIDATES],
                      "created_at": t0 + timedelta(seconds=i)})
    counts["chain_end"] = f"c{49:019d}"
    for i in range(N_EVALUATIONS):
        c = rng.randrange(N_CANDIDATES)
        run = runs[i * 3 // N_EVALUATIONS]
        o = OUTCOMES[min(int(rng.expovariate(0.9)), 6)]
        s = rng.uniform(1.0, 3.0) if o == "faster" else rng.uniform(0.3, 1.0) if o == "not_faster" else None
        if run == runs[-1]:
            counts["run_outcomes"][o] = counts["run_outcomes"].get(o, 0) + 1
        evals.append({"candidate_id": f"c{c:019d}", "problem": PROBLEMS[c % 4], "problem_spec": "spec",
                      "validation_version": "v1", "run_id": run, "purpose": "search", "hardware_id": hw,
                      "hardware": {"id": hw}, "tools": {"gcc": "12"}, "outcome": o, "stage": "measure",
                      "detail": f"{o} at evaluation {i}", "speedup": s, "ci_low": s and s * 0.95,
                      "ci_high": s and s * 1.05, "vs_reference": s, "roofline_fraction": None, "baseline": "eager",
                      "shapes": shapes if s else [], "flags": [], "evidence": {"isolation": "cgroup"},
                      "cases_checked": 134, "seconds": 1.5, "created_at": t0 + timedelta(seconds=i * 0.1)})
    with st.engine.begin() as conn:
        conn.execute(insert(S.runs), [{"id": r, "status": "running" if k == 2 else "finished",
                                       "config": {"problems": PROBLEMS, "budget": 40_000},
                                       "hardware_id": hw, "created_at": t0 + timedelta(hours=k)}
                                      for k, r in enumerate(runs)])
        conn.execute(insert(S.candidates), cands)
        for k in range(0, len(evals), 20_000):
            conn.execute(insert(S.evaluations), evals[k:k + 20_000])
        conn.execute(insert(S.champions), [{"problem": PROBLEMS[k % 4], "problem_spec": "spec", "hardware_id": hw,
                                            "candidate_id": f"c{k:019d}", "evaluation_id": k + 1, "run_id": runs[k % 3],
                                            "speedup": 1.0 + k / 100, "reason": "found",
                                            "created_at": t0 + timedelta(seconds=30 * k)} for k in range(400)])
        conn.execute(insert(S.validation_cases), [{"problem": PROBLEMS[k % 4], "case_key": f"case {k}",
                                                   "shape": {"rows": k, "cols": 576}, "seed": k, "dist": "tiny",
                                                   "found_by": "adversary", "broke_candidate": f"c{k:019d}"}
                                                  for k in range(300)])
        conn.execute(insert(S.lessons), [{"problem": PROBLEMS[k % 4], "hardware_id": hw, "agent": "analyst",
                                          "text": f"lesson {k}", "data": {"key": f"k{k % 60}", "status": "active"},
                                          "run_id": runs[k % 3]} for k in range(200)])
    st.close()
    counts["runs"] = runs
    return counts


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("big") / "evidence.db")
    t = time.perf_counter()
    counts = fill(path)
    return path, counts, time.perf_counter() - t


def test_every_endpoint_answers_quickly_with_100k_evaluations(big, capsys):
    path, counts, fill_s = big
    running = counts["runs"][-1]
    paths = ["/api/version", "/", f"/runs/{running}", f"/runs/{running}?before=90000", "/?fragment=1",
             f"/candidates/{counts['chain_end']}", "/api/runs", f"/api/runs/{running}",
             "/api/evaluations", "/api/evaluations?before=50000&limit=200", "/api/evaluations?outcome=cheated",
             "/api/evaluations?problem=rope&run=" + running, "/api/verdicts", "/api/scoreboard",
             f"/api/scoreboard?run={running}", "/api/champions", f"/api/candidates/{counts['chain_end']}",
             "/api/cases?offset=250", "/api/lessons", "/api/engine"]
    times = {}
    with serving(path) as server:
        for p in paths:
            t = time.perf_counter()
            status, _, body = get(server.url, p)
            times[p] = time.perf_counter() - t
            assert status == 200, (p, body[:300])
        import json

        run = json.loads(get(server.url, f"/api/runs/{running}")[2])
        got = {}
        for v in run["verdicts"]:
            for o, n in v["outcomes"].items():
                got[o] = got.get(o, 0) + n
        assert got == counts["run_outcomes"]
        assert run["progress"]["done"] == sum(counts["run_outcomes"].values())
        lineage = json.loads(get(server.url, f"/api/candidates/{counts['chain_end']}")[2])["ancestors"]
        assert len(lineage) == 30 and lineage[-1]["id"] == f"c{20:019d}"  # bounded at 30 ancestors
        t = time.perf_counter()
        get(server.url, "/")
        cached = time.perf_counter() - t
    with capsys.disabled():
        print(f"\ndashboard with {N_EVALUATIONS:,} evaluations (filled in {fill_s:.1f} s), first answers:")
        for p, s in times.items():
            print(f"  {s * 1000:8.1f} ms  {p}")
        print(f"  {cached * 1000:8.1f} ms  / again (unchanged store: cached)")
    slow = {p: round(s, 2) for p, s in times.items() if s > BOUND_S}
    assert not slow, f"endpoints slower than {BOUND_S} s with {N_EVALUATIONS} evaluations: {slow}"
