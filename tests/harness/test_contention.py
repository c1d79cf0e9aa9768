"""Contention is measured, recorded and acted on: a timing the machine disturbed is never a
figure (real CPU hogs, real PSI; skipped where the kernel has no pressure information)."""

import os
import time

import pytest

from swarmfactory import contention
from swarmfactory.harness.evaluate import Harness, HarnessConfig
from swarmfactory.outcome import Outcome
from swarmfactory.problems import load_problem

needs_psi = pytest.mark.skipif(not contention.pressure_available(),
                               reason="no CPU pressure information (PSI) on this kernel")


def test_a_reading_is_shares_of_the_window():
    m = contention.Meter(sorted(os.sched_getaffinity(0)), ours=lambda: [os.getpid()])
    a = m.snapshot()
    t = time.perf_counter()
    while time.perf_counter() - t < 0.2:
        pass
    r = m.between(a, m.snapshot())
    assert 0.15 < r.seconds < 5
    for v in (r.suffered, r.others, r.steal):
        assert v is None or 0.0 <= v <= 1.0
    assert set(r.as_dict()) == {"seconds", "suffered", "others", "steal", "mhz"}


@needs_psi
def test_a_measurement_taken_while_cpu_hogs_run_gives_no_figure(monkeypatch, cpu_hogs):
    """Two busy loops on the measurement CPU: the candidate waits for it, so the rounds are
    disturbed and the verdict is `inconclusive`, with its contention, never a speedup. (One round
    in seven read clean in two full suites on a 2-vCPU VM, 2026-12-05: the verdict still gave no
    figure, which is what this test is about.)"""
    from swarmfactory.harness import rounds

    monkeypatch.setattr(rounds, "WAIT_TOTAL_S", 2.0)  # the hogs never stop: do not wait for them long
    cpus = sorted(os.sched_getaffinity(0))
    measure, verify = cpus[:1], (cpus[1:] or cpus[:1])
    h = Harness(HarnessConfig(rounds=4, compile_baselines=False, case_timeout_s=5.0,
                              measure_cpus=tuple(measure), verify_cpus=tuple(verify)))
    p = load_problem("rmsnorm")
    try:
        prep = h.prepare(p, p.render())
        assert prep.rejected is None, prep.rejected
        with cpu_hogs(measure[0], 2):
            v = h.measure(prep)
    finally:
        h.close()
    c = v.evidence["contention"]
    assert v.outcome is Outcome.INCONCLUSIVE, v.detail
    assert v.speedup is None and c["busy"] and c["disturbed_rounds"] >= max(4, c["rounds"] - 1)
    assert c["worst"] > contention.BUSY


def test_every_measured_verdict_records_the_contention_it_was_taken_under(harness):
    p = load_problem("rmsnorm")
    v = harness.evaluate(p, p.render())
    assert v.outcome in (Outcome.FASTER, Outcome.NOT_FASTER, Outcome.INCONCLUSIVE), v.detail
    c = v.evidence["contention"]
    assert {"suffered", "worst", "rounds", "disturbed_rounds", "waited_s", "busy", "source"} <= set(c)
    assert c["rounds"] >= 8 and 0.0 <= c["suffered"] <= 1.0
    # each baseline says how it was timed: a Python call with its dispatch, or the engine's own C in a C loop
    assert all("dispatch included" in b or "C loop" in b for b in v.evidence["basis"]["baseline"].split("; "))


def _measured_with_setups(p, store):
    """The template's verdict on ``p`` (6 rounds, eager baselines), with each shape's setup."""
    h = Harness(HarnessConfig(rounds=6, compile_baselines=False, case_timeout_s=5.0), store=store)
    try:
        prep = h.prepare(p, p.render())
        assert prep.rejected is None, prep.rejected
        setups = []
        real = h._setup_shape
        h._setup_shape = lambda *a, **k: setups.append(real(*a, **k)) or setups[-1]
        return h.measure(prep), setups
    finally:
        h.close()


def test_a_yardstick_that_stalls_on_a_team_of_threads_is_timed_on_one_thread_too(tmp_path):
    """A multi-threaded baseline that stalls (here: 2 ms a call whenever it runs on more than one
    thread, recorded as chosen at 2 threads, as if it were fast then) is timed on one thread too in
    every round, and the faster of the two is the yardstick: no shape's baseline shows the stall,
    so the candidate's speedup is over what one thread of the same code does."""
    from pathlib import Path

    from swarmfactory.evidence.store import Store
    from swarmfactory.harness.rounds import SINGLE

    p = load_problem(str(Path(__file__).parent / "data" / "stalling_yardstick.py"))
    name = next(iter(p.baselines))
    store = Store(str(tmp_path / "evidence.db"))
    for shape in p.workload:  # chosen at two threads (as a quiet machine might have measured it)
        store.put_baseline(p, shape, False, {"name": name, "mode": "eager", "threads": 2, "us": 5.0,
                                             "native": False})
    v, setups = _measured_with_setups(p, store)
    assert v.outcome in (Outcome.FASTER, Outcome.NOT_FASTER, Outcome.INCONCLUSIVE), v.detail
    if v.speedup is not None:
        # no shape's yardstick shows the stall: each is one thread of F.rms_norm (tens of us at most)
        assert all(t.baseline_us < 500 for t in v.shapes), [t.baseline_us for t in v.shapes]
    # ... though the team's rounds did stall (the two-thread runner took the 2 ms every call)
    assert setups and all(SINGLE in s["workers"] for s in setups)
    assert all(min(s["times"]["baseline"]) >= 1.5e6 for s in setups)
    if v.speedup is not None:
        assert "the same on 1 thread" in v.evidence["basis"]["baseline"]
        for rounds in v.evidence["basis"]["one_thread_faster"].values():   # "k of n rounds": every one
            k, n = rounds.removesuffix(" rounds").split(" of ")
            assert k == n, v.evidence["basis"]["one_thread_faster"]


def test_a_chosen_baseline_that_is_slow_in_the_rounds_is_not_the_yardstick_its_rival_is(tmp_path):
    """A baseline chosen from a few warm samples can be the slower of two close contenders once the
    inputs rotate (measured: a dequantise-then-matmul chosen at 262 us read 504 us in the rounds,
    where the engine's kernel it had beaten held its figure). Recorded as chosen (5 us) beside a
    rival within reach (6 us), the one that waits 300 us a call is timed with its rival in every
    round, and the rival is every round's yardstick: no shape's baseline shows the wait."""
    from pathlib import Path

    import numpy as np

    from swarmfactory.evidence.store import Store
    from swarmfactory.harness.rounds import RIVAL

    p = load_problem(str(Path(__file__).parent / "data" / "rivalled_yardstick.py"))
    store = Store(str(tmp_path / "evidence.db"))
    slow, plain = "slow when it counts", "F.rms_norm"
    for shape in p.workload:  # as a quiet machine with warm caches might have recorded it
        store.put_baseline(p, shape, False, {
            "name": slow, "mode": "eager", "threads": 1, "us": 5.0, "native": False,
            "all": [{"name": slow, "mode": "eager", "threads": 1, "us": 5.0, "within_tolerance": True, "native": False},
                    {"name": plain, "mode": "eager", "threads": 1, "us": 6.0, "within_tolerance": True,
                     "native": False}]})
    v, setups = _measured_with_setups(p, store)
    assert v.outcome in (Outcome.FASTER, Outcome.NOT_FASTER, Outcome.INCONCLUSIVE), v.detail
    # the chosen one did wait in every round, its rival was timed beside it
    assert setups and all(f"{RIVAL}1" in s["workers"] for s in setups)
    assert all(min(s["times"]["baseline"]) >= 250e3 for s in setups)
    # and every yardstick runner's sample is sized to last as long as the candidate's (not a third
    # as long: the first calls after the other contender ran find cold caches). Sized from the
    # fastest of three loops; a shared machine still moves a call's time by a third between the
    # sizing and the rounds (measured: F.rms_norm 14.1 us a call when sized, 10.2 us in the rounds),
    # so the check is against the old fault's third, not an exact length
    for s in setups:
        assert s["mode"] == "async"
        for name in ("baseline", f"{RIVAL}1"):
            lasted = s["iters"][name] * float(np.median(s["times"][name]))
            assert lasted >= 0.6 * s["window_s"] * 1.25e9, (name, lasted, s["window_s"])
    if v.speedup is not None:
        assert all(t.baseline_us < 200 for t in v.shapes), [t.baseline_us for t in v.shapes]
        assert "its rival F.rms_norm" in v.evidence["basis"]["baseline"], v.evidence["basis"]
        clean = v.evidence["contention"]["rounds"] - v.evidence["contention"]["disturbed_rounds"]
        for wins in v.evidence["basis"]["yardstick_rounds"].values():  # clean rounds each runner was fastest in
            assert wins == {f"{slow} (eager, 1 threads)": 0, f"{plain} (eager, 1 threads)": clean}, wins
        assert "or F.rms_norm" in v.baseline, v.baseline
