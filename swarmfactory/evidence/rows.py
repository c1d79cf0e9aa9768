"""What the store reads back: one frozen dataclass per kind of row.

``Store`` returns these instead of dicts, so a misspelt column is an ``AttributeError`` where it is
read rather than a ``KeyError`` (or a silent ``None`` from ``.get``) far from it, and a row handed
to another thread or kept in a cache cannot be changed under its other readers. A field holds the
column as the database returns it: JSON columns are the dicts and lists that were written
(frozen rows, not frozen contents: treat them as read-only), ``created_at`` a ``datetime``, an
``outcome`` an ``Outcome`` (a ``str``: it compares equal to the value the store holds).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Mapping

from swarmfactory.outcome import Outcome

# The toolchain a profile was tuned and verified with: it is served only where these match.
TOOL_KEYS = ("torch", "cc_version")


class _Row:
    """What every row shares: built from a SELECT's columns, read back as a plain dict."""

    __slots__ = ()

    @classmethod
    def of(cls, values: Mapping[str, Any]):
        """The row of a mapping of its columns (a SELECT's, or a record written in the same names,
        as ``benchmarks/data`` holds): columns the row does not have are ignored, those the
        mapping lacks are None."""
        return cls(**{f.name: values.get(f.name) for f in fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        """The row's fields by name (shallow: JSON columns are the row's own dicts)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _outcome(row) -> None:
    """A row's ``outcome`` column as an ``Outcome`` (set on a frozen row while it is built)."""
    if row.outcome is not None and not isinstance(row.outcome, Outcome):
        object.__setattr__(row, "outcome", Outcome(row.outcome))


@dataclass(frozen=True, slots=True)
class Run(_Row):
    """A run: kernel factory (``swarmfactory run``) or engine factory (``config["kind"] ==
    "engine-tune"``). ``status``: running | finished | interrupted."""

    id: str
    status: str
    config: dict
    hardware_id: str
    parent_run: str | None
    finished_at: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class CandidateRow(_Row):
    """A candidate as recorded (``agents.base.candidate_record``): ``id`` its content hash."""

    id: str
    problem: str
    backend: str
    source: str
    flags: list
    knobs: dict | None
    parents: list
    agent: str
    operator: str
    generation: int
    run_id: str | None
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Evaluation(_Row):
    """One verdict on a candidate, with what it was judged against (problem spec, validation
    set, hardware, tools) and why it was made (``purpose``: search | eval | remeasure | reverify
    | ...)."""

    id: int
    candidate_id: str
    problem: str
    problem_spec: str
    validation_version: str
    run_id: str | None
    purpose: str
    hardware_id: str
    hardware: dict
    tools: dict
    outcome: Outcome
    stage: str
    detail: str
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    vs_reference: float | None
    roofline_fraction: float | None
    baseline: str | None
    shapes: list
    flags: list
    evidence: dict
    cases_checked: int
    seconds: float
    created_at: datetime

    def __post_init__(self) -> None:
        _outcome(self)


@dataclass(frozen=True, slots=True)
class MeasuredFigure(_Row):
    """A measured (``faster`` or ``not_faster``) evaluation's figure and the contention it was
    taken under (``evidence["contention"]``; None where not recorded)."""

    candidate_id: str
    speedup: float | None
    contention: dict | None


@dataclass(frozen=True, slots=True)
class KnobEvidence(_Row):
    """An evaluation with its candidate's knobs and agent: what the analyst and the cost model
    learn from (``contention`` as in ``MeasuredFigure``)."""

    id: int | None
    candidate_id: str | None
    problem: str
    problem_spec: str | None
    hardware_id: str | None
    hardware: dict | None
    purpose: str | None
    outcome: Outcome
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    contention: dict | None
    shapes: list | None
    run_id: str | None
    knobs: dict | None
    agent: str | None

    def __post_init__(self) -> None:
        _outcome(self)


@dataclass(frozen=True, slots=True)
class Champion(_Row):
    """A step of a problem's title on one machine: the latest row is the title as it stands
    (``candidate_id`` None: vacant), ``reason`` why it changed or was kept."""

    id: int
    problem: str
    problem_spec: str
    hardware_id: str
    candidate_id: str | None
    evaluation_id: int | None
    run_id: str | None
    speedup: float | None
    reason: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class FoundCase(_Row):
    """A validation case found after the seed set, with who found it and what it broke."""

    id: int
    problem: str
    case_key: str
    shape: dict
    seed: int
    dist: str
    found_by: str
    broke_candidate: str | None
    note: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Lesson(_Row):
    """A lesson row. Its identity is ``key`` (``data["key"]``), its ``status`` ``data["status"]``
    (active | retired); a status change is a new row, and ``history`` holds a current lesson's
    earlier rows (``Store.current_lessons``), oldest first."""

    id: int
    problem: str | None
    hardware_id: str
    agent: str
    text: str
    data: dict
    run_id: str | None
    created_at: datetime
    history: tuple[Lesson, ...] = ()

    @property
    def key(self) -> str:
        return (self.data or {}).get("key") or f"row:{self.id}"

    @property
    def status(self) -> str:
        return (self.data or {}).get("status", "active")


@dataclass(frozen=True, slots=True)
class LlmCall(_Row):
    """One call to an LLM endpoint (``status`` ``stopped``: the agent stopped for good, ``error``
    why)."""

    id: int
    run_id: str | None
    agent: str
    endpoint: dict
    model: str
    problem: str
    operator: str
    status: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    seconds: float
    error: str | None
    raw: str | None
    parent: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Profile(_Row):
    """An engine profile: the best verified engine design (the champion of ``engine:<model>``)
    for one model file, machine and toolchain, with the evaluation that made it champion.

    ``id``: the design's content hash; ``speedup``: its fitness over the default design's in the
    run that tuned it; ``serving``, ``description``, ``model_sha256`` and ``contention`` from
    that evaluation's evidence."""

    id: str
    problem: str
    run_id: str | None
    created_at: datetime
    speedup: float | None
    reason: str
    config_yaml: str
    knobs: dict
    hardware_id: str
    hardware: dict
    tools: dict
    model_sha256: str
    serving: dict
    description: str
    contention: dict | None = None

    def mismatch(self, model_sha256: str, hardware_id: str, tools: dict) -> str | None:
        """Why this profile does not apply to this model file, machine and toolchain (or was
        measured on a busy machine), or None."""
        from swarmfactory.evidence.quality import busy, describe

        if busy(self.contention):
            return (f"its serving figures were measured on a busy machine ({describe(self.contention)}): "
                    "swarmfactory engine tune again on a quieter machine")
        if self.model_sha256 != model_sha256:
            return "tuned for another model file"
        if self.hardware_id != hardware_id:
            return f"tuned on another CPU ({self.hardware.get('model', '?')}, {self.hardware.get('cpus', '?')} CPUs)"
        for k in TOOL_KEYS:
            if self.tools.get(k) != tools.get(k):
                return f"tuned with {k} {self.tools.get(k)} (now {tools.get(k)})"
        return None
