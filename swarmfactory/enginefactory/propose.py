"""What the tuner measures next.

In order: the queue (designs on an earlier kernel champion, re-verified on today's: agent
``requalify``; then the design LLM's finished proposals, llm_designs.py); the best verified
design with a new kernel-factory champion plugged in (agent ``champion``); else a pool of
proposals from the kernel factory's agents on the design space (space.py: knob agents per
aspect, crossover, random restarts, the model-guided agent) and the engine's own ``invariant``
agent, the pool shared among them by the swarm's bandit (swarm/bandit.py: an agent whose designs
become champions gets more of it). A serving measurement costs tens of seconds, so the pool is
ranked by a cost model, a nearest-neighbour estimate of the fitness ratio from the designs
measured so far plus a bonus for distance from them, and only the top one is measured.
"""

from __future__ import annotations

import collections
import math
import random
from typing import Callable, NamedTuple

from swarmfactory.agents.base import Board
from swarmfactory.agents.base import Entry as BoardEntry
from swarmfactory.agents.crossover import CrossoverAgent
from swarmfactory.agents.knobs import KnobAgent, RandomRestartAgent
from swarmfactory.agents.model_guided import ModelGuidedAgent
from swarmfactory.engine.config import ConfigError
from swarmfactory.swarm.bandit import Bandit

from . import design as D
from .measure import Entry
from .space import EngineSpace, InvariantAgent

POOL = 16          # proposals ranked by the cost model for each design measured
EXPLORE = 0.15     # the cost model's bonus per unit of distance from the designs measured


class Pick(NamedTuple):
    """A design to evaluate, the agent that proposed it and the designs it came from."""

    design: D.Design
    agent: str
    parents: list[str]


def features(knobs: dict, space: dict) -> list[float]:
    """Numbers for the cost model: each knob of ``space`` (knob -> values) as a position in its
    value list, scaled to [0, 1] (``None``/calibrated counts as its own position)."""
    out = []
    for name, vals in space.items():
        val = knobs.get(name)
        i = vals.index(val) if val in vals else 0
        out.append(i / max(1, len(vals) - 1))
    return out


def predict(knobs: dict, seen: list[tuple[dict, float]], space: dict, k: int = 3) -> tuple[float, float]:
    """(estimated log fitness ratio, distance to the nearest measured design)."""
    if not seen:
        return 0.0, 1.0
    x = features(knobs, space)
    dist = sorted((math.dist(x, features(kn, space)), r) for kn, r in seen)
    near = dist[:k]
    w = [1.0 / (d + 1e-3) for d, _ in near]
    return sum(wi * math.log(max(r, 1e-6)) for wi, (_, r) in zip(w, near)) / sum(w), dist[0][0]


class Proposer:
    """The tuner's proposals (see the module docstring). ``llm``: a DesignLLM, or None."""

    def __init__(self, space: EngineSpace, rng: random.Random, hardware: dict | None, llm=None,
                 log: Callable[[str], None] = lambda msg: None):
        self.space, self.rng, self.hardware, self.llm, self.log = space, rng, hardware, llm, log
        aspects = dict.fromkeys(a for n, a in space.knob_aspects.items() if len(space.knobs[n]) > 1)  # movable
        agents = [*(KnobAgent(a) for a in aspects), CrossoverAgent(), InvariantAgent(), RandomRestartAgent(),
                  ModelGuidedAgent()]
        self.agents = {a.name: a for a in agents}
        self.bandit = Bandit(list(self.agents), rng)
        self.queue: list[Pick] = []         # designs to evaluate before any new proposal
        self.rationale: dict[str, str] = {}  # design key -> the LLM's reason for proposing it

    def reward(self, agent: str, outcome: str, champion: bool) -> None:
        """A verdict on an agent's design (the bandit's; proposals of others are not its to share)."""
        if agent in self.bandit.arms:
            self.bandit.reward(agent, outcome, champion)

    def requalify(self, entries: list[Entry], profile: Entry | None, seen: set[str]) -> None:
        """Queue the designs that ran an earlier kernel champion, on today's (the profile's first,
        then the best others): a new kernel reaches the engine only through the end-to-end checks,
        and an engine never serves a kernel it was not verified with."""
        champions = self.space.champions
        stale = [e for e in entries if e.ratio > 0 and any(champions.get(p) != cid for p, cid in e.design.pins.items())]
        stale.sort(key=lambda e: (e is not profile, -e.ratio))
        for e in stale[:3]:
            try:  # the same knobs on today's champions (a knob whose champion is gone falls back to builtin)
                design = self.space.build(e.design.knobs)
            except ConfigError:
                continue
            if self._is_new(design, seen):
                self.queue.append(Pick(design, "requalify", [e.design.key]))
        if stale:
            now = ", ".join(f"{p} {c[:12]}" for p, c in champions.items()) or "none"
            self.log(f"{len(stale)} design(s) ran kernel-factory candidates that are no longer the champions here "
                     f"(now: {now}): {len(self.queue)} queued for re-verification")

    def next(self, entries: list[Entry], default: Entry | None, champion: Entry | None, seen: set[str]) -> Pick | None:
        """The next design to evaluate, or None when nothing new is left. ``entries``: the designs
        measured (the default among them where it passed), ``seen``: design keys never to
        evaluate again."""
        measured = entries + ([default] if default is not None and default not in entries else [])
        self._ask_llm(measured, seen)
        while self.queue:
            item = self.queue.pop(0)
            if item.design.key not in seen:
                return item
        swap = self._champion_swap(entries, seen)
        if swap is not None:
            return swap
        pool = self._pool(self._board(measured, champion), seen)
        if not pool:
            return None
        values = {n: kf.values for n, kf in self.space.table.items()}
        known = [(e.design.knobs, e.ratio) for e in entries]
        if default is not None and default not in entries:  # measured, though not verified
            known.append((default.design.knobs, 1.0))

        def score(pick: Pick) -> float:
            est, dist = predict(pick.design.knobs, known, values)
            return est + EXPLORE * dist  # optimism where nothing was measured yet

        return max(pool, key=score)

    def _is_new(self, design: D.Design, seen: set[str]) -> bool:
        """Neither evaluated (this run or an earlier one here) nor already queued."""
        return design.key not in seen and all(design.key != q.design.key for q in self.queue)

    def _board(self, measured: list[Entry], champion: Entry | None) -> Board:
        """The agents' view of the search: every design measured, as a kernel agent sees a kernel."""
        def entry(e: Entry) -> BoardEntry:
            outcome = e.outcome or ("not_faster" if e.ratio else "wrong")
            return BoardEntry(e.design.key, e.design.knobs, outcome, e.ratio or None, "", 0, e.detail)

        return Board(self.space, [entry(e) for e in measured], entry(champion) if champion else None, [], self.rng,
                     hardware=self.hardware)

    def _pool(self, board: Board, seen: set[str]) -> list[Pick]:
        """Up to POOL new valid designs: each agent asked once, for its share of the pool (each
        slot to the bandit's best draw); where the shares bring nothing, the other agents in the
        bandit's order until one does."""
        shares = collections.Counter(self.bandit.order()[0] for _ in range(POOL))
        asked = [*shares.items(), *((a, POOL) for a in self.bandit.order() if a not in shares)]
        pool: dict[str, Pick] = {}
        for name, n in asked:
            if pool and name not in shares:
                break
            try:
                props = self.agents[name].propose(board, n)
            except Exception:  # noqa: BLE001 - an agent's bug costs it its turn, not the run
                props = []
            for p in props:
                if p.source.key not in seen:
                    pool.setdefault(p.source.key, Pick(p.source, name, list(p.parents)))
        return list(pool.values())

    def _ask_llm(self, measured: list[Entry], seen: set[str]) -> None:
        """Queue the design LLM's finished proposals (valid, new and batch invariant)
        and start its next call; it never waits for the model."""
        if self.llm is None:
            return
        for prop in self.llm.ready():
            try:
                design = self.space.build(prop.knobs)
            except ConfigError as e:  # a refused combination is dropped, with the reason
                self.log(f"{self.llm.name}: proposal dropped: {e}")
                continue
            if not self._is_new(design, seen):
                continue
            if not D.batch_invariant(design.knobs, self.space.base.weights):
                self.log(f"{self.llm.name}: proposal dropped: not batch invariant ({design.describe()})")
                continue
            self.rationale[design.key] = prop.rationale
            self.queue.append(Pick(design, self.llm.name, []))
        rows = [{"knobs": e.design.knobs, "verdict": e.outcome or ("not_faster" if e.ratio else "wrong"),
                 "ratio": e.ratio, "detail": e.detail} for e in measured]
        table = self.space.table
        self.llm.submit({n: kf.values for n, kf in table.items()}, rows, self.space.fixed, 3,
                        meanings={n: kf.meaning for n, kf in table.items()})

    def _champion_swap(self, entries: list[Entry], seen: set[str]) -> Pick | None:
        """The best verified design with a kernel-factory champion plugged in, for each champion
        knob no design of this problem has tried yet: what a new kernel does for the engine is
        measured early instead of waiting for a random draw."""
        best = max((e for e in entries if e.ratio > 0), key=lambda e: e.ratio, default=None)
        if best is None:
            return None
        for knob in D.CHAMPION_KNOBS:
            if self.space.fixed.get(knob) or any(e.design.knobs.get(knob) == "champion" for e in entries):
                continue
            knobs = {**best.design.knobs, knob: "champion"}
            knobs = D.make_invariant(knobs, self.rng, self.space.base.weights)
            try:
                design = self.space.build(knobs)
            except ConfigError:  # a combination the engine refuses
                continue
            if design.knobs.get(knob) == "champion" and design.key not in seen:
                return Pick(design, "champion", [best.design.key])
        return None
