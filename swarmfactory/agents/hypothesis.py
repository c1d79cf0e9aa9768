"""The hypothesis tester: what a lesson of another machine rules against is measured here before it
can narrow the search.

A lesson learnt on another machine is a hypothesis here (knowledge/priors.py): it shapes the knob
priors at a reduced weight until local evidence confirms or retires it
(``analyst.Analyst._test_hypotheses``, on ``LOCAL_PAIRS`` matched pairs). But a prior that makes a
value unlikely also makes the evidence that would retire it unlikely: lessons from an AVX2 machine
that say 8 lanes beat 16 by 8x steer an AVX-512 machine's search away from the 16-lane kernels that
are its best, and the contradiction comes late or never. So while the priors make a value less
than ``SUPPRESSED`` times as likely as a uniform choice, this agent leads (after the seed's
defaults and the cost model's first guesses) and tests another machine's lessons against that value,
strongest first: it measures the best configurations found so far with the hypothesis's other
value, making the matched pairs the analyst judges it by. The coordinator runs the analyst after
each of its verdicts (``learns``), so a contradicted lesson is retired here and stops steering at
once, and the value is no longer suppressed once the lessons that suppressed it are retired.

Each suppressed value is tested once, on the strongest claim against it: one pair where the value
measures at most ``SETTLED`` of the other side shows it losing here as the claims say, and the
value is settled (one evaluation for "vw=1 is slow", which holds everywhere). A pair where it does
not lose clearly is followed by a second (``TESTS`` pairs, what the analyst judges a hypothesis
on); once the analyst retires that claim, the next strongest against the value is tested while
the value is still suppressed. Pairs that other agents made count. Each test is one evaluation
of a configuration next to the best, which a search would try anyway.

Lessons of this machine's other problems are hypotheses too (the analyst retires them here on
contradicting evidence), but are not tested so: on the transfer replay, testing them cost cold
start evaluations at the looser targets (1.4-1.6x cold at 85% of the best on two problems) for
a gain on one; another machine's, tested, no longer hurt (docs/agents.md).
"""

from __future__ import annotations

from typing import Any

from swarmfactory.agents.base import Agent, Board, Entry, Proposal, knob_key, knob_proposal

SUPPRESSED = 0.5   # a value less likely than this share of a uniform choice is tested first
TESTS = 2          # matched pairs a hypothesis is tested on (analyst.LOCAL_PAIRS)
SETTLED = 0.9      # a pair whose disfavoured side is at most this share of the other settles the value


def pairs(board: Board, knob: str, better: Any, worse: Any) -> list[tuple[Entry | None, Entry | None]]:
    """The matched pairs (better side, worse side) on the board: configurations alike but for
    ``knob``, one with each value; a side without a usable speed (pending, failed, or measured on
    a busy machine: weight 0, evidence/quality.py) is None."""
    sides: dict[tuple, dict[Any, Entry]] = {}
    for e in board.entries:
        if e.knobs is not None and e.knobs.get(knob) in (better, worse):
            sides.setdefault(knob_key({k: v for k, v in e.knobs.items() if k != knob}), {})[e.knobs[knob]] = e
    out = []
    for both in sides.values():
        if len(both) == 2:
            out.append(tuple(e if e.correct and e.speedup and e.weight > 0 else None for e in (both[better], both[worse])))
    return out


class HypothesisAgent(Agent):
    name = "hypothesis-test"
    lead_rank = 2     # after the seed (0) and the model-guided agent (1)
    learns = True

    def untested(self, board: Board) -> list[tuple[str, Any, Any]]:
        """The hypotheses (knob, better, worse) to test now, one per suppressed value, the least
        likely value first."""
        p = board.problem
        against: dict[tuple[str, Any], list[tuple[str, Any, Any]]] = {}
        for knob, better, worse in dict.fromkeys(board.hypotheses):     # strongest first
            values = list(p.knobs.get(knob, ()))
            if better in values and worse in values and better != worse:
                against.setdefault((knob, worse), []).append((knob, better, worse))
        out = []
        for (knob, worse), claims in against.items():
            values = list(p.knobs[knob])
            probs = board.weights(knob, values)
            share = None if probs is None else probs[values.index(worse)]
            if share is None or share >= SUPPRESSED / len(values):
                continue
            have = {c: pairs(board, *c) for c in claims}
            if any(b is not None and w is not None and w.speedup <= SETTLED * b.speedup
                   for ps in have.values() for b, w in ps):
                continue          # a pair here shows the value losing clearly: what the claims say holds
            todo = [c for c in claims if len(have[c]) < TESTS]
            if todo:
                out.append((share, todo[0]))
        return [c for _, c in sorted(out, key=lambda t: t[0])]

    def leads(self, board: Board) -> bool:
        return bool(board.hypotheses) and bool(board.elites(1)) and bool(self.untested(board))

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        out: list[Proposal] = []
        elites = [e for e in board.elites() if e.knobs is not None]
        for knob, better, worse in self.untested(board):
            # a pair from the best configuration that has one of the two values; else the best with
            # the disfavoured value, a side that a later pair can complete
            order = [e for e in elites if e.knobs.get(knob) in (better, worse)] + \
                    [e for e in elites if e.knobs.get(knob) not in (better, worse)]
            for parent in order:
                other = better if parent.knobs.get(knob) == worse else worse
                prop = knob_proposal(board, {**parent.knobs, knob: other}, self.name, "test-hypothesis", [parent])
                if prop and all(prop.knobs != o.knobs for o in out):
                    out.append(prop)
                    break
            if len(out) >= n:
                break
        return out
