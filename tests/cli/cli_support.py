"""Helpers for the command-line tests: the installed entry point, and a real store holding a
recorded run (written through the store's API, so tables and reports need no harness run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def entry_point() -> str:
    """The ``swarmfactory`` console script installed beside this interpreter (the one users run)."""
    path = Path(sys.executable).with_name("swarmfactory")
    found = str(path) if path.exists() else shutil.which("swarmfactory")
    assert found, "the swarmfactory entry point is not installed (pip install -e .)"
    return found


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SWARMFACTORY_STORE", "SWARMFACTORY_DEBUG", "COLUMNS", "LINES")}
    env.update(extra)
    return env


def sf(*args: str, cwd=None, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the installed ``swarmfactory`` as a user would (not a TTY: output as in a pipe or CI log)."""
    return subprocess.run([entry_point(), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=clean_env(**(env or {})), timeout=timeout)


# The longest names the tables must show whole: every default agent, an LLM agent, the longest
# bundled problem and shape.
AGENTS = ["seed", "knob-blocking", "knob-vectorisation", "knob-threading", "knob-unrolling", "knob-algorithm",
          "crossover", "model-guided", "random-restart", "llm:openai:gpt-4o-mini"]


def recorded_run(db: Path, champion_agent: str = "knob-vectorisation") -> str:
    """A store with one run over rmsnorm and attention_decode: a faster candidate from every agent
    in ``AGENTS`` (speedup rising with the evaluation number), some rejected ones, and a champion
    per problem that was re-measured at the end (a lower figure than the search measured)."""
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Outcome, ShapeTiming, Verdict
    from swarmfactory.problems import load_problem

    store = Store(str(db))
    run = store.create_run({"problems": ["rmsnorm", "attention_decode"], "agents": ["default"], "budget": 30})
    for name in ("rmsnorm", "attention_decode"):
        p = load_problem(name)
        best = None
        for k, agent in enumerate(AGENTS + ["seed", "crossover"]):
            cand = candidate_record(p, f"/* {name} {k} */\n" + p.render(), agent, "test", run_id=run,
                                    generation=k)
            if k in (3, 7):
                verdict = Verdict(Outcome.BUILD_FAILED if k == 3 else Outcome.WRONG, "rejected", "build")
            else:
                s = 1.0 + 0.25 * k
                shapes = [ShapeTiming(dict(sh), 1000.0 / s, 1000.0, 1200.0, s, s * 0.97, s * 1.02, s * 1.2, 0.5)
                          for sh in p.workload]
                verdict = Verdict(Outcome.FASTER, f"{s:.2f}x", "measure", speedup=s, ci_low=s * 0.97,
                                  ci_high=s * 1.02, vs_reference=s * 1.2, roofline_fraction=0.5,
                                  baseline="eager", shapes=shapes)
            eid = store.record_verdict(p, cand, verdict, run, "vv")
            if agent == champion_agent and verdict.outcome is Outcome.FASTER:
                best = (cand, verdict.speedup, eid)
        cand, s, eid = best
        store.set_champion(p, cand["id"], eid, s, run, "found")
        s2 = s * 0.9  # the end-of-run re-measure
        shapes = [ShapeTiming(dict(sh), 1000.0 / s2, 1000.0, 1200.0, s2, s2 * 0.95, s2 * 1.03, s2 * 1.2, 0.5)
                  for sh in p.workload]
        v2 = Verdict(Outcome.FASTER, f"{s2:.2f}x", "measure", speedup=s2, ci_low=s2 * 0.95, ci_high=s2 * 1.03,
                     vs_reference=s2 * 1.2, roofline_fraction=0.5, baseline="eager", shapes=shapes)
        eid2 = store.record_verdict(p, cand, v2, run, "vv", purpose="remeasure")
        store.set_champion(p, cand["id"], eid2, s2, run, f"re-measured: {s2:.2f}x")
    store.set_run_status(run, "finished")
    store.close()
    return run
