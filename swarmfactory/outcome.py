"""Typed outcomes of an evaluation. Failures are data: each carries its evidence in ``detail``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Outcome(str, Enum):
    """An evaluation's outcome. A ``str``: it compares equal to its value (``Outcome.FASTER ==
    "faster"``), formats as it (``f"{outcome}"`` is ``faster``) and is stored as it."""

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

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def correct(self) -> bool:
        """Passed verification (measured or not)."""
        return self in (Outcome.NOT_FASTER, Outcome.FASTER, Outcome.VERIFIED, Outcome.INCONCLUSIVE)

    @property
    def measured(self) -> bool:
        """Correct and timed against the baseline: ``faster`` or ``not_faster``."""
        return self in (Outcome.NOT_FASTER, Outcome.FASTER)

    @property
    def rejected(self) -> bool:
        """Failed a check: did not build, crashed, timed out, wrong or cheated."""
        return not self.correct and self is not Outcome.NEEDS_DEVICE

    @property
    def no_claim(self) -> bool:
        """Neither a speed claim nor a rejection: correct but not timed (``verified``,
        ``inconclusive``), or waiting for a device to run at all (``needs_device``)."""
        return not self.measured and not self.rejected

    @property
    def misbehaved(self) -> bool:
        """Its code ran and did wrong (``wrong``, ``cheated``, ``crashed``): its other figures are
        not evidence either."""
        return self in (Outcome.WRONG, Outcome.CHEATED, Outcome.CRASHED)


# The named sets, as the values the store holds (usable in SQL ``IN`` and in messages, in the
# order above); an ``Outcome`` is found in them as its value is.
CORRECT = tuple(o.value for o in Outcome if o.correct)         # passed verification: not rejections
MEASURED = tuple(o.value for o in Outcome if o.measured)       # a speed claim either way
REJECTED = tuple(o.value for o in Outcome if o.rejected)       # failed a check
NO_CLAIM = tuple(o.value for o in Outcome if o.no_claim)       # correct or waiting, no speed claim
MISBEHAVED = tuple(o.value for o in Outcome if o.misbehaved)   # ran and did wrong


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
