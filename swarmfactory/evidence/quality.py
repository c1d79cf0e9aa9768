"""How much a recorded measurement can be trusted: the contention it was taken under and the
width of its interval. Read by the title (``swarm/succession.py``), the engine's seams and the
knowledge (lessons, cost model).

The harness writes ``evidence["contention"]`` (``suffered``: the share of the measurement the
timed code waited for a CPU; ``busy``: the machine stayed busy). Evaluations recorded before it
did have no such key: unknown, and unknown counts as not busy.
"""

from __future__ import annotations

from swarmfactory.contention import BUSY


def contention(evidence) -> dict | None:
    """The contention a measurement recorded (``evidence`` a verdict's evidence dict, or the
    ``contention`` value itself); None where unknown."""
    if not isinstance(evidence, dict):
        return None
    inner = evidence.get("contention")
    if isinstance(inner, dict):
        return inner
    return evidence if "suffered" in evidence or "busy" in evidence else None


def busy(evidence) -> bool:
    """Measured on a busy machine: the harness said so, or the timed code waited for a CPU more
    than ``contention.BUSY`` of the time. Unknown (old rows) is not busy."""
    c = contention(evidence)
    if c is None:
        return False
    suffered = c.get("suffered")
    return bool(c.get("busy")) or (isinstance(suffered, (int, float)) and suffered > BUSY)


def weight(speedup, ci_low, ci_high, evidence) -> float:
    """A measurement's weight in what is learnt from it: ``(1 - suffered) / (1 + relative CI
    width)``, the width ``(ci_high - ci_low) / speedup``; 0 for a busy measurement. A missing
    ``suffered`` counts as 0, a missing interval as width 0 (weight 1 for an old, clean row)."""
    if busy(evidence):
        return 0.0
    c = contention(evidence) or {}
    suffered = c.get("suffered") if isinstance(c.get("suffered"), (int, float)) else 0.0
    width = 0.0
    if speedup and ci_low is not None and ci_high is not None and speedup > 0:
        width = max(0.0, (ci_high - ci_low) / speedup)
    return max(0.0, 1.0 - suffered) / (1.0 + width)


def describe(evidence) -> str:
    """``suffered 3%, not busy`` / ``suffered 24%, busy`` / ``contention not recorded``."""
    c = contention(evidence)
    if c is None:
        return "contention not recorded"
    suffered = c.get("suffered")
    share = f"suffered {suffered:.0%}" if isinstance(suffered, (int, float)) else "suffered unknown"
    return f"{share}, {'busy' if busy(c) else 'not busy'}"
