"""Helpers for the dashboard tests: stores filled through the store's own API (a kernel run in
progress with lineage, rejections, a found case and a lesson; an engine tuning run), a real
dashboard server on 127.0.0.1 in a thread, and plain HTTP reads."""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cli_support import clean_env, entry_point, sf  # noqa: E402,F401 - the installed CLI, as users run it


@contextmanager
def store_url(kind: str, tmp_path, request):
    """A fresh store's location: a SQLite file, or a new database on the tests' PostgreSQL server
    (``pg_database`` in tests/conftest.py; skipped where there is none)."""
    if kind == "sqlite":
        yield str(tmp_path / "evidence.db")
        return
    with request.getfixturevalue("pg_database")() as url:
        yield url


def _verdict(outcome: str, s: float | None = None, detail: str = "", shapes=()):
    from swarmfactory.outcome import Outcome, ShapeTiming, Verdict

    if s is None:
        return Verdict(Outcome(outcome), detail or outcome, "verify", cases_checked=3,
                       evidence={"case": {"rows": 7, "cols": 1023}, "api_key": "sk-do-not-show"})
    timings = [ShapeTiming(dict(sh), 1000.0 / s, 1000.0, 1300.0, s, s * 0.95, s * 1.05, s * 1.3, 0.4) for sh in shapes]
    return Verdict(Outcome(outcome), detail or f"{s:.2f}x", "measure", speedup=s, ci_low=s * 0.95, ci_high=s * 1.05,
                   vs_reference=s * 1.3, roofline_fraction=0.4, baseline="torch eager, 2 threads", shapes=timings,
                   cases_checked=134)


def kernel_run(url: str) -> dict:
    """A kernel run still ``running`` (budget 20) on rmsnorm: a seed, a faster child and
    grandchild (champions), one not-faster, one wrong on a named case, one build failure; a case
    the adversary found that broke the wrong one; a lesson. Returns the ids the tests look for."""
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.evidence.store import Store
    from swarmfactory.problems import load_problem

    st = Store(url)
    p = load_problem("rmsnorm")
    run = st.create_run({"problems": ["rmsnorm"], "agents": ["default"], "budget": 20})
    src = p.render()
    seed = candidate_record(p, src, "seed", "template", run_id=run)
    child_src = src.replace("{", "{\n    /* unrolled by the test */", 1)
    child = candidate_record(p, child_src, "knob-unrolling", "mutate", parents=[seed["id"]], generation=1, run_id=run)
    grand = candidate_record(p, child_src + "\n/* grandchild */\n", "crossover", "cross", parents=[child["id"]],
                             generation=2, run_id=run)
    slow = candidate_record(p, src + "\n/* slow */\n", "knob-threading", "mutate", parents=[seed["id"]],
                            generation=1, run_id=run)
    bad = candidate_record(p, src + "\n/* wrong */\n", "model-guided", "predict", parents=[seed["id"]], generation=1,
                           run_id=run)
    broken = candidate_record(p, "int broken(", "knob-blocking", "mutate", run_id=run)
    ids = {"run": run, "seed": seed["id"], "child": child["id"], "grand": grand["id"], "bad": bad["id"],
           "broken": broken["id"]}
    e_seed = st.record_verdict(p, seed, _verdict("faster", 1.2, shapes=p.workload), run, "v1")
    st.set_champion(p, seed["id"], e_seed, 1.2, run, "found")
    e_child = st.record_verdict(p, child, _verdict("faster", 1.9, shapes=p.workload), run, "v1")
    st.set_champion(p, child["id"], e_child, 1.9, run, "found")
    st.record_verdict(p, slow, _verdict("not_faster", 0.8, shapes=p.workload), run, "v1")
    ids["wrong_eval"] = st.record_verdict(p, bad, _verdict("wrong", detail="max error 3.1e+00 > tol on shape 7x1023 "
                                                    "seed 5 dist tiny"), run, "v1")
    from swarmfactory.outcome import Outcome, Verdict

    st.record_verdict(p, broken, Verdict(Outcome.BUILD_FAILED, "error: expected declaration", "build"), run, "v1")
    e_grand = st.record_verdict(p, grand, _verdict("faster", 2.4, shapes=p.workload), run, "v1")
    st.set_champion(p, grand["id"], e_grand, 2.4, run, "found")
    from swarmfactory.problems.spec import Case

    st.add_case("rmsnorm", Case({"rows": 7, "cols": 1023}, 5, "tiny"), "adversary", bad["id"], "broke model-guided")
    st.add_lesson("rmsnorm", "analyst", "rmsnorm: unroll 4 beats 1 by 1.31x [1.22, 1.40], n=14",
                  {"key": "rmsnorm|unroll|4>1", "status": "active", "knob": "unroll"}, run)
    ids["search_evaluations"] = 6
    st.close()
    return ids


def engine_run(url: str) -> dict:
    """A finished engine tuning run: the default design and one tuned design, with serving figures."""
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Outcome, Verdict

    st = Store(url)
    run = st.create_run({"kind": "engine-tune", "model": "/models/SmolLM2-135M-Instruct-Q4_1.gguf",
                         "weights": "q4_1", "concurrency": [1, 16], "workloads": [[128, 128]], "budget": 2})

    class EngineProblem:  # what the store needs of a problem: a name and a spec hash
        name, version = "engine:SmolLM2-135M", 1

        def spec_hash(self):
            return "spec0001"

    def serving(tok1, tok16):
        return {"128x128": [{"concurrency": 1, "output_tok_s": tok1, "ttft_ms_p99": 80.0, "tpot_ms_median": 9.0},
                            {"concurrency": 16, "output_tok_s": tok16, "ttft_ms_p99": 410.0, "tpot_ms_median": 30.0}]}

    out = {"run": run}
    for name, agent, ratio, tok1, tok16 in (("default", "seed", 1.0, 101.5, 612.25), ("tuned", "model-guided", 1.18,
                                                                                    117.0, 731.75)):
        cand = {"id": f"design-{name}-{run}", "problem": EngineProblem.name, "backend": "engine",
                "source": json.dumps({"threads": 2, "name": name}), "flags": [], "knobs": {"threads": 2},
                "parents": [], "agent": agent, "operator": "design", "generation": 0, "run_id": run}
        st.record_candidate(cand)
        v = Verdict(Outcome.FASTER if ratio > 1 else Outcome.NOT_FASTER, "", "measure", speedup=ratio,
                    evidence={"serving": serving(tok1, tok16), "fitness": tok16, "design": f"{name}: threads=2"})
        st.record_evaluation(cand["id"], EngineProblem(), v, run, "-", {}, "search")
        out[name] = cand["id"]
    st.set_run_status(run, "finished")
    st.close()
    return out


@contextmanager
def serving(url: str):
    """A real dashboard server on 127.0.0.1 (a free port) over the store at ``url``, in a thread."""
    from swarmfactory.dashboard.server import DashboardServer
    from swarmfactory.evidence.store import Store

    server = DashboardServer(Store(url, create=False), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        server.dashboard.store.close()
        thread.join(10)


def get(base: str, path: str, method: str = "GET") -> tuple[int, str, bytes]:
    req = urllib.request.Request(base.rstrip("/") + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def get_json(base: str, path: str):
    status, ctype, body = get(base, path)
    assert status == 200 and ctype == "application/json", (path, status, body[:300])
    return json.loads(body)
