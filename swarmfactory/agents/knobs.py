"""Knob agents: each mutates elites along one aspect of a search space (problems/space.py: a kernel
template's knobs, or the engine factory's designs).

Aspects are declared per knob by the space (``knob_aspects``): blocking, vectorisation,
threading, unrolling, algorithm. New values are drawn from the board's priors (shaped by the
lessons that apply to the problem; uniform where none do), and under priors the knobs whose
parent value a lesson disfavours are moved more often. Also here: the seed agent (the
template's defaults) and the random-restart agent (uniform samples of the valid space, for
diversity: it ignores lessons, so a wrong lesson cannot narrow the search).
"""

from __future__ import annotations

from swarmfactory.agents.base import Agent, Board, Proposal, knob_key, knob_proposal, tournament

ASPECTS = ("blocking", "vectorisation", "threading", "unrolling", "algorithm")
MAX_TRIES = 40


class SeedAgent(Agent):
    """Proposes the template's default configuration once: the first rung of every problem.

    It leads, before any other agent, while the defaults are untried, warm or cold: one
    evaluation buys what a person would try first and a yardstick for everything after it.
    Another machine's evidence (the model-guided agent) can point far from the defaults, and on a
    machine where the defaults are already near the best, following it first costs many
    evaluations; trying the defaults first bounds that cost at one evaluation."""

    name = "seed"
    lead_rank = 0   # before every other leader

    def leads(self, board: Board) -> bool:
        p = board.problem
        if p.template is None or not p.knobs:
            return False
        defaults = dict(p.knob_defaults)
        return p.valid_knobs(defaults) and knob_key(defaults) not in board.tried()

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
        shaped = any(board.weights(k, list(p.knobs[k])) for k in mine)
        for _ in range(MAX_TRIES):
            if len(out) >= n:
                break
            knobs = dict(parent.knobs)
            count = min(len(mine), rng.choice((1, 1, 2)))
            chosen = self._knobs_to_move(board, mine, knobs, count) if shaped else rng.sample(mine, count)
            for k in chosen:
                knobs[k] = board.pick(k, [v for v in p.knobs[k] if v != knobs.get(k)])
            prop = knob_proposal(board, knobs, self.name, f"mutate-{self.aspect}", [parent])
            if prop and all(prop.knobs != o.knobs for o in out):
                out.append(prop)
        return out

    @staticmethod
    def _knobs_to_move(board: Board, mine: list[str], knobs: dict, count: int) -> list[str]:
        """Under priors, a knob is moved in proportion to how much better its best alternative is
        thought to be than the parent's value (clipped to [1/4, 4], 1 where no lesson speaks)."""
        gain = {}
        for k in mine:
            w = board.priors.get(k, {})
            here = w.get(knobs.get(k), 1.0)
            best = max((w.get(v, 1.0) for v in board.problem.knobs[k] if v != knobs.get(k)), default=1.0)
            gain[k] = min(4.0, max(0.25, best / here))
        chosen: list[str] = []
        while len(chosen) < count:
            left = [k for k in mine if k not in chosen]
            x, acc = board.rng.random() * sum(gain[k] for k in left), 0.0
            for k in left:
                acc += gain[k]
                if x < acc:
                    chosen.append(k)
                    break
            else:
                chosen.append(left[-1])
        return chosen


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
