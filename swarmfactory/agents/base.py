"""The agent contract: read a view of the board, return proposals.

``propose`` must be cheap (the coordinator calls it between evaluations), must not mutate the
board, and may return fewer proposals than asked (an empty list means "nothing to add now").
Agents are stateless between calls unless documented; anything worth keeping goes in the store.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from swarmfactory.evidence.store import content_hash
from swarmfactory.outcome import MEASURED
from swarmfactory.problems.space import SearchSpace
from swarmfactory.problems.spec import Problem, knob_key  # noqa: F401 - knob_key re-exported for the agents


def candidate_record(problem: Problem, source: str, agent: str, operator: str, *, backend: str = "c",
                     knobs: dict | None = None, parents: list[str] | None = None, generation: int = 0,
                     run_id: str | None = None, flags: list[str] | None = None) -> dict[str, Any]:
    """A candidate as the evidence store keeps it; its id is the content hash of what is built."""
    return {"id": content_hash(source, backend, flags or []), "problem": problem.name,
            "backend": backend, "source": source, "flags": flags or [], "knobs": knobs,
            "parents": parents or [], "agent": agent, "operator": operator,
            "generation": generation, "run_id": run_id}


@dataclass
class Proposal:
    """A setting an agent proposes: ``source`` is what the space renders it to (``SearchSpace.render``:
    a kernel's source text, which ``candidate_id`` and ``record`` hash; an engine design)."""

    source: Any
    agent: str
    operator: str
    knobs: dict[str, Any] | None = None
    parents: list[str] = field(default_factory=list)
    generation: int = 0
    backend: str = "c"

    @property
    def candidate_id(self) -> str:
        return content_hash(self.source, self.backend)

    def record(self, problem: Problem, run_id: str | None) -> dict[str, Any]:
        """This proposal as a candidate record (``candidate_record``)."""
        return candidate_record(problem, self.source, self.agent, self.operator, backend=self.backend,
                                knobs=self.knobs, parents=self.parents, generation=self.generation,
                                run_id=run_id)


@dataclass
class Entry:
    """One evaluated candidate as agents see it."""

    candidate_id: str
    knobs: dict[str, Any] | None
    outcome: str
    speedup: float | None
    agent: str
    generation: int
    detail: str = ""
    weight: float = 1.0   # its measurement's quality (evidence/quality.py): 0 for one taken on a busy machine

    @property
    def correct(self) -> bool:
        """Measured, ``faster`` or ``not_faster``: what ranks candidates by speed."""
        return self.outcome in MEASURED


PRIOR_FLOOR = 0.2  # share of every prior-shaped choice that stays uniform: a wrong lesson rules nothing out


@dataclass
class Board:
    """What an agent may read: the problem, what has been tried, the champion, lessons.

    ``lessons`` are one-line claims (most relevant first) for prompts; ``priors`` their effect on
    knob values (knob -> value -> relative weight, 1 neutral; ``knowledge.priors``); ``transfer``
    the evidence of other problems and machines as cost-model rows (``knowledge.costmodel.Row``). Without
    priors ``pick`` and ``prefer`` draw exactly as a uniform choice would. ``problem`` is the space
    searched (problems/space.py): a kernel ``Problem`` (the seed and LLM agents need one), or the
    engine factory's designs (the knob, crossover, random-restart and model-guided agents need no more
    than the protocol)."""

    problem: SearchSpace
    entries: list[Entry]
    champion: Entry | None
    lessons: list[str]
    rng: random.Random
    budget_left: int | None = None
    priors: dict[str, dict[Any, float]] = field(default_factory=dict)
    transfer: list = field(default_factory=list)   # cost-model rows from other problems and machines
    hardware: dict | None = None                   # this machine's fingerprint (the store's)
    hypotheses: list[tuple[str, Any, Any]] = field(default_factory=list)  # another machine's lessons: (knob, better, worse)

    def elites(self, k: int = 8) -> list[Entry]:
        good = [e for e in self.entries if e.correct and e.speedup is not None]
        return sorted(good, key=lambda e: e.speedup, reverse=True)[:k]

    def tried(self) -> set[str]:
        return {knob_key(e.knobs) for e in self.entries if e.knobs is not None}

    def weights(self, knob: str, values: list) -> list[float] | None:
        """Choice probabilities of ``values`` for ``knob`` under the priors (mixed with a uniform
        share, PRIOR_FLOOR); None when no lesson speaks about them."""
        w = self.priors.get(knob)
        if not w or len(values) < 2 or not any(v in w for v in values):
            return None
        raw = [w.get(v, 1.0) for v in values]
        total = sum(raw)
        return [(1 - PRIOR_FLOOR) * r / total + PRIOR_FLOOR / len(values) for r in raw]

    def pick(self, knob: str, values) -> Any:
        """One of ``values`` for ``knob``: prior-weighted where lessons speak, else uniform."""
        values = list(values)
        probs = self.weights(knob, values)
        if probs is None:
            return self.rng.choice(values)
        x, acc = self.rng.random(), 0.0
        for v, p in zip(values, probs):
            acc += p
            if x < acc:
                return v
        return values[-1]

    def prefer(self, knob: str, a: Any, b: Any) -> float:
        """The probability of taking ``a`` rather than ``b`` for ``knob`` (1/2 without priors)."""
        probs = self.weights(knob, [a, b]) if a != b else None
        return 0.5 if probs is None else probs[0]


class Agent(ABC):
    """A proposer of kernels. The coordinator calls ``bind`` once before the first proposal,
    ``propose`` between evaluations, ``busy`` when nobody had anything new (a busy agent keeps the
    run alive while it thinks) and ``close`` once at the end. Only ``propose`` is required; the
    others are no-ops unless an agent has work in the background (the LLM agent).

    ``stopped``: None while the agent works; once it has stopped for good (an LLM agent whose
    endpoint keeps failing), one line saying which agent and why. The run goes on without it, and
    ends (exit 2) when every agent has stopped."""

    name: str = "agent"
    stopped: str | None = None
    lead_rank: int = 1   # among agents that lead on a board, the lower rank is asked first
    learns: bool = False  # the coordinator runs the analyst after each verdict of this agent's candidates

    @abstractmethod
    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        """Up to ``n`` proposals for ``board.problem``."""

    def leads(self, board: Board) -> bool:
        """True when this agent should be asked before the bandit's order on this board (it knows
        something the others do not yet: the model-guided agent with transferred evidence on a
        problem that has little of its own; the seed agent while the template's defaults are
        untried). Leaders are asked in ``lead_rank`` order. False by default."""
        return False

    def bind(self, store, run_id: str) -> None:
        """The run's evidence store and id, before the first ``propose`` (no-op by default)."""

    def busy(self) -> bool:
        """True while the agent has proposals in preparation that a later ``propose`` returns."""
        return False

    def close(self) -> None:
        """The run is over: stop background work (no-op by default)."""


def knob_proposal(board: Board, knobs: dict, agent: str, operator: str, parents: list[Entry]) -> Proposal | None:
    """Render ``knobs`` if valid and untried; None otherwise."""
    problem = board.problem
    if not problem.valid_knobs(knobs) or knob_key(knobs) in board.tried():
        return None
    gen = 1 + max((p.generation for p in parents), default=-1)
    return Proposal(problem.render(knobs), agent, operator, dict(knobs),
                    [p.candidate_id for p in parents], gen)


def tournament(board: Board, k: int = 3) -> Entry | None:
    elites = board.elites()
    if not elites:
        return None
    pool = board.rng.sample(elites, min(k, len(elites)))
    return max(pool, key=lambda e: e.speedup)
