"""The runner seam: how the tuner starts a design and gets its figures.

A ``Runner`` starts a design (``start``: load and verify it; a failure is a verdict, a pass a
``Served`` design) and a ``Served`` design is measured (``measure``: the serving figures of every
workload and concurrency level, or the short screening look), asked what the engine's audit
caught, and closed. The tuner's logic (screening, confirmation, champions, records) sees only
this seam, so it runs the same on:

- ``server.ServingRunner``: the real thing, each design in its own ``engine serve`` process,
  verified end to end and measured over HTTP (minutes a design);
- ``ReplayRunner``: recorded verdicts and figures, returned at once (as Kernel Tuner's simulation
  runner replays recorded results), so the tuner is tested without a model or a server.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from swarmfactory.engine.config import EngineConfig
from swarmfactory.outcome import Outcome, Verdict


class OutOfTime(Exception):
    """A measurement the run's time limit cut short (not the design's fault)."""


class TooSlow(Exception):
    """A screening level that ran past its cap: the design is far slower than the bar."""


class RunnerError(Exception):
    """The runner cannot run designs here at all (e.g. no reference to verify them against)."""


class Served(Protocol):
    """A design that passed its load and verification (or the baseline, served anyway) and serves."""

    def measure(self, cfg, on_level: Callable | None = None, deadline: float | None = None, screen: bool = False,
                caps: dict | None = None, repeat_deadline: float | None = None) -> dict:
        """``{workload: [level, ...]}`` (bench/serving.py figures, each level with the contention it
        ran under); ``screen``: the short look (first workload, one wave a level). Raises
        ``OutOfTime`` past ``deadline`` and ``TooSlow`` for a level past its cap in ``caps``."""

    def audit_failure(self) -> str | None:
        """What the engine's audit of its kernel-factory kernels caught while it served, or None."""

    def close(self) -> None: ...


@dataclass
class Start:
    """What a design's start said: a verdict if it failed, else the served design (the baseline,
    served after a failed verification, has both)."""

    server: Served | None
    verdict: Verdict | None
    loaded: dict = field(default_factory=dict)
    verified: dict = field(default_factory=dict)


class Runner(Protocol):
    def open(self, model_path: Path, deadline: float, log: Callable[[str], None]) -> None:
        """Before the first design (time spent here counts against ``deadline``); RunnerError where
        no design can run."""

    def start(self, config: EngineConfig, serve_anyway: bool = False) -> Start:
        """Load and verify ``config``; ``serve_anyway``: serve it after a failed verification too
        (the baseline: what users run today)."""

    def close(self) -> None: ...


# -- replay ---------------------------------------------------------------------------------------
@dataclass
class Recording:
    """What one design did, to be replayed: ``verdict`` where its load or verification failed (the
    baseline is served all the same); ``serving``: its full measurements, one per round (the last
    repeats: a confirmation round gets it again); ``screen``: its short ones, likewise (none: the
    first workload of its full figures); ``too_slow``: the screening level it ran past its cap
    (``TooSlow``); ``audit``: what the engine's audit caught while it served."""

    verdict: Verdict | None = None
    serving: list[dict] = field(default_factory=list)
    screen: list[dict] = field(default_factory=list)
    too_slow: str | None = None
    audit: str | None = None
    loaded: dict = field(default_factory=lambda: {"paths": "replayed", "seconds": 0.0})


class ReplayServed:
    """A served design whose measurements are its recording's, round after round."""

    def __init__(self, recording: Recording):
        self.recording, self.rounds = recording, {False: 0, True: 0}

    def measure(self, cfg, on_level=None, deadline=None, screen=False, caps=None, repeat_deadline=None) -> dict:
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime("the run's time ran out before the measurement")
        rec = self.recording
        if screen and rec.too_slow:
            raise TooSlow(rec.too_slow)
        full = rec.serving[min(self.rounds[False], len(rec.serving) - 1)] if rec.serving else {}
        if screen:
            figures = rec.screen[min(self.rounds[True], len(rec.screen) - 1)] if rec.screen else \
                {wl: lv for wl, lv in list(full.items())[:1]}
        else:
            figures = full
        self.rounds[screen] += 1
        for wl, levels in figures.items():
            for lv in levels:
                if on_level:
                    on_level(wl, lv)
        return figures

    def audit_failure(self) -> str | None:
        return self.recording.audit

    def close(self) -> None:
        pass


class ReplayRunner:
    """Designs replayed from recordings: ``recorded(config)`` is the design's ``Recording``, or None
    for a design never recorded (then ``crashed``, saying so). ``started`` lists every config
    started, in order (a confirmation round starts the champion again)."""

    def __init__(self, recorded: Callable[[EngineConfig], Recording | None]):
        self.recorded = recorded
        self.started: list[EngineConfig] = []

    def open(self, model_path: Path, deadline: float, log: Callable[[str], None]) -> None:
        pass

    def start(self, config: EngineConfig, serve_anyway: bool = False) -> Start:
        self.started.append(config)
        rec = self.recorded(config)
        if rec is None:
            return Start(None, Verdict(Outcome.CRASHED, "replay: no recording of this design", "load"))
        verdict = copy.deepcopy(rec.verdict)  # the tuner adds to its verdicts: the recording stays as it was
        verified = {"ok": verdict is None, "detail": "", "evidence": {}}
        if verdict is not None and not (serve_anyway and verdict.outcome is Outcome.WRONG):
            return Start(None, verdict, dict(rec.loaded), verified)
        return Start(ReplayServed(rec), verdict, dict(rec.loaded), verified)

    def close(self) -> None:
        pass
