"""Budget sharing among agents: Thompson sampling on each agent's yield.

A turn's reward is 1 when the proposal became a champion, 0.3 when it was correct and faster than
the baseline, 0 otherwise (failures, duplicates, nothing to propose); an ``inconclusive`` verdict
(correct, the machine too busy to time it) is neither a win nor a loss. Rewards are fractional
Beta updates; agents that produce improvements get more turns, and no agent is ever starved:
the Beta(1, 1) prior keeps every arm's chance of a turn above zero.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from swarmfactory.outcome import CORRECT


@dataclass
class Arm:
    wins: float = 0.0
    losses: float = 0.0
    turns: int = 0
    proposals: int = 0
    correct: int = 0
    faster: int = 0
    champions: int = 0

    def sample(self, rng: random.Random) -> float:
        return rng.betavariate(1.0 + self.wins, 1.0 + self.losses)


REWARD = {"champion": 1.0, "faster": 0.3}


class Bandit:
    def __init__(self, names: list[str], rng: random.Random):
        self.arms = {n: Arm() for n in names}
        self.rng = rng

    def add(self, name: str) -> None:
        self.arms.setdefault(name, Arm())

    def order(self) -> list[str]:
        """Agents in the order to ask them this turn (best Thompson draw first)."""
        draws = {n: a.sample(self.rng) for n, a in self.arms.items()}
        return sorted(draws, key=draws.get, reverse=True)

    def reward(self, name: str, outcome: str, champion: bool) -> None:
        arm = self.arms.setdefault(name, Arm())
        r = REWARD["champion"] if champion else REWARD["faster"] if outcome == "faster" else 0.0
        arm.turns += 1
        arm.proposals += 1
        arm.correct += outcome in CORRECT
        arm.faster += outcome == "faster"
        arm.champions += champion
        if outcome == "inconclusive" and not champion:
            return  # correct, but the machine was too busy to say how fast: neither a win nor a loss
        arm.wins += r
        arm.losses += 1.0 - r

    def idle(self, name: str) -> None:
        """The agent had nothing new to propose: a small loss, so it is asked less often."""
        arm = self.arms.setdefault(name, Arm())
        arm.turns += 1
        arm.losses += 0.25

    def table(self) -> list[dict]:
        return [{"agent": n, "turns": a.turns, "proposals": a.proposals, "correct": a.correct,
                 "faster": a.faster, "champions": a.champions,
                 "yield": round(a.wins / a.proposals, 3) if a.proposals else 0.0}
                for n, a in self.arms.items()]
