"""From lessons to what agents read: knob-value priors and prompt lines for one problem.

Each active lesson that applies to the problem (its knob exists here and both of its values are
in the knob's domain) moves the two values apart: the better one's score rises and the worse
one's falls by ``weight x ln(effect) / 2``, and a value's prior weight is
``exp(SHARPNESS x score)``. With weight 1 a 1.4x lesson makes the better value
1.4 ** SHARPNESS ~ 2.7 times as likely as the worse; agents mix the priors with a uniform
share (``agents.base.PRIOR_FLOOR``), so no value is ever ruled out.

A lesson's weight is its relevance to this problem on this machine:

* same problem, same machine: 1, times the share of the workload shapes its scope covers;
* another machine: x ``OTHER_MACHINE`` (same instruction-set level) or
  x ``OTHER_MACHINE * OTHER_ISA`` (a different one);
* another problem: x ``OTHER_PROBLEM``, times the similarity of working-set sizes
  (``exp(-|log10 bytes there - log10 bytes here|)``, 1 for the same size, 0.37 for 10x apart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from swarmfactory.evidence.rows import Lesson
from swarmfactory.knowledge.analyst import isa_label

SHARPNESS = 3.0
OTHER_MACHINE = 0.5
OTHER_ISA = 0.5
OTHER_PROBLEM = 0.3
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


def relevance(lesson: Lesson, problem, hardware: dict) -> float:
    """How much an (active) lesson says about ``problem`` on the machine ``hardware``; 0: nothing."""
    d = lesson.data or {}
    knob = d.get("knob")
    if knob not in problem.knobs or d.get("better") not in problem.knobs[knob] \
            or d.get("worse") not in problem.knobs[knob] or not d.get("effect"):
        return 0.0
    feats = d.get("features") or {}
    w = float(feats.get("coverage", 1.0))
    if lesson.hardware_id != hardware.get("id"):
        same_isa = (d.get("hardware") or {}).get("isa") == isa_label(hardware.get("features") or ())
        w *= OTHER_MACHINE * (1.0 if same_isa else OTHER_ISA)
    if lesson.problem != problem.name:
        there, here = _mid_log_bytes(feats.get("bytes")), _problem_bytes(problem)
        w *= OTHER_PROBLEM * (math.exp(-abs(there - here)) if there is not None and here is not None else 0.5)
    return w


def knowledge_for(problem, lessons: list[Lesson], hardware: dict) -> Knowledge:
    """Priors and prompt lines for ``problem`` from ``lessons`` (``Store.current_lessons()``
    rows; retired ones are ignored)."""
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
    return Knowledge(lines, priors, [(row.key, w) for w, row in scored])
