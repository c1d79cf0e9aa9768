"""The swarm's one loop (swarm/contract.py) on a factory of integers: what the kernel factory's
coordinator and the engine factory's tuner both rely on (their own tests run them end to end).

A proposal is an integer, its dedupe key its value modulo ``mod`` (so distinct proposals can be
one candidate); its evaluation squares it, on a thread pool or in place.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from swarmfactory.enginefactory.tune import Tuner
from swarmfactory.outcome import Outcome, Verdict
from swarmfactory.swarm.contract import Factory, done_future, drive
from swarmfactory.swarm.coordinator import Coordinator


class Numbers(Factory):
    def __init__(self, proposals, mod=1000, pool=None, delay=0.0, fail=(), refuse=()):
        self.queue = list(proposals)
        self.mod, self.pool, self.delay = mod, pool, delay
        self.fail, self.refuse = set(fail), set(refuse)
        self.seen: set[str] = set()
        self.submitted: list[int] = []
        self.completed: dict[int, Verdict] = {}
        self.busy_until = 0.0
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()

    def key(self, p):
        return str(p % self.mod)

    def propose(self):
        return self.queue.pop(0) if self.queue else None

    def _eval(self, p):
        time.sleep(self.delay)
        if p in self.fail:
            raise RuntimeError(f"evaluator bug on {p}")
        return Verdict(Outcome.VERIFIED, str(p * p), "verify")

    def submit(self, p):
        if p in self.refuse:  # e.g. another coordinator holds it
            return None
        self.submitted.append(p)
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return self.pool.submit(self._eval, p) if self.pool else done_future(self._eval(p))

    def complete(self, p, verdict):
        with self.lock:
            self.in_flight -= 1
        self.completed[p] = verdict

    def thinking(self):
        return time.monotonic() < self.busy_until


def test_each_key_is_evaluated_once_and_duplicates_are_counted():
    f = Numbers([1, 2, 1001, 3, 2, 4], mod=1000)
    f.seen.add("4")  # in the store already
    assert drive(f) == 3
    assert f.submitted == [1, 2, 3] and f.duplicates == 3
    assert {p: v.detail for p, v in f.completed.items()} == {1: "1", 2: "4", 3: "9"}


def test_budget_counts_what_was_done_before_and_what_is_in_flight():
    with ThreadPoolExecutor(4) as pool:
        f = Numbers(range(20), pool=pool, delay=0.05)
        assert drive(f, parallel=4, budget=7, done=2) == 7  # five more
    assert len(f.submitted) == 5 and len(f.completed) == 5 and 1 < f.max_in_flight <= 4


def test_deadline_stops_new_work_and_waits_for_what_is_in_flight():
    with ThreadPoolExecutor(2) as pool:
        f = Numbers(range(1000), pool=pool, delay=0.05)
        t0 = time.monotonic()
        drive(f, parallel=2, deadline=time.monotonic() + 0.3)
    assert time.monotonic() - t0 < 2.0
    assert set(f.completed) == set(f.submitted) and 2 <= len(f.completed) < 30


def test_with_a_deadline_an_evaluation_starts_only_where_it_is_expected_to_end_in_time():
    """While no evaluation has ended its duration is unknown: one at a time. Then one starts only
    where now + its expected seconds is within the deadline, so the run ends before it, not an
    evaluation (five minutes for a K-quant matmul) past it."""
    class Timed(Numbers):
        def expected_seconds(self):
            return self.delay if self.completed else None

        def submit(self, p):
            self.at.append((time.monotonic(), len(self.completed)))
            return super().submit(p)

    with ThreadPoolExecutor(2) as pool:
        f = Timed(range(100), pool=pool, delay=0.5)
        f.at = []
        deadline = time.monotonic() + 1.3
        drive(f, parallel=2, deadline=deadline)
    assert f.at[0][1] == 0 and all(done >= 1 for _, done in f.at[1:])  # the second waited for the first
    assert all(t + f.delay <= deadline for t, _ in f.at[1:])
    assert 1 <= len(f.completed) <= 3 and set(f.completed) == set(f.submitted)  # without the estimate: 6


def test_an_evaluator_exception_is_that_candidates_crash_and_refused_ones_are_skipped():
    with ThreadPoolExecutor(2) as pool:
        f = Numbers([1, 2, 3, 4], pool=pool, fail={2}, refuse={3})
        assert drive(f, parallel=2) == 3
    assert f.completed[2].outcome == Outcome.CRASHED and "evaluator bug on 2" in f.completed[2].detail
    assert 3 not in f.completed and f.completed[4].detail == "16"


def test_the_loop_waits_while_proposals_may_still_come_then_ends_idle():
    f = Numbers([])
    f.busy_until = time.monotonic() + 0.6

    def later():
        time.sleep(0.3)
        f.queue.append(5)

    threading.Thread(target=later).start()
    t0 = time.monotonic()
    assert drive(f, max_idle=3) == 1 and f.completed[5].detail == "25"
    assert time.monotonic() - t0 >= 0.3


def test_a_finished_factory_ends_the_loop_at_once():
    class Done(Numbers):
        def finished(self):
            return not self.queue

    t0 = time.monotonic()
    assert drive(Done([1])) == 1 and time.monotonic() - t0 < 0.5


@pytest.mark.parametrize("cls", [Coordinator, Tuner])
def test_both_factories_run_on_the_one_loop(cls):
    assert issubclass(cls, Factory)
    for name in ("key", "propose", "submit", "complete"):
        assert getattr(cls, name) is not getattr(Factory, name), (cls.__name__, name)
