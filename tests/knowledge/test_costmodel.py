"""The cross-problem, cross-machine cost model, scored on recorded measurements.

``benchmarks/data/knob_sweep.jsonl`` holds real harness evaluations of the template problems' knob
spaces (``benchmarks/knob_sweep.py``: build, verification, interleaved timing) on a Zen 4 machine,
as it is and masked to AVX2. Nothing here measures; the figures are what that machine measured.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from swarmfactory.agents.base import Board, Entry
from swarmfactory.agents.model_guided import ModelGuidedAgent
from swarmfactory.knowledge.costmodel import (CostModel, hardware_features, knob_features, problem_features,
                                              relative_targets, rows_from_evidence, spearman_ci)
from swarmfactory.problems import load_problem

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "knob_sweep.jsonl"
NEW = ("layernorm", "add_rmsnorm", "geglu", "q8_0_matmul")   # the problems knowledge must transfer to


@pytest.fixture(scope="module")
def sweep():
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if not r.get("confirm")]   # the sweep's re-measurements of its best: not more rows
    native = [r for r in rows if "mask" not in r["hardware"]]
    masked = [r for r in rows if "mask" in r["hardware"]]
    return {"all": rows, "native": native, "masked": masked}


def _measured(rows, name):
    return [r for r in rows if r["problem"] == name and r["outcome"] in ("faster", "not_faster")]


def test_features_describe_problem_machine_and_knobs(sweep):
    ln, q8 = load_problem("layernorm"), load_problem("q8_0_matmul")
    fl, fq = problem_features(ln), problem_features(q8)
    assert fl["family=norm"] == 1 and fq["family=quantized_matvec"] == 1
    assert fq["quantised"] == 1 and fl["quantised"] == 0
    assert fq["log_intensity"] > fl["log_intensity"] - 1  # both from the rooflines
    zen4 = {"features": ["avx2", "fma", "avx512f", "avx512_vnni"], "cpus": 2, "caches": {"l2": 1024}}
    zen3 = {"features": ["avx2", "fma"], "cpus": 16, "caches": {"l2": 512}}
    h4, h3 = hardware_features(zen4), hardware_features(zen3)
    assert h4["isa:avx512f"] == 1 and "isa:avx512f" not in h3 and h3["isa:avx2"] == 1
    assert (h4["cores"], h3["cores"], h4["log_cache_l2"], h3["log_cache_l2"]) == (2, 16, 10, 9)
    kf = knob_features({"vw": 16, "threads": "omp", "algo": "one_pass"})
    assert kf == {"knob:vw": 4.0, "knob:threads=omp": 1.0, "knob:algo=one_pass": 1.0, "threads_on": 1.0}
    # the vector width counts against the machine's registers: one full register on either machine
    assert knob_features({"vw": 16}, zen4) == knob_features({"vw": 8}, zen3) == {"knob:vw/lanes": 0.0}
    assert knob_features({"vw": 16}, zen3) == {"knob:vw/lanes": 1.0}
    assert knob_features({"vw": 4}, {"features": ["sse4_2"]}) == {"knob:vw/lanes": 0.0}


def test_rows_merge_repeats_and_failures():
    ev = [{"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 4}, "outcome": "faster", "speedup": 2.0},
          {"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 4}, "outcome": "faster", "speedup": 8.0},
          {"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 8}, "outcome": "faster", "speedup": 3.0},
          {"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 8}, "outcome": "wrong", "speedup": None},
          {"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 1}, "outcome": "verified", "speedup": None},
          {"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 16}, "outcome": "faster", "speedup": 1.0},
          {"problem": "no_such_problem", "hardware": {"id": "h"}, "knobs": {"vw": 1}, "outcome": "faster", "speedup": 1.0}]
    rows = relative_targets(rows_from_evidence(ev))
    by = {r.knobs["vw"]: r for r in rows}
    assert set(by) == {4, 8, 16}                               # unmeasured and unknown problems teach nothing
    assert by[4].log_speedup == pytest.approx(math.log(4.0))   # the geometric mean of its repeats
    assert by[4].target == pytest.approx(math.log(2.0))        # against its group's median
    assert by[8].log_speedup is None and by[8].target < by[4].target  # a config that ever failed is a failure
    # a measured row alone in its (problem, machine) group is its own median: it says nothing, and goes;
    # a failure alone says something, and stays
    alone = relative_targets(rows_from_evidence([e for e in ev if e["knobs"]["vw"] != 16]))
    assert {r.knobs["vw"] for r in alone} == {8}


def test_rows_weigh_by_measurement_quality_and_busy_or_inconclusive_ones_teach_nothing():
    busy = {"suffered": 0.4, "busy": True}
    quiet = {"suffered": 0.0, "busy": False}
    ev = [{"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 4}, "outcome": "faster", "speedup": 2.0,
           "ci_low": 1.9, "ci_high": 2.1, "contention": quiet},
          # twice as wide an interval relative to its figure, half the suffered share: less weight
          {"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 4}, "outcome": "faster", "speedup": 8.0,
           "ci_low": 2.0, "ci_high": 14.0, "contention": {"suffered": 0.05, "busy": False}},
          {"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 4}, "outcome": "faster", "speedup": 90.0,
           "ci_low": 80.0, "ci_high": 99.0, "contention": busy},
          {"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 8}, "outcome": "faster", "speedup": 50.0,
           "ci_low": 40.0, "ci_high": 60.0, "contention": busy},
          {"problem": "rmsnorm", "hardware": {"id": "h"}, "knobs": {"vw": 2}, "outcome": "inconclusive",
           "speedup": None, "contention": busy}]
    by = {r.knobs["vw"]: r for r in rows_from_evidence(ev)}
    assert set(by) == {4}  # measured only on a busy machine, or inconclusive: no row at all
    w1, w2 = 1.0 / (1 + 0.2 / 2.0), 0.95 / (1 + 12.0 / 8.0)
    expected = (w1 * math.log(2.0) + w2 * math.log(8.0)) / (w1 + w2)
    assert by[4].log_speedup == pytest.approx(expected) and by[4].weight == pytest.approx(w1)


@pytest.mark.parametrize("target", NEW)
def test_trained_on_other_problems_it_ranks_a_new_problem_better_than_chance(sweep, target):
    """Spearman's rho between predicted and measured speedups of every configuration of a problem
    the model never saw, with a bootstrap 95% CI that must lie above 0."""
    train = relative_targets(rows_from_evidence(r for r in sweep["native"] if r["problem"] != target))
    test = _measured(sweep["native"], target)
    if len(test) < 40:
        pytest.skip(f"the recorded sweep holds {len(test)} measured configurations of {target}")
    model = CostModel(seed=1).fit(train)
    pred, _ = model.predict(load_problem(target), test[0]["hardware"], [r["knobs"] for r in test])
    rho, lo, hi = spearman_ci(pred, [r["speedup"] for r in test], resamples=1000)
    print(f"{target}: Spearman {rho:.2f} [{lo:.2f}, {hi:.2f}] over {len(test)} configurations, "
          f"trained on {len(train)} rows of other problems")
    assert lo > 0, f"{target}: rho {rho:.2f} [{lo:.2f}, {hi:.2f}]"


@pytest.mark.parametrize("target", NEW)
def test_trained_on_another_cpu_it_ranks_the_same_problem_better_than_chance(sweep, target):
    train = relative_targets(rows_from_evidence(r for r in sweep["masked"] if r["problem"] == target))
    test = _measured(sweep["native"], target)
    if len(train) < 20 or len(test) < 40:
        pytest.skip(f"the recorded sweep holds too little of {target} on both machines")
    model = CostModel(seed=1).fit(train)
    pred, _ = model.predict(load_problem(target), test[0]["hardware"], [r["knobs"] for r in test])
    rho, lo, hi = spearman_ci(pred, [r["speedup"] for r in test], resamples=1000)
    print(f"{target}: Spearman {rho:.2f} [{lo:.2f}, {hi:.2f}] trained on {len(train)} AVX2 rows")
    assert lo > 0, f"{target}: rho {rho:.2f} [{lo:.2f}, {hi:.2f}]"


def test_model_guided_proposes_from_transferred_evidence_on_a_cold_problem(sweep):
    """No evaluation of the problem yet: the agent proposes from other problems' evidence, and what
    it proposes measured faster (in the recording) than what a uniform pick gets."""
    target = "layernorm"
    problem = load_problem(target)
    table = {json.dumps(r["knobs"], sort_keys=True): r["speedup"] for r in _measured(sweep["native"], target)}
    transfer = relative_targets(rows_from_evidence(r for r in sweep["native"] if r["problem"] != target))
    hw = sweep["native"][0]["hardware"]
    agent = ModelGuidedAgent()
    cold = Board(problem, [], None, [], random.Random(0), hardware=hw)
    assert agent.propose(cold, 3) == []            # nothing to learn from: it waits
    picked, uniform = [], []
    for seed in range(4):
        board = Board(problem, [], None, [], random.Random(seed), transfer=transfer, hardware=hw)
        props = agent.propose(board, 3)
        assert props and all(p.operator == "cost-model (transferred)" for p in props)
        picked += [table[json.dumps(p.knobs, sort_keys=True)] for p in props]
    rng = random.Random(0)
    uniform = [rng.choice(list(table.values())) for _ in range(2000)]
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
    print(f"model-guided from transfer: geomean {geo(picked):.2f}x vs uniform {geo(uniform):.2f}x")
    assert geo(picked) > geo(uniform)


def test_own_evidence_outweighs_transfer(sweep):
    """With this problem's own evaluations on the board the model follows them: planted own
    evidence that contradicts the transferred rows wins."""
    problem = load_problem("geglu")
    hw = sweep["native"][0]["hardware"]
    transfer = relative_targets(rows_from_evidence(r for r in sweep["native"] if r["problem"] == "swiglu"))
    if len(transfer) < 24:
        pytest.skip("too few recorded swiglu rows")
    base = dict(problem.knob_defaults)
    entries = []
    for i, vw in enumerate([1, 4, 8, 16] * 3):
        knobs = {**base, "vw": vw, "unroll": [1, 2, 4][i % 3]}
        speed = 4.0 if vw == 1 else 0.5   # planted: the narrowest vector wins here
        entries.append(Entry(f"c{i}", knobs, "faster" if speed > 1 else "not_faster", speed, "x", 0))
    board = Board(problem, entries, None, [], random.Random(0), transfer=transfer, hardware=hw)
    props = ModelGuidedAgent(epsilon=0.0).propose(board, 3)
    assert props and all(p.knobs["vw"] == 1 for p in props)
