"""Ranking copy: try first what won on the nearest problem already measured.

On a problem with little evidence of its own, the simplest transfer is often the best one: order
its configurations by the measured speedups of the most similar problem measured before, matched
on the knobs they share (``benchmarks/transfer.py`` found this copy beating or tying the warm
swarm on half the transfer problems). This agent is that copy inside the swarm, beside the cost
model, so the bandit can weigh the two.

The source is one (problem, machine) group of what the board carries from elsewhere
(``board.transfer``, the cost model's rows) with at least ``min_rows`` measured configurations:
this machine's groups before any other machine's, then the one sharing the most knob names with
this problem, then the most knob values. Its configurations are averaged (log speedup) per combination of the
shared knobs; the agent proposes those combinations best first, the knobs not shared at this
problem's defaults (or, where that is invalid or tried, at random values). A measurement on a
busy machine made no row, so noise never becomes an order to copy.

It leads (proposes before the bandit's order) while the problem has fewer than ``lead_for``
measured configurations of its own, and stops leading, and proposing, once ``check_after`` of
them show that the source's order does not hold here (Spearman rho <= 0 between what the source
says of each measured configuration and its measured speedup; ``holds``). A source of another
machine is a hypothesis here: it is proposed when the bandit asks, and leads only once
``check_after`` local measurements confirmed it."""

from __future__ import annotations

import itertools
import json
import math

from swarmfactory.agents.base import Agent, Board, Proposal, knob_key, knob_proposal

SPACE = 4096


class RankingCopyAgent(Agent):
    name = "ranking-copy"

    def __init__(self, min_rows: int = 8, lead_for: int = 8, check_after: int = 5):
        self.min_rows, self.lead_for, self.check_after = min_rows, lead_for, check_after
        self._cache: tuple = (None, None)

    # -- the source ------------------------------------------------------------------------------
    def source(self, board: Board):
        """(source "problem@machine", its scoring function knobs -> log speedup or None), or None
        where no group of the transferred rows shares a knob with this problem."""
        p = board.problem
        key = (p.name, id(board.transfer), len(board.transfer))
        if self._cache[0] == key:
            return self._cache[1]
        here = (board.hardware or {}).get("id")
        groups: dict[tuple[str, str], list] = {}
        for r in board.transfer:
            if r.log_speedup is None or (r.problem == p.name and r.hardware_id == here):
                continue   # a failure has no speed to copy; this problem here is the board's own
            groups.setdefault((r.problem, r.hardware_id), []).append(r)
        best, best_score = None, None
        for (name, hw), rows in groups.items():
            if len(rows) < self.min_rows:
                continue
            shared = [k for k in p.knobs if all(k in r.knobs for r in rows)]
            if not shared:
                continue
            values = sum(len({r.knobs[k] for r in rows} & set(p.knobs[k])) for k in shared)
            # this machine first (the recorded sweeps: a copy of the nearest problem here beat the same
            # problem's order from another CPU on three problems of four), then the most knobs shared
            score = (hw == here, len(shared), values, len(rows))
            if best_score is None or score > best_score:
                best, best_score = ((name, hw), shared, rows), score
        out = None
        if best is not None:
            (name, hw), shared, rows = best
            out = (f"{name}@{hw}", _scorer(shared, rows))
        self._cache = (key, out)
        return out

    def _scored(self, board: Board) -> list[tuple[float, float]]:
        """(what the source says, measured log speedup) for this problem's measured configurations."""
        src = self.source(board)
        if src is None:
            return []
        score = src[1]
        return [(s, math.log(e.speedup)) for e in board.entries
                if e.knobs is not None and e.speedup and e.speedup > 0
                for s in [score(e.knobs)] if s is not None]

    def holds(self, board: Board) -> bool:
        """False where there is no source, or once ``check_after`` measured configurations of this
        problem contradict it (Spearman rho <= 0 between what it says of them and their speedups)."""
        if self.source(board) is None:
            return False
        pairs = self._scored(board)
        if len(pairs) < self.check_after:
            return True
        from swarmfactory.knowledge.costmodel import spearman

        return spearman([a for a, _ in pairs], [b for _, b in pairs]) > 0

    def leads(self, board: Board) -> bool:
        """Ahead of the bandit's order while the problem has fewer than ``lead_for`` measured
        configurations and the source holds; a source of another machine is a hypothesis here
        and leads only once local evidence confirmed it (``holds`` with ``check_after`` pairs)."""
        own = sum(1 for e in board.entries if e.knobs is not None and e.speedup is not None)
        if own >= self.lead_for or not self.holds(board):
            return False
        here = (board.hardware or {}).get("id")
        return self.source(board)[0].endswith(f"@{here}") or len(self._scored(board)) >= self.check_after

    # -- proposals -------------------------------------------------------------------------------
    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        p, rng = board.problem, board.rng
        if not p.knobs or not self.holds(board):
            return []
        src, score = self.source(board)
        tried = board.tried()
        size = math.prod(len(v) for v in p.knobs.values())
        if size <= SPACE:
            pool = [dict(zip(p.knobs, c)) for c in itertools.product(*p.knobs.values())]
        else:
            pool = [{k: rng.choice(list(v)) for k, v in p.knobs.items()} for _ in range(SPACE)]
        rng.shuffle(pool)   # ties in a random order
        ranked = sorted(((score(k), i) for i, k in enumerate(pool)), key=lambda t: -(t[0] if t[0] is not None else -1e9))
        out: list[Proposal] = []
        for s, i in ranked:
            if len(out) >= n or s is None:
                break
            knobs = pool[i]
            if knob_key(knobs) in tried:
                continue
            prop = knob_proposal(board, knobs, self.name, f"copy of {src}", [])
            if prop and all(prop.knobs != o.knobs for o in out):
                out.append(prop)
        return out


def _scorer(shared: list[str], rows: list):
    """knobs -> what the source's rows say of them (module docstring), None where a shared knob
    has a value the source never measured."""
    key = lambda vals: json.dumps(vals, default=str)  # noqa: E731
    exact: dict[str, list[float]] = {}
    per_value: dict[tuple, list[float]] = {}
    for r in rows:
        exact.setdefault(key([r.knobs[k] for k in shared]), []).append(r.log_speedup)
        for k in shared:
            per_value.setdefault((k, key(r.knobs[k])), []).append(r.log_speedup)
    mean = sum(r.log_speedup for r in rows) / len(rows)
    exact_mean = {k: sum(v) / len(v) for k, v in exact.items()}
    value_mean = {k: sum(v) / len(v) for k, v in per_value.items()}

    def score(knobs: dict) -> float | None:
        s = exact_mean.get(key([knobs.get(k) for k in shared]))
        if s is not None:
            return s
        parts = [value_mean.get((k, key(knobs.get(k)))) for k in shared]
        return None if any(v is None for v in parts) else mean + sum(v - mean for v in parts)

    return score
