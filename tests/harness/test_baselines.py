"""Baselines run as a user runs them: default environment, their best thread count, frozen
while another contender is timed."""

import os
from pathlib import Path

from swarmfactory.harness.baselines import BaselinePool, thread_counts
from swarmfactory.harness.sandbox import Worker, worker_env
from swarmfactory.problems import load_problem


def test_the_trusted_environment_sets_no_openmp_policy_or_thread_count(monkeypatch, tmp_path):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # even if the coordinator has one
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    env = worker_env(str(tmp_path))
    assert "OMP_WAIT_POLICY" not in env and "OMP_NUM_THREADS" not in env
    assert "OPENAI_API_KEY" not in env


def test_thread_counts_cover_one_powers_of_two_and_all():
    assert thread_counts(1) == [1]
    assert thread_counts(2) == [1, 2]
    assert thread_counts(6) == [1, 2, 4, 6]
    # a problem whose kernel runs once per thread of its user (Problem.baseline_threads)
    assert thread_counts(6, 1) == [1] and thread_counts(6, 4) == [1, 2, 4]


def test_a_problem_called_per_thread_times_its_baselines_on_one_thread():
    from swarmfactory.problems import load_problem

    p = load_problem("q8_0_engine_matmul")
    assert p.baseline_threads == 1
    assert load_problem("q8_0_matmul").baseline_threads is None


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_frozen_worker_is_stopped_and_a_request_thaws_it():
    with Worker(trusted=True) as w:
        w.freeze()
        assert _state(w.proc.pid) == "T"
        w.thaw()
        assert _state(w.proc.pid) != "T"


def test_the_chosen_baseline_records_its_settings():
    p = load_problem("rmsnorm")
    pool = BaselinePool(sorted(os.sched_getaffinity(0)))
    try:
        record = pool.choose(p, p.workload[0], compile_too=False, samples=2)
    finally:
        pool.close()
    assert record["threads"] in thread_counts(len(os.sched_getaffinity(0)))
    assert "default" in record["environment"]
    assert {r["threads"] for r in record["all"]} == set(thread_counts(len(os.sched_getaffinity(0))))


def test_the_engines_own_element_op_is_a_yardstick_timed_in_a_c_loop():
    """rmsnorm's second baseline is the engine's block-step code (engine/native/element_ops.py):
    timed at every thread count through its C loop (no Python dispatch), with no torch.compile
    form, and marked native in the record; torch's is not."""
    from swarmfactory.harness.evaluate import _baseline_label
    from swarmfactory.problems.spec import lower_precision

    p = load_problem("rmsnorm")
    assert "engine_block_step_approx" in p.baselines and lower_precision("engine_block_step_approx")
    pool = BaselinePool(sorted(os.sched_getaffinity(0)))
    try:
        record = pool.choose(p, p.workload[0], compile_too=True, samples=2)
    finally:
        pool.close()
    engine = [r for r in record["all"] if r["name"] == "engine_block_step_approx"]
    timed = [r for r in engine if "us" in r]
    assert {r["threads"] for r in timed} == set(thread_counts(len(os.sched_getaffinity(0))))
    assert all(r["mode"] == "eager" and r["native"] and r["within_tolerance"] for r in timed)
    assert all("no torch.compile form" in r["error"] for r in engine if r["mode"] == "compile")
    assert all(not r["native"] for r in record["all"] if r["name"] == "F.rms_norm" and "us" in r)
    if record["name"] == "engine_block_step_approx":
        assert record["native"] and "C loop" in _baseline_label(record)


def test_one_worker_serves_a_baseline_at_every_thread_count_and_the_pool_keeps_its_budget():
    cpus = sorted(os.sched_getaffinity(0))
    pool = BaselinePool(cpus, max_workers=2)
    try:
        seen = []
        for name in ("rmsnorm", "softmax", "swiglu"):
            p = load_problem(name)
            pool.hold_none()  # a new measurement
            record = pool.choose(p, p.workload[0], compile_too=False, samples=1)
            # every thread count was timed, in one worker per baseline
            assert {r["threads"] for r in record["all"] if "us" in r} == set(thread_counts(len(cpus)))
            assert sum(1 for k in pool.workers if k[0] == name) == len(p.baselines)
            seen.append(len(pool.workers))
            assert len(pool.workers) <= max(2, len(p.baselines))
        assert pool.evicted >= 1
        assert pool.peak["workers"] <= 2  # the least recently used is closed before one starts
        # an evicted problem's baseline starts again when needed, and answers
        p = load_problem("rmsnorm")
        pool.hold_none()
        assert pool.choose(p, p.workload[0], compile_too=False, samples=1)["us"] > 0
    finally:
        pool.close()
    assert pool.workers == {}


def test_a_measurement_that_ends_over_the_byte_budget_gives_workers_back_at_once():
    """A worker grows while it measures, past what its admission counted: when the measurement
    ends (``release``), the pool closes the least recently used workers until it is within its
    byte budget again, not at the next admission."""
    cpus = sorted(os.sched_getaffinity(0))
    pool = BaselinePool(cpus, max_workers=8)
    try:
        for name in ("rmsnorm", "softmax"):
            p = load_problem(name)
            pool.hold_none()
            pool.choose(p, p.workload[0], compile_too=False, samples=1)
        held = pool.resident()
        assert len(pool.workers) >= 2 and held > 0
        pool.max_bytes = held // 2  # the machine's budget, smaller than what the pool now holds
        pool.release()
        assert pool.resident() <= pool.max_bytes
        assert pool.evicted >= 1
        pool.max_bytes = 1  # nothing fits: every worker not held is closed
        pool.release()
        assert pool.workers == {}
    finally:
        pool.close()


def test_the_rivals_of_a_choice_are_the_close_contenders_and_always_the_engines_own_kernel():
    from swarmfactory.harness.baselines import rivals

    def r(name, mode, threads, us, native=False, ok=True):
        return {"name": name, "mode": mode, "threads": threads, "us": us, "within_tolerance": ok, "native": native}

    everything = [r("torch", "eager", 2, 100.0), r("torch", "eager", 1, 150.0), r("torch", "compile", 2, 190.0),
                  r("torch", "compile", 1, 180.0), r("engine", "eager", 1, 900.0, native=True),
                  r("other", "eager", 1, 120.0, ok=False), r("far", "eager", 1, 250.0),
                  {"name": "broken", "mode": "eager", "threads": 1, "error": "no"}]
    choice = {"name": "torch", "mode": "eager", "threads": 2, "us": 100.0, "all": everything}
    got = rivals(choice)
    # the engine's own kernel first, however slow it was when chosen; then the fastest close one,
    # each other baseline or mode at its fastest thread count; never the chosen one's own runners,
    # one out of tolerance, one twice as slow, one that failed
    assert [(x["name"], x["mode"], x["threads"]) for x in got] == [("engine", "eager", 1), ("torch", "compile", 1)]
    assert rivals(choice, most=1) == got[:1]
    assert rivals({"name": "torch", "mode": "eager", "threads": 1, "us": 5.0}) == []  # a record without "all"
