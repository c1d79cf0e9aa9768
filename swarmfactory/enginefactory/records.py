"""What the tuner reads from and writes to the evidence store (all of it, in one place).

Designs go in the same store as the kernel factory's candidates, under the problem
``engine:<model file stem>`` (space.py): a design is a candidate whose source is its config's
YAML and whose id is its design key (design.py ``design_key``), each verdict an evaluation, the
champion the profile ``engine serve`` picks (profiles.py).

Design keys hash only a config's non-default fields. Designs recorded before that (their keys
hashed every field) keep their recorded ids; ``prior`` recognises them by their recorded YAML,
so a tune never evaluates again a design an earlier one recorded, and the profile it left is
still what a newcomer must beat.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from swarmfactory import champions
from swarmfactory.agents.base import candidate_record
from swarmfactory.outcome import MEASURED, Verdict

from . import design as D
from .measure import Entry

VALIDATION_VERSION = "engine-verify-v1"


def resumable(store, run_id: str) -> dict:
    """The config of engine tune run ``run_id``, to resume it; ValueError where it cannot be."""
    row = store.run(run_id)
    if row is None:
        raise ValueError(f"no run {run_id!r} in {store.shown}")
    if row.config.get("kind") != "engine-tune":
        raise ValueError(f"run {run_id} is a kernel run; resume it with swarmfactory run --resume")
    if row.status == "finished":
        raise ValueError(f"run {run_id} already finished; start a new one (its designs are not re-measured)")
    return row.config


def kernel_champions(store, model: str | None = None) -> dict[str, str]:
    """Problem -> this hardware's kernel-factory champion that may run in the engine (the corridor's
    rule, ``champions.current``), for each problem a design's ``champion`` knob plugs in: the
    block-type matmuls of ``model``'s weights (and the problems derived from it, where they are
    registered) and the native decoder's matvec."""
    return {p: c for p in D.kernel_problems(model) if (c := champions.current(store, p))}


def open_run(store, problem, run_id: str | None, config: dict) -> str:
    """A new run (``run_id`` None) or the resumed one, running, with its problem recorded."""
    if run_id is None:
        run_id = store.create_run(config)
    else:
        store.set_run_status(run_id, "running")
    store.record_problem(problem)
    return run_id


def close_run(store, run_id: str, status: str) -> None:
    store.set_run_status(run_id, status)


def spent(store, problem, run_id: str) -> tuple[float, int, int]:
    """What the run already did (a resumed run keeps the budget it had left): seconds, designs
    evaluated in search, and of those inconclusive."""
    seconds = evaluated = inconclusive = 0
    for ev in store.evaluations(problem=problem.name, run_id=run_id):
        seconds += ev.seconds or 0.0
        evaluated += ev.purpose == "search"
        inconclusive += ev.purpose == "search" and ev.outcome == "inconclusive"
    return seconds, evaluated, inconclusive


def record(store, problem, run_id: str, design: D.Design, verdict: Verdict, agent: str, operator: str,
           parents: list[str], rationale: str | None = None, purpose: str = "search") -> int:
    """Record ``design`` and its verdict; the evaluation's id."""
    cand = candidate_record(problem, design.config.to_yaml(), agent, operator, backend="engine",
                            knobs=design.knobs, parents=parents, run_id=run_id)
    cand["id"] = design.key
    if rationale:
        verdict.evidence.setdefault("rationale", rationale)
    verdict.evidence.setdefault("model_sha256", problem.model_sha256)
    verdict.evidence.setdefault("design", design.describe())
    return store.record_verdict(problem, cand, verdict, run_id, VALIDATION_VERSION, purpose)


def crown(store, problem, entry: Entry, run_id: str, reason: str) -> None:
    """``entry`` is the champion: this machine's profile for the model."""
    store.set_champion(problem, entry.design.key, entry.evaluation_id, entry.ratio, run_id, reason)


@dataclass
class Prior:
    """What the store holds for this problem on this hardware: ``seen`` (design keys never to
    evaluate again: recorded ids and the keys their configs have now), the searched designs as
    entries, and the profile so far (None: none, or none measured)."""

    seen: set[str] = field(default_factory=set)
    entries: list[Entry] = field(default_factory=list)
    champion: Entry | None = None


def prior(store, problem, run_id: str | None) -> Prior:
    """Designs this store already evaluated for ``problem`` (this spec) on this hardware. An
    ``inconclusive`` one (measured on a busy machine: no verdict on its speed) is measured again
    by a later run, not by its own run resumed."""
    out, recorded = Prior(), {}
    defaults = {n: kf.default for n, kf in D.knob_table(type(problem.base)).items()}
    for ev in store.evaluations(problem=problem.name, this_hardware=True):
        if ev.problem_spec != problem.spec_hash():
            continue
        cand = store.candidate(ev.candidate_id)
        if not cand or not cand.knobs:
            continue
        try:  # the design as it was evaluated (a pinned kernel champion included)
            config = type(problem.base).from_dict(yaml.safe_load(cand.source))
        except Exception:  # noqa: BLE001 - a config this engine no longer reads: its recorded id still counts
            config = None
        keys = {ev.candidate_id} | ({D.design_key(config)} if config is not None else set())
        if ev.outcome == "inconclusive":
            if ev.run_id == run_id:
                out.seen |= keys
            continue
        out.seen |= keys
        if ev.purpose != "search" or config is None:
            continue
        ratio = ev.speedup if ev.outcome in MEASURED and ev.speedup else 0.0
        evidence = ev.evidence or {}
        entry = Entry(D.Design({**defaults, **cand.knobs}, config), ratio, evidence.get("fitness", 0.0), ev.id,
                      evidence.get("screen_fitness"), outcome=ev.outcome.value, detail=ev.detail or "")
        out.entries.append(entry)
        if entry.fitness > 0:
            recorded.setdefault(ev.candidate_id, entry)
    champ = store.champion(problem)  # the profile so far: what a newcomer must beat
    out.champion = recorded.get(champ.candidate_id) if champ else None
    return out


def replay(store, problem, run_id: str | None) -> list[tuple[str, str, bool]]:
    """(agent, outcome, made the champion) of each search evaluation of ``run_id``, in order: the
    history the agents' bandit replays when the run resumes (a design the run's time cut short
    said nothing of its agent)."""
    if run_id is None:
        return []
    champs = {r.candidate_id for r in store.champion_history(problem.name) if r.run_id == run_id}
    out = []
    for ev in store.evaluations(problem=problem.name, run_id=run_id):
        cand = store.candidate(ev.candidate_id)
        if ev.purpose == "search" and cand and not (ev.evidence or {}).get("out_of_time"):
            out.append((cand.agent, ev.outcome.value, ev.candidate_id in champs))
    return out
