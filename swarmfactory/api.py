"""Public Python API, mirroring the CLI: ``evaluate`` a kernel file; ``run`` the swarm."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from swarmfactory.agents.base import candidate_record
from swarmfactory.evidence.rows import CandidateRow
from swarmfactory.evidence.store import Store, StoreWriteError
from swarmfactory.outcome import MEASURED
from swarmfactory.problems import Problem, load_problem
from swarmfactory.swarm.succession import contend
from swarmfactory.validation import drawn_evidence, validation_set

if TYPE_CHECKING:  # the harness loads only where a kernel is built and measured
    from swarmfactory.config import RunConfig
    from swarmfactory.harness.evaluate import HarnessConfig
    from swarmfactory.swarm.coordinator import Coordinator


def evaluate(problem: str | Problem, source: str, store: str | Store | None = None,
             config: HarnessConfig | None = None, draw: int | None = None,
             backend: str | None = None) -> dict[str, Any]:
    """Verify and measure one kernel; record it; it competes for the title (``champion_change``
    says what it did to it); return the verdict with its ids. ``draw``: also verify that draw of
    the full-size model cases (``Problem.model_cases``; the evidence says which); without it, the
    validation set alone (its fixed sample of model shapes included). ``backend``: what
    ``source`` is written in, one of ``problem.backends`` (default ``problem.backend``; a GPU
    problem takes triton, cuda and ptx). ValueError, with nothing recorded, for an empty source
    or a backend the problem does not take. ``StoreWriteError`` when the store did not take the
    verdict (kept in its journal; the verdict as the exception's ``result``). A store given by
    path or URL is closed again before this returns."""
    problem = load_problem(problem) if isinstance(problem, str) else problem
    backend = backend or problem.backend
    if backend not in problem.backends:
        raise ValueError(f"{problem.name} takes {', '.join(problem.backends)} sources, not {backend}")
    if not source.strip():
        raise ValueError("empty source")
    with _opened(store) as store:
        return _evaluate(problem, source, store, config, draw, backend)


def _evaluate(problem: Problem, source: str, store: Store, config: HarnessConfig | None, draw: int | None,
              backend: str) -> dict[str, Any]:
    """``evaluate`` on an open store."""
    from swarmfactory.harness.evaluate import Harness

    harness = Harness(config, store=store)
    try:
        cases, vversion = validation_set(problem, store, draw)
        verdict = harness.evaluate(problem, source, cases, backend=backend)
        if draw is not None:
            verdict.evidence["model_draw"] = drawn_evidence(draw, cases)
        cand = candidate_record(problem, source, agent="user", operator="eval", backend=backend)
        eval_id = None
        try:
            eval_id = store.record_verdict(problem, cand, verdict, None, vversion, purpose="eval")
            # it competes for the title like any run's verdict (a demoted champion's successors are
            # re-measured on the validation set alone)
            base = cases if draw is None else validation_set(problem, store)[0]
            decision = contend(store, problem, eval_id, None, _remeasurer(harness, problem, store, base, vversion))
        except StoreWriteError as exc:  # kept in the store's journal; the caller may still show it
            exc.result = {**verdict.to_dict(), "candidate_id": cand["id"], "evaluation_id": eval_id,
                          "problem": problem.name, "validation_version": vversion, "champion_change": None}
            raise
    finally:
        harness.close()
    return {**verdict.to_dict(), "candidate_id": cand["id"], "evaluation_id": eval_id,
            "problem": problem.name, "validation_version": vversion, "champion_change": decision.change}


def _remeasurer(harness, problem: Problem, store: Store, cases, vversion: str):
    """Succession's fresh re-measure (``swarm/succession.py``) on this machine's harness."""
    def remeasure(cand: CandidateRow) -> int:
        verdict = harness.evaluate(problem, cand.source, cases, backend=problem.backend_of(cand))
        return store.record_verdict(problem, cand, verdict, None, vversion, "remeasure")
    return remeasure


def reverify_retained(problem: Problem, store: Store, config: HarnessConfig | None = None) -> dict[str, Any]:
    """Re-verify every candidate that was once correct on this hardware against today's cases.
    Failures are recorded (purpose ``reverify``); a failing champion is dethroned (or a title
    found vacant after a demotion) and the best retained candidates are re-measured afresh, the
    first faster one taking its place."""
    from swarmfactory.harness.evaluate import Harness
    from swarmfactory.swarm.succession import rank_by_best, reverify_and_succeed

    cases, vversion = validation_set(problem, store)
    ranked = rank_by_best((ev.candidate_id, ev.speedup)
                          for ev in store.evaluations(problem=problem.name, this_hardware=True)
                          if ev.problem_spec == problem.spec_hash() and ev.outcome in MEASURED)
    harness = Harness(config, store=store)
    try:
        res = reverify_and_succeed(store, harness, problem, cases, vversion, ranked, check_all=True,
                                   remeasure=_remeasurer(harness, problem, store, cases, vversion), fill_vacant=True)
    finally:
        harness.close()
    return {"problem": problem.name, "validation_version": vversion, "candidates": res["rows"],
            "champion_change": res["change"]}


def prepare_run(problems: str = "all", store: str | Store | None = None, *, config: RunConfig | None = None,
                resume: str | None = None, progress=None, **fields) -> Coordinator:
    """A run ready to start: its configuration checked (``config``, or ``RunConfig`` fields as
    keywords), agents built, LLM endpoints checked; ``resume`` continues a run of the store with
    the configuration and budget it had left. ``progress`` receives start/update/stop calls
    (``ui.RichProgress`` draws them). ``RunError`` / ``ConfigError`` say what is wrong before any
    work; ``.run()`` starts it and returns the run id (the id is known from the first verdict
    on, as ``.run_id``, for a caller that handles Ctrl-C)."""
    from swarmfactory.config import RunConfig
    from swarmfactory.swarm.coordinator import Coordinator

    store = store if isinstance(store, Store) else Store(store)
    if config is None:
        config = RunConfig.build(problems=problems, **fields)
    return Coordinator(config, store, resume=resume, progress=progress)


def run(problems: str = "all", store: str | Store | None = None, *, resume: str | None = None,
        progress=None, **config) -> dict[str, Any]:
    """Run the swarm (keyword arguments are ``RunConfig`` fields, e.g. ``budget=50``,
    ``time_s=600``, ``agents="default,adversary"``; ``resume=RUN_ID`` continues a run); returns
    the run's summary (``swarm.summary.summarize``)."""
    from swarmfactory.swarm.summary import summarize

    with _opened(store) as store:
        coordinator = prepare_run(problems, store, resume=resume, progress=progress, **config)
        return summarize(store, coordinator.run())


@contextlib.contextmanager
def _opened(store: str | Store | None):
    """``store`` as a ``Store``: the caller's as it is, or one opened from a path or URL (the
    default store for None) and closed at the end of the block."""
    if isinstance(store, Store):
        yield store
        return
    with Store(store) as opened:
        yield opened
