"""What a measurement says: a design's fitness, what it was measured under, and the measured
design as the tuner keeps it (``Entry``).

Fitness is the user's target: the geometric mean of output tok/s over every (workload,
concurrency) pair, with an optional TTFT p99 ceiling a design must respect at every pair. A level
other processes disturbed through its repeats is ``busy`` (bench/serving.py): its figures are no
verdict on the design's speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from swarmfactory.contention import BUSY

from .design import Design


@dataclass
class Entry:
    """A design measured (or screened), as the tuner, its proposers and its LLM see it."""

    design: Design
    ratio: float            # fitness / default fitness (0 when wrong or failed)
    fitness: float
    evaluation_id: int | None = None
    screen: float | None = None  # fitness on the screening measurement (tok/s geomean)
    screen_levels: dict | None = None  # its levels (the default design's: the screening caps)
    outcome: str = ""       # its verdict ("": not recorded yet)
    detail: str = ""


def fitness(serving: dict, ceiling: float | None) -> tuple[float, str | None]:
    """Geometric mean output tok/s over every measured pair; the reason a ceiling was broken."""
    rates, over = [], None
    for wl, levels in serving.items():
        for lv in levels:
            if lv["errors"] or lv["completed"] == 0:
                return 0.0, f"{wl} c={lv['concurrency']}: {lv['errors']} failed requests"
            rates.append(max(lv["output_tok_s"], 1e-9))
            if ceiling is not None and lv["ttft_ms_p99"] > ceiling * 1000 and over is None:
                over = f"{wl} c={lv['concurrency']}: TTFT p99 {lv['ttft_ms_p99'] / 1000:.2f} s > {ceiling:g} s"
    return math.exp(sum(map(math.log, rates)) / len(rates)), over


def serving_contention(serving: dict | None) -> dict | None:
    """What a measurement's levels (``{workload: [level, ...]}``) were measured under, for the
    verdict's ``evidence["contention"]`` (bench/serving.py ``worst_contention``: ``suffered`` is the
    worst level's share of the CPUs other processes took, ``busy`` that a level stayed busy after
    its repeats); None where nothing was recorded."""
    from swarmfactory.bench.serving import worst_contention

    levels = [dict(lv, concurrency=f"{wl} c={lv.get('concurrency')}" if wl else lv.get("concurrency"))
              for wl, lvs in (serving or {}).items() for lv in lvs]
    return worst_contention(levels)


def busy_detail(cont: dict | None) -> str:
    """``inconclusive: measured on a busy machine (...)`` for a verdict's detail."""
    c = cont or {}
    share = c.get("suffered")
    where = ", ".join(str(x) for x in c.get("busy_levels") or []) or "a level"
    return (f"measured on a busy machine: other processes took "
            f"{'an unknown share' if share is None else f'{share:.0%}'} of the CPUs at {where} "
            f"(over {BUSY:.0%}, after repeats); not confirmed either way")
