"""What a run produced, read back from the store: the result table, the agent scoreboard.

Everything here is derived from recorded evidence, so ``show`` and ``report`` work on any run,
finished, interrupted or killed, on any machine that holds the store.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from swarmfactory.evidence.quality import busy, contention, describe
from swarmfactory.evidence.rows import CandidateRow, Champion, Evaluation, Run
from swarmfactory.evidence.store import Store
from swarmfactory.outcome import CORRECT, Outcome
from swarmfactory.problems import ProblemError, load_problem


def summarize(store: Store, run_id: str | None = None) -> dict:
    """Run ``run_id`` (default: the latest) as ``show --json`` prints it: per problem its
    verdicts, champion and curve, the agent scoreboard, the LLM endpoints, warnings."""
    run = store.run(run_id)
    if run is None:
        from swarmfactory.evidence.store import StoreError

        raise StoreError(f"no run {run_id!r} in {store.shown}" if run_id else f"no runs in {store.shown} yet")
    run_id = run.id
    store = store.on_hardware({**store.hardware, "id": run.hardware_id})  # champions of the run's hardware
    evs = store.evaluations(run_id=run_id)
    cands = {e.candidate_id: store.candidate(e.candidate_id) for e in evs}
    engine_run = run.config.get("kind") == "engine-tune"
    problems = [_problem_summary(store, run_id, problem, evs, cands, engine_run)
                for problem in _problems(run, evs, engine_run)]
    board = _scoreboard(store, run_id, problems, evs, cands)
    llm_rows, stopped = _llm_rows(store, run_id, board)
    return {"run_id": run_id, "status": run.status, "config": run.config, "llm": llm_rows,
            "hardware_id": run.hardware_id, "created_at": str(run.created_at),
            "finished_at": str(run.finished_at) if run.finished_at else None,
            "evaluations": sum(p["evaluations"] for p in problems), "problems": problems,
            "agents": board, "warnings": warnings(problems) + [f"warning: {why}" for why in stopped.values()]}


def _problems(run: Run, evs: list[Evaluation], engine_run: bool) -> list:
    """The problems of the run, as far as they load here: its configured ones; an engine run's
    (one per model) from its evaluations, with their spec."""
    if engine_run:
        return [_Named(name, next(e.problem_spec for e in evs if e.problem == name))
                for name in sorted({e.problem for e in evs})]
    names = run.config.get("problems", [])
    if names == ["all"]:
        from swarmfactory.problems import list_problems

        names = list_problems()
    out = []
    for name in names:
        try:
            out.append(load_problem(name))
        except ProblemError:
            continue
    return out


def _problem_summary(store: Store, run_id: str, problem, evs: list[Evaluation],
                     cands: dict[str, CandidateRow | None], engine_run: bool) -> dict:
    """One problem of the run: its search's verdicts and best curve, the champion it ended with
    and the one it started from, its engine designs, how busy its measurements were."""
    mine = [e for e in evs if e.problem == problem.name]
    search = [e for e in mine if e.purpose == "search"]
    outcomes = Counter(e.outcome.value for e in search)
    history = [r for r in store.champion_history(problem.name) if r.problem_spec == problem.spec_hash()]
    in_run = [r for r in history if r.run_id == run_id]
    start = [r for r in history if r.run_id != run_id and (not in_run or r.id < in_run[0].id)]
    final = in_run[-1] if in_run else (start[-1] if start else None)
    started = None
    if start and start[-1].candidate_id:
        started = {"candidate_id": start[-1].candidate_id, "speedup": start[-1].speedup}
    best_curve, best = [], None
    for i, e in enumerate(search, 1):
        if e.outcome == Outcome.FASTER and (best is None or e.speedup > best):
            best = e.speedup
        best_curve.append([i, best])
    return {
        "designs": _designs(mine, cands) if engine_run else [],
        "problem": problem.name, "evaluations": len(search), "outcomes": dict(outcomes),
        # verified and not measured (e.g. a GPU problem on a machine without a GPU) is no rejection
        "rejected": {k: v for k, v in outcomes.items() if k not in CORRECT},
        "champion": _champion(store, problem, final) if final and final.candidate_id else None,
        "started_from": started, "best_curve": best_curve,
        # how many of the run's evaluations of it were measured on a busy machine, or could not be
        "contention": {"busy": sum(busy(e.evidence) for e in mine),
                       "inconclusive": sum(e.outcome == Outcome.INCONCLUSIVE for e in mine),
                       "evaluations": len(mine)},
        "seconds": round(sum(e.seconds for e in mine), 1)}


def _champion(store: Store, problem, final: Champion) -> dict:
    """The champion of champions row ``final``: its candidate, the figures of the evaluation
    that crowned (or confirmed) it, when it was last confirmed."""
    ev = store.evaluation(final.evaluation_id) if final.evaluation_id else None
    cand = store.candidate(final.candidate_id)
    return {"candidate_id": cand.id, "agent": cand.agent, "operator": cand.operator,
            "knobs": cand.knobs, "generation": cand.generation,
            "speedup": ev.speedup if ev else final.speedup,
            "ci_low": ev and ev.ci_low, "ci_high": ev and ev.ci_high,
            "vs_reference": ev and ev.vs_reference,
            "roofline_fraction": ev and ev.roofline_fraction,
            "baseline": ev and ev.baseline, "shapes": ev.shapes if ev else [],
            "evaluation_id": final.evaluation_id, "reason": final.reason,
            **_confirmed(store, problem, final)}


def _designs(mine: list[Evaluation], cands: dict[str, CandidateRow | None]) -> list[dict]:
    """An engine run's evaluations of one problem as designs: verdict, fitness, description."""
    designs = []
    for e in mine:
        c = cands.get(e.candidate_id)
        ev = e.evidence or {}
        designs.append({"candidate_id": e.candidate_id, "purpose": e.purpose, "agent": c.agent if c else None,
                        "outcome": e.outcome.value, "speedup": e.speedup, "fitness": ev.get("fitness"),
                        "design": ev.get("design", ""), "detail": e.detail, "seconds": round(e.seconds, 1)})
    return designs


def _scoreboard(store: Store, run_id: str, problems: list[dict], evs: list[Evaluation],
                cands: dict[str, CandidateRow | None]) -> list[dict]:
    """Per agent: its search proposals, their verdicts, how many were correct, champions it made
    in the run (a confirmation is none)."""
    agents: dict[str, Counter] = defaultdict(Counter)
    champ_agents = Counter()
    for p in problems:
        for r in store.champion_history(p["problem"]):
            improved = r.candidate_id and not r.reason.startswith("re-measured")  # confirmations
            if r.run_id == run_id and improved:
                champ_agents[store.candidate(r.candidate_id).agent] += 1
    for e in evs:
        if e.purpose != "search":
            continue
        c = cands.get(e.candidate_id)
        a = c.agent if c else "?"
        agents[a]["proposals"] += 1
        agents[a][e.outcome.value] += 1
    return [{"agent": a, **dict(c), "champions": champ_agents.get(a, 0),
             "correct": sum(c[o] for o in CORRECT)} for a, c in sorted(agents.items())]


def _llm_rows(store: Store, run_id: str, board: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """Per LLM agent and model: calls by status, tokens, cost, time and what its candidates
    did; and why each agent that stopped for good stopped (a row of its own, not a call)."""
    llm: dict[str, Counter] = defaultdict(Counter)
    stopped: dict[str, str] = {}
    for call in store.llm_calls(run_id):
        if call.status == "stopped":
            stopped[call.agent] = call.error or "stopped"
            continue
        row = llm[f"{call.agent}|{call.model}"]
        row["calls"] += 1
        row[call.status] += 1
        row["prompt_tokens"] += call.prompt_tokens
        row["completion_tokens"] += call.completion_tokens
        row["cost_usd"] += call.cost_usd
        row["seconds"] += call.seconds
    rows = []
    for key, c in sorted(llm.items()):
        agent, model = key.split("|", 1)
        mine = next((a for a in board if a["agent"] == agent), {})
        rows.append({"agent": agent, "model": model, **dict(c), "cost_usd": round(c["cost_usd"], 6),
                     "seconds": round(c["seconds"], 1), "candidates": mine.get("proposals", 0),
                     "correct": mine.get("correct", 0), "faster": mine.get("faster", 0),
                     "champions": mine.get("champions", 0), "stopped": stopped.get(agent)})
    return rows, stopped


def _confirmed(store, problem, row: Champion) -> dict:
    """When and under what contention the champion of ``row`` was last confirmed (its latest
    ``faster`` measurement holding the title) and, where a later measurement of it was
    inconclusive or busy, that it is not confirmed since."""
    from swarmfactory.swarm.succession import confirmation

    if isinstance(problem, _Named):
        return {"confirmed": None, "unconfirmed": None}
    ev = confirmation(store, problem, row.candidate_id)
    confirmed = None
    if ev is not None:
        c = contention(ev.evidence)
        confirmed = {"evaluation_id": ev.id, "at": str(ev.created_at), "purpose": ev.purpose,
                     "run_id": ev.run_id, "speedup": ev.speedup,
                     "suffered": c.get("suffered") if c else None, "busy": busy(ev.evidence),
                     "contention": describe(ev.evidence)}
    unconfirmed = None
    if row.reason.startswith("re-measured:") and "not confirmed" in row.reason:
        unconfirmed = row.reason.removeprefix("re-measured: ")
    return {"confirmed": confirmed, "unconfirmed": unconfirmed}


def confirmation_text(champion: dict, fmt=lambda x: f"{x:.2f}") -> str:
    """When and under what contention ``champion`` (a summary's champion, ``_confirmed``) was last
    confirmed, and what a later re-measure said: the line ``show``, ``report`` print."""
    conf = champion.get("confirmed")
    if conf is None:
        text = "not confirmed by a measurement on this hardware"
    else:
        by = "its re-measure" if conf["purpose"] == "remeasure" else f"{conf['purpose']} evaluation"
        text = (f"last confirmed {str(conf['at'])[:19]} UTC by {by} {conf['evaluation_id']} at "
                f"{fmt(conf['speedup'])}x ({conf['contention']})")
    if champion.get("unconfirmed"):
        text += f"; since then: {champion['unconfirmed']}"
    return text


def warnings(problems: list[dict]) -> list[str]:
    """One line per problem whose figures were measured on a busy machine: evaluations of the run
    measured busy or inconclusive, or a champion last confirmed on a busy machine."""
    out = []
    for p in problems:
        n = p.get("contention") or {}
        parts = []
        if n.get("busy"):
            parts.append(f"{n['busy']} of {n['evaluations']} evaluations measured on a busy machine")
        if n.get("inconclusive"):
            parts.append(f"{n['inconclusive']} inconclusive (too busy to time)")
        c = p.get("champion") or {}
        if (c.get("confirmed") or {}).get("busy"):
            parts.append(f"its champion was last confirmed on a busy machine ({c['confirmed']['contention']})")
        if parts:
            out.append(f"warning: {p['problem']}: " + "; ".join(parts) + ": these figures are less certain")
    return out


class _Named:
    """An engine problem as the summary needs it: a name and a spec hash."""

    def __init__(self, name: str, spec: str):
        self.name, self._spec = name, spec

    def spec_hash(self) -> str:
        return self._spec
