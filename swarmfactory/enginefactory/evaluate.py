"""One design's evaluation: started (loaded and verified end to end) by the runner, screened, measured
in full, its kernels' audit read, and its verdict made.

A verdict here is ``wrong`` (with the prompt and token where it diverged, or the kernel the
engine's audit caught), ``crashed``, ``timed_out``, ``build_failed``, ``not_faster`` (screened out,
or measured: the tuner's confirmation decides whether it is ``faster``, confirm.py), or
``inconclusive``: measured on a busy machine (at some level other processes kept more than
``contention.BUSY`` of the CPUs through the level's repeats, bench/serving.py), so no verdict on
its speed: never the champion or the profile, not learnt from, measured again by a later tune;
its ``evidence["contention"]`` says what it ran under.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from swarmfactory.outcome import Outcome, Verdict

from .design import Design
from .measure import busy_detail, fitness, serving_contention
from .runner import OutOfTime, Runner, Served
from .screen import Passed, Pruned, Screen

GRACE_S = 60.0              # a design measured past the run's deadline by more than this is stopped


@dataclass
class Evaluated:
    """A design's verdict, its served process where it was measured in full (the caller confirms
    it, then closes it), and the screen's answer where it pruned the design."""

    verdict: Verdict
    served: Served | None = None
    pruned: Pruned | None = None


def evaluate(runner: Runner, design: Design, cfg, screen: Screen | None, *, deadline: float,
             baseline: bool = False, on_level: Callable | None = None) -> Evaluated:
    """Evaluate ``design`` under the run's ``deadline`` (time.monotonic; measured up to ``GRACE_S``
    past it). ``baseline``: the default design, served and measured even where it failed
    verification (what users run today), never cut short, its short figure the screen's bar."""
    t0 = time.perf_counter()
    start = runner.start(design.config, serve_anyway=baseline)
    if start.server is None:
        start.verdict.seconds = time.perf_counter() - t0
        start.verdict.evidence.setdefault("paths", start.loaded.get("paths"))
        return Evaluated(start.verdict)
    srv = start.server
    # repeats of a disturbed level stay inside the run's time (the baseline's included)
    repeat_until = deadline if baseline else deadline + GRACE_S
    limit = None if baseline else deadline + GRACE_S
    short: Passed | None = None
    try:
        if screen is not None:
            answer = screen.prune(srv, baseline=baseline, on_level=on_level, deadline=limit,
                                  repeat_deadline=repeat_until)
            if isinstance(answer, Pruned):
                srv.close()
                return Evaluated(answer.verdict(start, time.perf_counter() - t0), pruned=answer)
            short = answer
        serving = srv.measure(cfg, on_level=on_level, deadline=limit, repeat_deadline=repeat_until)
        if baseline and short is not None:
            short = screen.again(srv, short, on_level=on_level, repeat_deadline=repeat_until)
    except OutOfTime as e:
        srv.close()
        return Evaluated(Verdict(Outcome.NOT_FASTER, f"not measured to the end: {e}", "measure",
                                 seconds=time.perf_counter() - t0, evidence={"out_of_time": True}))
    except Exception as e:  # noqa: BLE001 - a server that dies or hangs while measured
        srv.close()
        outcome = Outcome.TIMED_OUT if isinstance(e, TimeoutError) else Outcome.CRASHED
        return Evaluated(Verdict(outcome, f"measure: {type(e).__name__}: {e}", "measure",
                                 seconds=time.perf_counter() - t0))
    caught = srv.audit_failure()
    if caught:  # its figures are not the design's: the rest ran on the engine's own kernels
        srv.close()
        return Evaluated(Verdict(Outcome.WRONG, f"a kernel of the design failed the engine's audit while serving: "
                                 f"{caught}", "measure", seconds=time.perf_counter() - t0,
                                 evidence={"kernel_audit": caught, "paths": start.loaded.get("paths")}))
    fit, over = fitness(serving, cfg.ttft_p99_s)
    cont = serving_contention(serving)  # the figures the verdict rests on: the full measurement
    screen_figures, screen_fit = (short.figures, short.fitness) if short else (None, None)
    if start.verdict is not None:  # the baseline, measured although it failed verification
        start.verdict.evidence.update(serving=serving, fitness=fit, paths=start.loaded.get("paths"),
                                      screen=screen_figures, screen_fitness=screen_fit)
        if cont is not None:
            start.verdict.evidence["contention"] = cont
        start.verdict.seconds = time.perf_counter() - t0
        return Evaluated(start.verdict, srv)
    ev = {"serving": serving, "fitness": fit, "screen": screen_figures, "screen_fitness": screen_fit,
          "paths": start.loaded.get("paths"),
          "load_seconds": start.loaded.get("seconds"), "verify": start.verified.get("evidence", {}),
          "verify_detail": start.verified.get("detail", ""), "over_ceiling": over}
    if cont is not None:
        ev["contention"] = cont
    busy = cont is not None and cont["busy"]  # not confirmed: no verdict on its speed (confirm.py)
    return Evaluated(Verdict(Outcome.INCONCLUSIVE if busy else Outcome.NOT_FASTER,
                             busy_detail(cont) if busy else (over or ""), "measure", evidence=ev, cases_checked=3,
                             seconds=time.perf_counter() - t0, baseline="default design"), srv)
