"""Typed outcomes of an evaluation. Failures are data: each carries its evidence in ``detail``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Outcome(str, Enum):
    BUILD_FAILED = "build_failed"
    CRASHED = "crashed"
    TIMED_OUT = "timed_out"
    WRONG = "wrong"
    CHEATED = "cheated"
    NOT_FASTER = "not_faster"
    FASTER = "faster"
    VERIFIED = "verified"   # passed verification and was never measured: no speed claim either way
    # built (CUDA, PTX), verifying and timing it need a GPU this machine lacks; or not built for
    # want of the backend's tool (Triton, NVRTC, ptxas), after the checks that run without it
    NEEDS_DEVICE = "needs_device"
    # passed verification, but the machine stayed too busy to time it (other work took the CPUs
    # it was measured on, swarmfactory/contention.py): no speed claim either way, never a
    # champion or a lesson; measured again later
    INCONCLUSIVE = "inconclusive"

    @property
    def correct(self) -> bool:
        """Passed verification (measured or not)."""
        return self in (Outcome.NOT_FASTER, Outcome.FASTER, Outcome.VERIFIED, Outcome.INCONCLUSIVE)

    @property
    def measured(self) -> bool:
        """Correct and timed against the baseline: ``faster`` or ``not_faster``."""
        return self in (Outcome.NOT_FASTER, Outcome.FASTER)


CORRECT = tuple(o.value for o in Outcome if o.correct)     # passed verification: not rejections
MEASURED = tuple(o.value for o in Outcome if o.measured)   # a speed claim either way


class Rejected(Exception):
    """Raised inside the harness to end an evaluation with a failure outcome."""

    def __init__(self, outcome: Outcome, detail: str, stage: str, **evidence):
        super().__init__(detail)
        self.outcome, self.detail, self.stage, self.evidence = outcome, detail, stage, evidence


@dataclass
class ShapeTiming:
    shape: dict
    candidate_us: float
    baseline_us: float
    reference_us: float | None
    speedup: float
    ci_low: float
    ci_high: float
    vs_reference: float | None
    roofline_fraction: float | None = None


@dataclass
class Verdict:
    outcome: Outcome
    detail: str
    stage: str
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    vs_reference: float | None = None
    roofline_fraction: float | None = None
    baseline: str | None = None
    shapes: list[ShapeTiming] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)
    cases_checked: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["outcome"] = self.outcome.value
        return d
