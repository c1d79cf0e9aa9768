"""Public Python API, mirroring the CLI: ``evaluate`` a kernel file; ``run`` the swarm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swarmfactory.evidence.store import Store, content_hash
from swarmfactory.problems import Problem, load_problem
from swarmfactory.tools import tool_versions
from swarmfactory.validation import validation_set

if TYPE_CHECKING:  # the harness loads only where a kernel is built and measured
    from swarmfactory.harness.evaluate import HarnessConfig
    from swarmfactory.harness.outcome import Verdict


def candidate_record(problem: Problem, source: str, agent: str, operator: str, *, backend: str = "c",
                     knobs: dict | None = None, parents: list[str] | None = None, generation: int = 0,
                     run_id: str | None = None, flags: list[str] | None = None) -> dict[str, Any]:
    return {"id": content_hash(source, backend, flags or []), "problem": problem.name,
            "backend": backend, "source": source, "flags": flags or [], "knobs": knobs,
            "parents": parents or [], "agent": agent, "operator": operator,
            "generation": generation, "run_id": run_id}


def record(store: Store, problem: Problem, cand: dict, verdict: Verdict, run_id: str | None,
           validation_version: str, purpose: str = "search") -> int:
    store.record_problem(problem)
    store.record_candidate(cand)
    return store.record_evaluation(cand["id"], problem, verdict, run_id, validation_version,
                                   tool_versions(), purpose)


def evaluate(problem: str | Problem, source: str, store: str | Store | None = None,
             config: HarnessConfig | None = None) -> dict[str, Any]:
    """Verify and measure one kernel; record it; return the verdict with its ids."""
    from swarmfactory.harness.evaluate import Harness

    problem = load_problem(problem) if isinstance(problem, str) else problem
    store = store if isinstance(store, Store) else Store(store)
    harness = Harness(config, store=store)
    try:
        cases, vversion = validation_set(problem, store)
        verdict = harness.evaluate(problem, source, cases)
    finally:
        harness.close()
    cand = candidate_record(problem, source, agent="user", operator="eval", backend=problem.backend)
    eval_id = record(store, problem, cand, verdict, None, vversion, purpose="eval")
    return {**verdict.to_dict(), "candidate_id": cand["id"], "evaluation_id": eval_id,
            "problem": problem.name, "validation_version": vversion}


def reverify_retained(problem: Problem, store: Store, config: HarnessConfig | None = None) -> dict[str, Any]:
    """Re-verify every candidate that was once correct on this hardware against today's cases.
    Failures are recorded (purpose ``reverify``); a failing champion is dethroned and the best
    candidate that still passes takes its place."""
    from swarmfactory.harness.evaluate import Harness
    from swarmfactory.swarm.succession import reverify_and_succeed

    cases, vversion = validation_set(problem, store)
    best: dict[str, float] = {}
    for ev in store.evaluations(problem=problem.name, this_hardware=True):
        if ev["problem_spec"] == problem.spec_hash() and ev["outcome"] in ("faster", "not_faster"):
            best[ev["candidate_id"]] = max(best.get(ev["candidate_id"], 0.0), ev["speedup"] or 0.0)
    harness = Harness(config, store=store)
    try:
        res = reverify_and_succeed(store, harness, problem, cases, vversion,
                                   sorted(best.items(), key=lambda r: r[1], reverse=True), check_all=True)
    finally:
        harness.close()
    return {"problem": problem.name, "validation_version": vversion, "candidates": res["rows"],
            "champion_change": res["change"]}


def run(problems: str = "all", store: str | Store | None = None, **config) -> dict[str, Any]:
    """Run the swarm (keyword arguments are ``RunConfig`` fields, e.g. ``budget=50``,
    ``time_s=600``, ``agents="default,adversary"``); returns the run's summary."""
    from swarmfactory.config import RunConfig
    from swarmfactory.swarm.coordinator import Coordinator
    from swarmfactory.swarm.summary import summarize

    store = store if isinstance(store, Store) else Store(store)
    run_id = Coordinator(RunConfig.build(problems=problems, **config), store).run()
    return summarize(store, run_id)
