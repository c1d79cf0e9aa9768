"""Screening: a pruner ahead of a design's full measurement (``engine tune --screen F``).

A verified design first gets a short measurement (the first workload only, one wave of
``max(2, c)`` requests a level, its own seeded prompts, the same for every design). ``Screen.prune``
answers ``Passed`` (measure it in full) or ``Pruned``: its short figure is more than ``F`` under
the bar, or a level took ``SCREEN_CAP`` times the default design's time for it and was cut short.
The bar is the champion's short figure (or the default design's while no design is verified; a
champion from an earlier session is rescaled by its ratio to today's default). The default
design's own short figure is measured twice, before and after its full measurement, and the
faster kept: a bar measured while other work held the CPU would let slow designs through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from swarmfactory.outcome import Outcome, Verdict

from .measure import Entry, busy_detail, fitness, serving_contention
from .runner import Served, Start, TooSlow

SCREEN_CAP = 3.0           # a screening level taking this many times the default design's is cut short
SCREEN_SLACK_S = 10.0      # ... plus this


@dataclass(frozen=True)
class Passed:
    """A short measurement the design passed: its figures and their fitness."""

    figures: dict
    fitness: float


@dataclass(frozen=True)
class Pruned:
    """A design the screen ruled out, not measured in full: ``detail`` says why, ``evidence`` holds
    the short figures (``screen``, ``screen_fitness``) or the level cut short (``too_slow``),
    ``contention`` what they ran under. Pruned on a busy machine, it is no verdict on its speed."""

    detail: str
    evidence: dict
    contention: dict | None

    @property
    def busy(self) -> bool:
        return self.contention is not None and bool(self.contention["busy"])

    def ratio(self, default_screen: float) -> float:
        """Its estimated fitness ratio to the default design (what the cost model learns): its
        short figure over the default's, or at most about ``1 / SCREEN_CAP`` where a level was cut."""
        fit = self.evidence.get("screen_fitness")
        return fit / default_screen if fit is not None else 1.0 / SCREEN_CAP

    def verdict(self, start: Start, seconds: float) -> Verdict:
        """The design's verdict: ``not_faster`` (screened out), or ``inconclusive`` where the short
        measurement was disturbed by other work."""
        ev = {**self.evidence, "screened_out": not self.busy, "fitness": 0.0, "paths": start.loaded.get("paths"),
              "verify": start.verified.get("evidence", {})}
        if self.contention is not None:
            ev["contention"] = self.contention
        if self.busy:
            return Verdict(Outcome.INCONCLUSIVE, f"{busy_detail(self.contention)}; the short measurement would have "
                           f"screened it out: {self.detail}", "measure", seconds=seconds, cases_checked=3, evidence=ev)
        return Verdict(Outcome.NOT_FASTER, f"screened out: {self.detail}", "measure", seconds=seconds, cases_checked=3,
                       evidence=ev)


class Screen:
    """The pruner of one evaluation: ``cfg.screen`` is the fraction under the bar that prunes;
    ``default`` and ``champion`` the entries the bar and the caps come from (None: not measured yet)."""

    def __init__(self, cfg, default: Entry | None, champion: Entry | None):
        self.cfg, self.default, self.champion = cfg, default, champion

    def bar(self) -> float | None:
        """The short figure a design must come near (see the module docstring)."""
        against = self.champion or self.default
        if against is None or not self.default or not self.default.screen:
            return None
        return against.screen or against.ratio * self.default.screen

    def caps(self) -> dict:
        """(workload, concurrency) -> seconds a screening level may take: SCREEN_CAP times the
        default design's (a level that slow cannot come within the screen's margin of it)."""
        screen = (self.default.screen_levels if self.default else None) or {}
        return {(wl, lv["concurrency"]): SCREEN_CAP * lv["duration_s"] + SCREEN_SLACK_S
                for wl, levels in screen.items() for lv in levels}

    def prune(self, served: Served, *, baseline: bool, on_level: Callable | None, deadline: float | None,
              repeat_deadline: float | None) -> Passed | Pruned:
        """The short measurement of ``served`` and the screen's answer. The baseline (the default
        design) is never pruned and has no caps: it sets the bar."""
        try:
            figures = served.measure(self.cfg, on_level=on_level, screen=True, caps=None if baseline else self.caps(),
                                     deadline=deadline, repeat_deadline=repeat_deadline)
        except TooSlow as e:
            cut = getattr(e, "contention", None)  # what the level it cut short ran under
            return Pruned(f"{e} on the short measurement (the cap: {SCREEN_CAP:g}x the default design's time for "
                          "that level)", {"too_slow": str(e)},
                          None if cut is None else serving_contention({"": [{
                              "concurrency": str(e).split(" took", 1)[0], "contention": cut}]}))
        fit, _ = fitness(figures, None)
        bar = self.bar()
        if not baseline and bar and fit < bar * (1 - self.cfg.screen):
            ratio = fit / self.default.screen if self.default and self.default.screen else 0.0
            return Pruned(f"{fit:.1f} tok/s on the short measurement, more than {self.cfg.screen:.0%} under the "
                          f"champion's {bar:.1f} (~{ratio:.2f}x the default)",
                          {"screen": figures, "screen_fitness": fit}, serving_contention(figures))
        return Passed(figures, fit)

    def again(self, served: Served, first: Passed, *, on_level: Callable | None,
              repeat_deadline: float | None) -> Passed:
        """The baseline's short figure measured a second time, after its full measurement: the
        faster of the two is the bar."""
        figures = served.measure(self.cfg, on_level=on_level, screen=True, repeat_deadline=repeat_deadline)
        fit, _ = fitness(figures, None)
        return Passed(figures, fit) if fit > first.fitness else first
