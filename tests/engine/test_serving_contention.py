"""Serving levels record the contention they were measured under (bench/serving.py): a level on
which other processes took more than ``contention.BUSY`` of the CPUs is measured again and, if
it stays so, kept and marked busy; a tune design measured so is ``inconclusive``. Real CPU hogs,
real /proc readings; the level logic runs without a model, the tune's against the engine's real
server (the session's ``server`` fixture)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from swarmfactory import contention as C
from swarmfactory.bench.serving import (
    ServingMeter,
    busy_warning,
    descendants,
    listening_pids,
    measure_level,
    server_pids,
    worst_contention,
)

KEYS = {"others", "suffered", "steal", "mhz", "attempts", "busy"}


def _hog() -> subprocess.Popen:
    """A process that is not ours as far as the level is concerned: it spins on every CPU we have."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(p.pid, os.sched_getaffinity(0))
    return p


def _idle_level(seconds: float = 0.4):
    """One 'level' that uses next to no CPU itself (the load generator waiting on a server)."""
    calls = []

    def run(attempt: int) -> dict:
        calls.append(attempt)
        time.sleep(seconds)
        return {"concurrency": 4, "output_tok_s": 1.0, "attempt": attempt}

    return run, calls


def _others_now(window_s: float = 1.0) -> float | None:
    m = ServingMeter([])
    a = m.snapshot()
    time.sleep(window_s)
    return m.between(a, m.snapshot()).others


def test_a_level_measured_while_a_hog_runs_is_repeated_then_kept_and_marked_busy():
    run, calls = _idle_level()
    hog = _hog()
    try:
        time.sleep(0.2)
        t0 = time.monotonic()
        res, cont = measure_level(run, ServingMeter([]), repeats=2, wait_s=1.0)
        took = time.monotonic() - t0
    finally:
        hog.kill()
        hog.wait()
    assert set(cont) >= KEYS and res["contention"] is cont
    assert cont["others"] > C.BUSY and cont["busy"] is True
    assert cont["attempts"] == 3 and calls == [0, 1, 2]  # measured twice more, each after a bounded wait
    assert took < 3 * 0.4 + 2 * 1.0 + 2.0
    assert all(isinstance(cont[k], float) for k in ("others", "steal"))
    line = busy_warning([res])
    assert line and "c=4" in line and "3 attempt(s)" in line and "not reliable" in line


def test_the_hog_is_not_others_when_it_is_the_server():
    """Ours: the server's process and its descendants (here the hog is the server's child)."""
    script = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
              "time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        for _ in range(50):
            kids = descendants(parent.pid)
            if kids:
                break
            time.sleep(0.1)
        assert kids, "the server's child did not start"
        run, _ = _idle_level(0.6)
        hogged, _ = measure_level(run, ServingMeter(None), repeats=0, wait_s=0)  # unknown server: not judged
        assert hogged["contention"]["others"] is None and hogged["contention"]["busy"] is False
        _, cont = measure_level(run, ServingMeter([parent.pid]), repeats=0, wait_s=0)
        _, cont_plain = measure_level(run, ServingMeter([]), repeats=0, wait_s=0)
    finally:
        for k in descendants(parent.pid):
            os.kill(k, 9)
        parent.kill()
        parent.wait()
    # the same spinning child: about one CPU's worth more of others when it is not the server's
    assert cont_plain["others"] - cont["others"] > 0.5 / len(os.sched_getaffinity(0))


def test_a_quiet_level_is_measured_once_and_not_busy():
    pressure = C.machine_pressure_avg10()
    others = _others_now()
    if pressure is None or pressure > C.QUIET or others is None or others > C.BUSY / 2:
        pytest.skip(f"the machine is busy now (pressure {pressure}, others {others}): nothing to assert")
    run, calls = _idle_level()
    res, cont = measure_level(run, ServingMeter([]), repeats=2, wait_s=1.0)
    if cont["others"] > C.BUSY:  # something started meanwhile: it was repeated as it should be
        assert cont["attempts"] > 1
        return
    assert cont["busy"] is False and cont["attempts"] == 1 and calls == [0]
    assert busy_warning([res]) is None


def test_a_repeat_that_fails_keeps_the_measured_attempt_and_a_first_failure_carries_its_contention():
    hog = _hog()
    try:
        def flaky(attempt):
            if attempt:
                raise TimeoutError("the repeat ran out of time")
            time.sleep(0.3)
            return {"concurrency": 2}

        res, cont = measure_level(flaky, ServingMeter([]), repeats=2, wait_s=0, keep_on=(TimeoutError,))
        assert cont["busy"] and cont["attempts"] == 2 and res["concurrency"] == 2

        def broken(attempt):
            time.sleep(0.3)
            raise RuntimeError("the server died")

        with pytest.raises(RuntimeError) as e:
            measure_level(broken, ServingMeter([]), repeats=2, wait_s=0, keep_on=(TimeoutError,))
        assert e.value.contention["others"] > C.BUSY and e.value.contention["attempts"] == 1
    finally:
        hog.kill()
        hog.wait()


def test_no_repeat_past_the_deadline():
    hog = _hog()
    try:
        run, calls = _idle_level(0.3)
        _, cont = measure_level(run, ServingMeter([]), repeats=2, wait_s=1.0, deadline=time.monotonic() + 0.5)
    finally:
        hog.kill()
        hog.wait()
    assert calls == [0] and cont["busy"] and cont["attempts"] == 1


def test_worst_contention_is_what_a_verdict_records():
    from swarmfactory.evidence.quality import busy

    quiet = {"concurrency": 1, "contention": {"others": 0.02, "suffered": 0.3, "steal": 0.0, "mhz": None,
                                              "attempts": 1, "busy": False}}
    loud = {"concurrency": 16, "contention": {"others": 0.4, "suffered": 0.5, "steal": 0.0, "mhz": None,
                                              "attempts": 3, "busy": True}}
    w = worst_contention([quiet, loud])
    assert w["suffered"] == w["others"] == 0.4 and w["busy"] and w["busy_levels"] == [16] and busy(w)
    w = worst_contention([quiet])
    assert w["suffered"] == 0.02 and not w["busy"] and not busy(w)  # PSI 30%: the engine's own threads
    assert worst_contention([{"concurrency": 1}]) is None


def test_a_local_url_finds_its_server_and_a_remote_one_has_none(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listening_pids(port) == [os.getpid()]
        assert server_pids(f"http://127.0.0.1:{port}") == [os.getpid()]
    assert server_pids(f"http://127.0.0.1:{port}") is None  # nobody of ours listens there now
    assert server_pids("http://192.0.2.1:8000") == []  # TEST-NET-1: not this machine


# -- engine tune: a design measured on a busy machine ------------------------------------------------
def test_a_design_measured_on_a_busy_machine_is_inconclusive_and_never_the_profile(server, tmp_path, monkeypatch):
    """The engine's real server (the session's), measured by the tune's own code while a hog spins:
    every level stays busy through its repeats, so the design's verdict is ``inconclusive`` with
    the contention in its evidence, it is not crowned, not learnt from, and a later tune measures
    it again. (The design's own process is stubbed: the session's server stands in for it.)"""
    import swarmfactory.bench.serving as S
    import swarmfactory.enginefactory.tune as T
    from swarmfactory.enginefactory import design as D
    from swarmfactory.enginefactory.measure import Entry
    from swarmfactory.enginefactory.runner import Start
    from swarmfactory.enginefactory.server import DesignServer
    from swarmfactory.evidence.quality import busy
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Outcome

    class Stand(DesignServer):  # the session's server, measured by DesignServer.measure; never killed
        def __init__(self):
            self.url, self.proc = server.url, server.proc

        def close(self):
            pass

    class StandIn:  # the runner: every design started is the session's server
        def open(self, model_path, deadline, log):
            pass

        def start(self, config, serve_anyway=False):
            return Start(Stand(), None, {"paths": {}}, {})

        def close(self):
            pass

    monkeypatch.setattr(S, "QUIET_WAIT_S", 0.5)
    store = Store(str(tmp_path / "e.db"))
    cfg = T.TuneConfig(workloads=((16, 8),), concurrency=(1, 2), screen=None)
    tuner = T.Tuner(cfg, store, runner=StandIn())
    tuner.run_id = store.create_run({"kind": "engine-tune", **cfg.to_dict()})
    tuner.deadline = time.monotonic() + 600
    tuner.default = tuner.champion = Entry(D.build({}, tuner.base), 1.0, 1e-3)  # any design "beats" it
    design = tuner.problem.build({"native_decode": 0, "dense": "none", "attention": "exact", "max_batch": 16})
    hog = _hog()
    try:
        time.sleep(0.2)
        result = tuner._evaluate(design, "test")
        verdict, srv = result.verdict, result.served
    finally:
        hog.kill()
        hog.wait()
    assert srv is not None and verdict.outcome is Outcome.INCONCLUSIVE, (verdict.outcome, verdict.detail)
    levels = verdict.evidence["serving"]["16x8"]
    assert [lv["contention"]["attempts"] for lv in levels] == [3, 3] and all(lv["contention"]["busy"] for lv in levels)
    cont = verdict.evidence["contention"]
    assert cont["busy"] and cont["suffered"] > C.BUSY and busy(verdict.evidence)
    assert "measured on a busy machine" in verdict.detail

    entry, crowned = tuner.confirmation.judge(design, verdict, srv, default=tuner.default, champion=tuner.champion,
                                              deadline=tuner.deadline, note="test")
    assert not crowned and verdict.outcome is Outcome.INCONCLUSIVE  # no confirmation round, no champion
    tuner._pending = {design.key: (entry, crowned, "test")}
    tuner.complete((design, "knobs", []), verdict)
    assert tuner.inconclusive == 1 and tuner.champion is tuner.default and design.key not in [
        e.design.key for e in tuner.entries]
    assert store.champion(tuner.problem) is None
    assert tuner.busy_summary().startswith("1 design(s) inconclusive because the machine was busy")
    (row,) = [e for e in store.evaluations(problem=tuner.problem.name) if e.candidate_id == design.key]
    assert row.outcome == "inconclusive" and row.evidence["contention"]["busy"] is True

    later = T.Tuner(cfg, store)  # another run: the design is measured again, and is no entry meanwhile
    later.run_id = "another"
    later._prior()
    assert design.key not in later.seen and all(e.design.key != design.key for e in later.entries)
    tuner._prior()  # the same run resumed: its answer stands
    assert design.key in tuner.seen
