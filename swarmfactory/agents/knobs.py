"""Knob agents: each mutates elites along one aspect of a template's design space.

Aspects are declared per knob by the problem (``knob_aspects``): blocking, vectorisation,
threading, unrolling, algorithm. Also here: the seed agent (the template's defaults) and the
random-restart agent (uniform samples of the valid space, for diversity).
"""

from __future__ import annotations

from swarmfactory.agents.base import Agent, Board, Proposal, knob_proposal, tournament

ASPECTS = ("blocking", "vectorisation", "threading", "unrolling", "algorithm")
MAX_TRIES = 40


class SeedAgent(Agent):
    """Proposes the template's default configuration once: the first rung of every problem."""

    name = "seed"

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        p = board.problem
        if p.template is None:
            return []
        prop = knob_proposal(board, dict(p.knob_defaults), self.name, "defaults", [])
        return [prop] if prop else []


class KnobAgent(Agent):
    """Mutates one or two knobs of its aspect in an elite (tournament-selected)."""

    def __init__(self, aspect: str):
        if aspect not in ASPECTS:
            raise ValueError(f"unknown aspect {aspect!r}; known: {', '.join(ASPECTS)}")
        self.aspect = aspect
        self.name = f"knob-{aspect}"

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        p, rng = board.problem, board.rng
        mine = [k for k, a in p.knob_aspects.items() if a == self.aspect and len(p.knobs[k]) > 1]
        parent = tournament(board)
        if not mine or parent is None or parent.knobs is None:
            return []
        out: list[Proposal] = []
        for _ in range(MAX_TRIES):
            if len(out) >= n:
                break
            knobs = dict(parent.knobs)
            for k in rng.sample(mine, min(len(mine), rng.choice((1, 1, 2)))):
                knobs[k] = rng.choice([v for v in p.knobs[k] if v != knobs.get(k)])
            prop = knob_proposal(board, knobs, self.name, f"mutate-{self.aspect}", [parent])
            if prop and all(prop.knobs != o.knobs for o in out):
                out.append(prop)
        return out


class RandomRestartAgent(Agent):
    """Uniform samples of the valid design space, ignoring the elites."""

    name = "random-restart"

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        p, rng = board.problem, board.rng
        if not p.knobs:
            return []
        out: list[Proposal] = []
        for _ in range(MAX_TRIES):
            if len(out) >= n:
                break
            knobs = {k: rng.choice(list(v)) for k, v in p.knobs.items()}
            prop = knob_proposal(board, knobs, self.name, "sample", [])
            if prop:
                out.append(prop)
        return out
