"""Crossover: uniform recombination of two elites' knobs."""

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
            knobs = {k: (a.knobs if rng.random() < 0.5 else b.knobs).get(k, a.knobs.get(k))
                     for k in board.problem.knobs}
            prop = knob_proposal(board, knobs, self.name, "uniform", [a, b])
            if prop:
                out.append(prop)
        return out
