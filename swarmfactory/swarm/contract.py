"""The one loop of the swarm, and the small contract a factory gives it.

Both factories run on ``drive``: the kernel factory (``swarm/coordinator.py``: kernels that agents
propose, verified and timed by the harness, many in flight) and the engine factory
(``enginefactory/tune.py``: engine designs verified end to end and measured over HTTP, one at a
time). A factory says what to try next, what makes two proposals the same, how one is evaluated
and what its verdict changes; the loop owns the rest: deduplication, the budget and the
deadline, the evaluations in flight, when to wait and when the run is over.

``Factory``:

- ``propose()``: the next proposal, or None when there is none right now. It may consult
  ``fresh(p)`` to skip what was tried; the loop checks it again either way and ``mark``s what it
  submits, so a duplicate is never evaluated twice in a run (``seen`` starts with what the store
  already holds).
- ``key(p)``: the dedupe key. Two proposals with one key are one candidate; ``fresh``/``mark``
  keep the keys seen (a factory may keep them its own way, or exempt a proposal it must
  evaluate whatever was seen).
- ``submit(p)``: start its evaluation: a ``Future`` of its ``Verdict`` (an evaluation done in
  place returns a finished one, ``done_future``), or None when it is not to be evaluated after
  all (another coordinator holds it).
- ``complete(p, verdict)``: record the verdict and act on it (champions, rewards, adversary).
- ``thinking()``: proposals may still arrive though ``propose`` had none (an LLM is answering).
- ``finished()``: nothing will ever be proposed again (the space is exhausted, or the factory
  decided the time left is too short for another evaluation).
- ``expected_seconds()``: how long the next evaluation is expected to take, None while unknown.
  With a deadline the loop starts an evaluation only where it is expected to end by then (the
  first one of a call always starts), and while the duration is unknown it keeps one evaluation
  in flight: a run given 83 s on a problem whose evaluations take five minutes ran two of them
  side by side for 11 minutes.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Callable

from swarmfactory.outcome import Outcome, Verdict

log = logging.getLogger(__name__)

MAX_IDLE_TURNS = 50  # consecutive proposals asked for and none given (nobody thinking): the run is done


class Factory:
    """A factory the loop drives (see the module docstring). Subclasses set ``seen``."""

    seen: set[str]
    duplicates: int = 0

    def key(self, proposal: Any) -> str:
        raise NotImplementedError

    def fresh(self, proposal: Any) -> bool:
        return self.key(proposal) not in self.seen

    def mark(self, proposal: Any) -> None:
        self.seen.add(self.key(proposal))

    def propose(self) -> Any | None:
        raise NotImplementedError

    def submit(self, proposal: Any) -> Future | None:
        raise NotImplementedError

    def complete(self, proposal: Any, verdict: Verdict) -> None:
        raise NotImplementedError

    def thinking(self) -> bool:
        return False

    def finished(self) -> bool:
        return False

    def expected_seconds(self) -> float | None:
        return None


def done_future(verdict: Verdict) -> Future:
    """A finished Future holding ``verdict``: for an evaluation done inside ``submit``."""
    fut: Future = Future()
    fut.set_result(verdict)
    return fut


def result(fut: Future) -> Verdict:
    """The Future's verdict; an exception (an executor's or harness's bug) becomes a crash verdict
    so that it costs that candidate, not the run."""
    try:
        return fut.result()
    except Exception as exc:  # noqa: BLE001
        return Verdict(Outcome.CRASHED, f"harness error: {type(exc).__name__}: {exc}", "harness")


def drive(factory: Factory, *, parallel: int = 1, budget: int | None = None, deadline: float | None = None,
          done: int = 0, on_progress: Callable[[int], None] | None = None,
          max_idle: int = MAX_IDLE_TURNS) -> int:
    """Run ``factory`` until its budget (evaluations, ``done`` counted already), its deadline
    (``time.monotonic()``) or its proposals run out, with up to ``parallel`` evaluations in
    flight. Returns the evaluations completed, ``done`` included."""
    in_flight: dict[Future, Any] = {}
    idle = started = 0
    said = False

    def room() -> bool:
        nonlocal said
        if budget is not None and done + len(in_flight) >= budget:
            return False
        if deadline is None:
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        if not started:
            return True  # the first evaluation of a call always starts
        est = factory.expected_seconds()
        if est is None:
            return not in_flight  # unknown: one at a time until one has ended
        if now + est <= deadline:
            return True
        if not said and not in_flight:
            said = True
            log.info("stopping %.0f s before the deadline: an evaluation takes about %.0f s here",
                     deadline - now, est)
        return False

    while True:
        while len(in_flight) < parallel and room():
            prop = factory.propose()
            if prop is None:
                idle += 1
                break
            idle = 0
            if not factory.fresh(prop):
                factory.duplicates += 1
                continue
            factory.mark(prop)
            fut = factory.submit(prop)
            if fut is not None:
                in_flight[fut] = prop
                started += 1
        if not in_flight and ((idle > max_idle and not factory.thinking()) or factory.finished() or not room()):
            return done
        if not in_flight:
            time.sleep(0.2)  # agents are thinking (or have nothing): do not spin
            continue
        finished, _ = wait(list(in_flight), timeout=1.0, return_when=FIRST_COMPLETED)
        for fut in finished:
            prop = in_flight.pop(fut)
            factory.complete(prop, result(fut))
            done += 1
        if on_progress is not None:
            on_progress(done)
