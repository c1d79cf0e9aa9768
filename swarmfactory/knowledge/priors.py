"""From lessons to what agents read: knob-value priors and prompt lines for one problem.

Each active lesson that applies to the problem (its knob exists here and both of its values are
in the knob's domain) moves the two values apart: the better one's score rises and the worse
one's falls by ``weight x ln(effect) / 2``, and a value's prior weight is
``exp(SHARPNESS x score)``. With weight 1 a 1.4x lesson makes the better value
1.4 ** SHARPNESS ~ 2.7 times as likely as the worse; agents mix the priors with a uniform
share (``agents.base.PRIOR_FLOOR``), so no value is ever ruled out.

A lesson's weight is its relevance to this problem on this machine:

* same problem, same machine: 1, times the share of the workload shapes its scope covers;
* from elsewhere it is a *hypothesis* here (``analyst.Analyst._test_hypotheses`` tests it against
  this problem's evidence on this machine): 0 once local evidence contradicted it here; its
  coverage alone once local evidence confirmed it here; until then its coverage times
  - for another machine, ``hardware.similarity`` of the two machines x ``HYPOTHESIS`` (an AVX2
    machine against an AVX-512 one of the same model: 0.5 x 0.5; another vendor: about 0.1 x 0.5);
  - for another problem, ``OTHER_PROBLEM`` (``SAME_KERNEL`` for another problem of the same
    kernel: a model's variant of a family problem, ``problems/derive.py``) x the similarity of
    working-set sizes (``exp(-|log10 bytes there - log10 bytes here|)``: 1 for the same size, 0.37
    for 10x apart).
  A lesson from another machine is so never applied at full weight before one local confirmation.

A prior keeps a disfavoured value possible, not likely; where lessons make a value unlikely,
``agents.hypothesis`` measures the matched pairs that test those of another machine among them
(``Knowledge.hypotheses``, strongest first), so that a wrong one is retired before it narrows the
search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from swarmfactory.evidence.rows import Lesson
from swarmfactory.hardware import similarity

SHARPNESS = 3.0
HYPOTHESIS = 0.5    # a lesson from another machine, not yet confirmed here
OTHER_PROBLEM = 0.3
SAME_KERNEL = 0.6   # another problem of the same kernel (a model's variant of a family problem, other shapes)
MIN_WEIGHT = 0.05   # below this a lesson is not worth a prompt line or a prior
MAX_LINES = 8


@dataclass
class Knowledge:
    """What the board carries for one problem: prompt lines (most relevant first), knob priors
    (knob -> value -> relative weight, 1 neutral), the lessons used with their weights, and the
    evidence of other problems and machines for the cost model (``costmodel.Row``)."""

    lines: list[str] = field(default_factory=list)
    priors: dict[str, dict[Any, float]] = field(default_factory=dict)
    used: list[tuple[str, float]] = field(default_factory=list)
    rows: list = field(default_factory=list)   # cost-model rows of other problems and machines
    hypotheses: list[tuple[str, Any, Any]] = field(default_factory=list)  # another machine's (knob, better, worse)


def _mid_log_bytes(rng) -> float | None:
    if not rng or not rng[0] or not rng[1]:
        return None
    return (math.log10(rng[0]) + math.log10(rng[1])) / 2


def _problem_bytes(problem) -> float | None:
    if problem.roofline is None:
        return None
    try:
        b = [problem.roofline(s).bytes for s in problem.workload]
    except Exception:
        return None
    return _mid_log_bytes([min(b), max(b)])


def standing(lesson: Lesson, problem_name: str, hardware_id: str | None) -> str | None:
    """A lesson's standing on ``problem_name`` on the machine ``hardware_id`` where it was not
    learnt: ``retired``, ``confirmed``, ``pending`` or None (untested there)."""
    here = ((lesson.data or {}).get("local") or {}).get(f"{problem_name}@{hardware_id}") or {}
    return here.get("status")


def relevance(lesson: Lesson, problem, hardware: dict) -> float:
    """How much an (active) lesson says about ``problem`` on the machine ``hardware``; 0: nothing."""
    d = lesson.data or {}
    knob = d.get("knob")
    if knob not in problem.knobs or d.get("better") not in problem.knobs[knob] \
            or d.get("worse") not in problem.knobs[knob] or not d.get("effect"):
        return 0.0
    feats = d.get("features") or {}
    w = float(feats.get("coverage", 1.0))
    here = hardware.get("id")
    if lesson.problem == problem.name and lesson.hardware_id == here:
        return w
    status = standing(lesson, problem.name, here)
    if status == "retired":
        return 0.0
    if status == "confirmed":
        return w
    if lesson.hardware_id != here:
        w *= similarity(d.get("hardware"), hardware) * HYPOTHESIS
    if lesson.problem != problem.name:
        there, mine = _mid_log_bytes(feats.get("bytes")), _problem_bytes(problem)
        kernel = feats.get("kernel") or lesson.problem.split(".")[0]
        w *= (SAME_KERNEL if kernel == problem.entry else OTHER_PROBLEM) * \
            (math.exp(-abs(there - mine)) if there is not None and mine is not None else 0.5)
    return w


def untested_elsewhere(lesson: Lesson, problem_name: str, hardware_id: str | None) -> bool:
    """Is ``lesson`` one of another machine not confirmed for ``problem_name`` here (untested or
    pending; a retired one weighs 0): what ``agents.hypothesis`` tests before it narrows the search?
    Lessons of this machine's other problems are not tested so (the same hardware; measured on
    the transfer replay, testing them cost more evaluations than it saved, docs/agents.md)."""
    if lesson.hardware_id == hardware_id:
        return False
    return standing(lesson, problem_name, hardware_id) != "confirmed"


def knowledge_for(problem, lessons: list[Lesson], hardware: dict) -> Knowledge:
    """Priors and prompt lines for ``problem`` from ``lessons`` (``Store.current_lessons()``
    rows; retired ones are ignored), and the claims of those from another machine not confirmed
    here, strongest first (what ``agents.hypothesis`` tests before they narrow the search)."""
    scored = []
    for row in lessons:
        if row.status != "active":
            continue
        w = relevance(row, problem, hardware)
        if w >= MIN_WEIGHT:
            scored.append((w, row))
    scored.sort(key=lambda t: (-t[0], -t[1].data["effect"]))
    scores: dict[str, dict[Any, float]] = {}
    for w, row in scored:
        d = row.data
        s = scores.setdefault(d["knob"], {})
        step = w * math.log(d["effect"]) / 2
        s[d["better"]] = s.get(d["better"], 0.0) + step
        s[d["worse"]] = s.get(d["worse"], 0.0) - step
    priors = {k: {v: math.exp(SHARPNESS * x) for v, x in vals.items()} for k, vals in scores.items()}
    lines = [row.text for _, row in scored[:MAX_LINES]]
    strongest = sorted(scored, key=lambda t: -t[0] * math.log(t[1].data["effect"]))
    tests = list(dict.fromkeys((row.data["knob"], row.data["better"], row.data["worse"]) for _, row in strongest
                               if untested_elsewhere(row, problem.name, hardware.get("id"))))
    return Knowledge(lines, priors, [(row.key, w) for w, row in scored], hypotheses=tests)
