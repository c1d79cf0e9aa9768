"""Crossover: recombination of two elites' knobs, each knob from one parent: even odds, or where
lessons speak about the two values, odds from the board's priors. Any search space
(problems/space.py): kernel knobs or engine designs."""

from __future__ import annotations

from swarmfactory.agents.base import Agent, Board, Proposal, knob_proposal

MAX_TRIES = 30


class CrossoverAgent(Agent):
    name = "crossover"

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        elites = [e for e in board.elites() if e.knobs is not None]
        if len(elites) < 2:
            return []
        rng, out = board.rng, []
        for _ in range(MAX_TRIES):
            if len(out) >= n:
                break
            a, b = rng.sample(elites, 2)
            knobs = {}
            for k in board.problem.knobs:
                va, vb = a.knobs.get(k), b.knobs.get(k, a.knobs.get(k))
                knobs[k] = va if rng.random() < board.prefer(k, va, vb) else vb
            prop = knob_proposal(board, knobs, self.name, "uniform", [a, b])
            if prop:
                out.append(prop)
        return out
