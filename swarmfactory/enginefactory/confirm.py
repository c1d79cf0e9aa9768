"""Confirmation: champion against challenger, back to back.

A measured design is judged against the champion (or, while none is verified, the default
design). One that beats it by more than ``min_effect`` on its first measurement is confirmed in a
second round: the champion and the challenger are measured again back to back, and the
challenger takes over only if it wins both rounds; the two ratios are its range (the verdict's
CI). A round measured on a busy machine is no evidence either way (``inconclusive``), and one that
does not fit in the time left leaves the design unconfirmed.
"""

from __future__ import annotations

import time
from typing import Callable

from swarmfactory.outcome import Outcome, Verdict

from .design import Design
from .evaluate import GRACE_S
from .measure import Entry, busy_detail, fitness, serving_contention
from .runner import OutOfTime, Runner, Served


class Confirmation:
    """The judge of measured designs: ``runner`` starts the champion again for its round."""

    def __init__(self, runner: Runner, cfg, log: Callable[[str], None]):
        self.runner, self.cfg, self.log = runner, cfg, log

    def judge(self, design: Design, verdict: Verdict, served: Served, *, default: Entry, champion: Entry | None,
              deadline: float, note: str) -> tuple[Entry, bool]:
        """A measured design against the champion (or the default): confirmed by a second round
        where it won the first. Sets the verdict's speedup, outcome and detail; returns its entry
        and whether it is the new champion. A design measured on a busy machine (``inconclusive``,
        evaluate.py) or confirmed on one is no verdict on its speed: never a champion."""
        fit = verdict.evidence["fitness"]
        entry = Entry(design, fit / default.fitness, fit, screen=verdict.evidence.get("screen_fitness"))
        verdict.speedup = entry.ratio
        verdict.ci_low = verdict.ci_high = entry.ratio
        if verdict.outcome is Outcome.INCONCLUSIVE:
            verdict.detail += f" (one round: {entry.ratio:.2f}x the default design)"
            return entry, False
        against = champion or default
        within = verdict.evidence.get("over_ceiling") is None
        new_champion = False
        if within and fit > against.fitness * (1 + self.cfg.min_effect):
            try:
                if deadline - time.monotonic() < 1.5 * verdict.seconds:
                    raise OutOfTime("two more measurements do not fit in the time left")
                won, lo, hi, cont = self.confirm(entry, served, against, default, deadline)
                if cont is not None and cont["busy"]:  # the second round is no evidence either way
                    verdict.evidence["vs_champion"] = [lo, hi]
                    verdict.evidence["confirmation_contention"] = cont
                    verdict.evidence["contention"] = cont
                    verdict.outcome = Outcome.INCONCLUSIVE
                    verdict.detail = (f"{entry.ratio:.2f}x the default design, {lo:.2f}-{hi:.2f}x the "
                                      f"{'champion' if champion else 'default design'}; the confirmation was "
                                      + busy_detail(cont))
                    return entry, False
            except OutOfTime as e:
                won, lo = False, entry.fitness / against.fitness
                hi = lo
                verdict.evidence["unconfirmed"] = str(e)
                self.log(f"{note}: {lo:.2f}x the {'champion' if champion else 'default'} in one "
                         f"round, not confirmed ({e}); a longer --time would confirm it")
            verdict.evidence["vs_champion"] = [lo, hi]
            if won:
                verdict.outcome = Outcome.FASTER
                verdict.ci_low, verdict.ci_high = lo * against.ratio, hi * against.ratio
                verdict.detail = (f"{entry.ratio:.2f}x the default design; beat the "
                                  f"{'champion' if champion else 'default design'} "
                                  f"twice ({lo:.2f}x, {hi:.2f}x)")
                new_champion = True
            else:
                verdict.detail = f"first round {lo:.2f}-{hi:.2f}x the champion; not confirmed"
        if not verdict.detail:
            verdict.detail = f"{entry.ratio:.2f}x the default design"
        if within and champion is None and not new_champion:  # the first verified design
            new_champion = True
            verdict.detail += " (the first verified design: the default failed verification)"
        return entry, new_champion

    def confirm(self, challenger: Entry, served: Served, against: Entry, default: Entry,
                deadline: float) -> tuple[bool, float, float, dict | None]:
        """``against`` (the champion, or the default design) and the challenger measured again
        back to back; both rounds must favour the challenger by min_effect. Returns (won, low
        ratio, high ratio) of challenger over ``against``, and the contention of the second round
        (``serving_contention`` of both measurements; busy: no verdict, the caller's to say)."""
        first = challenger.fitness / against.fitness
        limit = deadline + GRACE_S  # like any measurement: OutOfTime past it (not confirmed)
        start = self.runner.start(against.design.config, serve_anyway=against is default)
        if start.server is None:  # it no longer starts: the challenger wins by default
            return True, first, first, None
        try:
            base = start.server.measure(self.cfg, deadline=limit)
        finally:
            start.server.close()
        base_fit, _ = fitness(base, self.cfg.ttft_p99_s)
        again = served.measure(self.cfg, deadline=limit)
        ch_fit, over = fitness(again, self.cfg.ttft_p99_s)
        second = ch_fit / base_fit if base_fit else float("inf")
        lo, hi = min(first, second), max(first, second)
        cont = serving_contention({**{f"{k} (against)": v for k, v in base.items()},
                                   **{f"{k} (again)": v for k, v in again.items()}})
        return (over is None and lo > 1 + self.cfg.min_effect), lo, hi, cont
