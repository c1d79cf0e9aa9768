"""From rounds to verdicts: the objective, per-shape significance, the basis, and no figure
from a busy machine (harness/verdicts.py, driven with planted timings: no hardware needed)."""

from dataclasses import replace

import numpy as np
import pytest

from swarmfactory.harness.evaluate import HarnessConfig
from swarmfactory.outcome import Outcome
from swarmfactory.harness.rounds import RoundsLog
from swarmfactory.harness.timing import median_ci
from swarmfactory.harness.verdicts import BETWEEN_FLOOR, between_spread, decide, min_clean_rounds, widen
from swarmfactory.problems import load_problem


class _Group:
    n = 2


def setups_for(problem, speedups, rounds=20, noise=0.02, seed=0, dispatch_ns=None, baseline_us=10.0):
    rng = np.random.default_rng(seed)
    out = []
    for shape, speedup in zip(problem.workload, speedups):
        b = baseline_us * 1e3 * (1 + noise * rng.standard_normal(rounds))
        c = b / speedup * (1 + noise * rng.standard_normal(rounds))
        out.append({"shape": dict(shape), "mode": "async", "group": _Group(), "choice": {"name": "torch", "mode": "eager"},
                    "dispatch": {"baseline": dispatch_ns},
                    "times": {"candidate": list(c), "baseline": list(b), "reference": list(b * 2)}})
    return out


def verdict(problem, speedups, objective="weighted", clean=None, rounds=20, between=None, **kw):
    log = RoundsLog(planned=rounds, run=rounds, clean=list(range(rounds)) if clean is None else clean,
                    suffered=[{"candidate": 0.0, "baseline": 0.0}] * rounds)
    cfg = HarnessConfig(rounds=rounds, objective=objective)
    return decide(problem, setups_for(problem, speedups, rounds, **kw), log, None, cfg,
                  lambda s: str(sorted(s.items())), lambda c: c["name"], between=between)


@pytest.fixture
def rmsnorm():
    return replace(load_problem("rmsnorm"), roofline=None)


def test_a_kernel_slower_on_one_shape_is_not_faster_under_weighted_or_worst(rmsnorm):
    fast_but_one = (20.0, 20.0, 0.9)
    v = verdict(rmsnorm, fast_but_one, "geomean")
    assert v.outcome is Outcome.FASTER and any("rows=128" in f for f in v.flags), (v.detail, v.flags)
    v = verdict(rmsnorm, fast_but_one, "weighted")
    assert v.outcome is Outcome.NOT_FASTER and "rows=128" in v.detail and "slower" in v.detail, v.detail
    assert v.evidence["slower_shapes"] and v.evidence["objective"] == "weighted"
    v = verdict(rmsnorm, fast_but_one, "worst")
    assert v.outcome is Outcome.NOT_FASTER and v.speedup < 1.0


def test_faster_on_every_shape_is_faster_under_every_objective(rmsnorm):
    for objective in ("weighted", "geomean", "worst"):
        v = verdict(rmsnorm, (1.5, 2.0, 1.3), objective)
        assert v.outcome is Outcome.FASTER, (objective, v.detail)


def test_workload_weights_set_the_objective(rmsnorm):
    heavy_last = replace(rmsnorm, workload_weights=(0.05, 0.05, 0.9))
    v = verdict(heavy_last, (3.0, 3.0, 1.1), noise=0.0)
    assert v.speedup == pytest.approx(np.exp(0.05 * np.log(3) * 2 + 0.9 * np.log(1.1)), rel=1e-6)
    assert verdict(rmsnorm, (3.0, 3.0, 1.1), noise=0.0).speedup == pytest.approx((9 * 1.1) ** (1 / 3), rel=1e-6)


def test_too_few_clean_rounds_give_no_figure(rmsnorm):
    needed = min_clean_rounds(20)
    v = verdict(rmsnorm, (2.0, 2.0, 2.0), clean=list(range(needed - 1)))
    assert v.outcome is Outcome.INCONCLUSIVE and v.speedup is None
    assert v.evidence["contention"]["busy"] is True and "too busy" in v.detail
    v = verdict(rmsnorm, (2.0, 2.0, 2.0), clean=list(range(needed)))
    assert v.outcome is Outcome.FASTER
    assert not v.outcome.measured or v.outcome is not Outcome.INCONCLUSIVE
    assert Outcome.INCONCLUSIVE.correct and not Outcome.INCONCLUSIVE.measured


def test_disturbed_rounds_are_left_out_of_the_figure(rmsnorm):
    rounds = 20
    setups = setups_for(rmsnorm, (2.0, 2.0, 2.0), rounds, noise=0.0)
    for s in setups:  # rounds 0-4 disturbed: the candidate looked 10x slower there
        for r in range(5):
            s["times"]["candidate"][r] *= 10
    log = RoundsLog(planned=rounds, run=rounds, clean=list(range(5, rounds)),
                    suffered=[{"candidate": 0.5, "baseline": 0.0}] * 5 + [{"candidate": 0.0, "baseline": 0.0}] * 15)
    v = decide(rmsnorm, setups, log, None, HarnessConfig(rounds=rounds), lambda s: str(s), lambda c: c["name"])
    assert v.speedup == pytest.approx(2.0) and v.evidence["contention"]["disturbed_rounds"] == 5
    assert any("5 of 20 rounds disturbed" in f for f in v.flags)


def test_every_verdict_states_its_basis_and_a_win_by_dispatch_alone_is_flagged(rmsnorm):
    # baseline 10 us a call of which 9 us is the Python caller's cost: the kernel is 4x faster than
    # torch as called, and slower than the work torch does
    v = verdict(rmsnorm, (4.0, 4.0, 4.0), dispatch_ns=9000.0)
    assert v.evidence["basis"]["dispatch_us"] == pytest.approx(9.0)
    assert "C loop" in v.evidence["basis"]["candidate"] and "Python" in v.evidence["basis"]["baseline"]
    assert v.evidence.get("wins_by_dispatch") and any("dispatch" in f for f in v.flags)
    v = verdict(rmsnorm, (4.0, 4.0, 4.0), dispatch_ns=500.0)
    assert not v.evidence.get("wins_by_dispatch")


def test_an_unknown_objective_is_refused():
    with pytest.raises(ValueError, match="objective"):
        HarnessConfig(objective="median")


def test_block_bootstrap_widens_the_interval_when_rounds_drift():
    drift = np.linspace(1.0, 1.4, 24)  # a machine that sped up through the measurement
    _, lo1, hi1 = median_ci(drift, block=1)
    _, lo, hi = median_ci(drift, block=6)
    assert hi - lo > hi1 - lo1


def test_the_spread_between_evaluations_widens_every_interval(rmsnorm):
    """A 1.15x kernel whose rounds agree to 1% is `faster` on its rounds alone; with the spread
    seen between evaluations of one kernel here (10%) its interval reaches below 1.03: not faster."""
    n = len(rmsnorm.workload)
    alone = verdict(rmsnorm, [1.15] * n, noise=0.01)
    assert alone.outcome is Outcome.FASTER
    spread = verdict(rmsnorm, [1.15] * n, noise=0.01, between={"sigma": 0.10, "source": "test"})
    assert spread.outcome is Outcome.NOT_FASTER and spread.evidence["between"]["sigma"] == 0.10
    assert spread.ci_low < alone.ci_low < alone.ci_high < spread.ci_high
    assert all(s.ci_low < 1.15 < s.ci_high for s in spread.shapes)
    lo, hi = widen(2.0, 1.9, 2.1, 0.1)
    assert lo < 2.0 * np.exp(-0.196) * 1.01 and hi > 2.0 * np.exp(0.196) * 0.99
    assert widen(2.0, 1.9, 2.1, 0.0) == (1.9, 2.1)


def test_the_spread_is_learnt_from_kernels_measured_more_than_once_here(tmp_path):
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Verdict

    store = Store(str(tmp_path / "e.db"))
    p = load_problem("rmsnorm")
    assert between_spread(store, p)["sigma"] == BETWEEN_FLOOR  # nothing measured twice yet
    busy = {"contention": {"suffered": 0.5, "busy": True}}
    for i, figures in enumerate([(2.0, 3.0, 2.0), (1.0, 1.5, 1.0)]):
        cand = candidate_record(p, f"/* {i} */", "seed", "test", backend=p.backend)
        store.record_candidate(cand)
        for x in figures:
            store.record_verdict(p, cand, Verdict(Outcome.FASTER, "", "measure", speedup=x, evidence={}), None, "v")
        # a figure measured on a busy machine is not part of it
        store.record_verdict(p, cand, Verdict(Outcome.FASTER, "", "measure", speedup=50.0, evidence=busy), None, "v")
    got = between_spread(store, p)
    logs = [np.log([2.0, 3.0, 2.0]), np.log([1.0, 1.5, 1.0])]
    pooled = np.sqrt(sum(((x - x.mean()) ** 2).sum() for x in logs) / 4)
    assert got["sigma"] == pytest.approx(max(BETWEEN_FLOOR, pooled), abs=1e-3) and "4 repeats" in got["source"]
    store.close()


def test_each_rounds_yardstick_is_the_fastest_of_the_chosen_baseline_and_its_rivals(rmsnorm):
    """The chosen baseline reads 2x slower in the rounds than a rival it beat when chosen: a
    candidate as fast as the rival is not faster (measured against the chosen one alone it would
    read 2x); the evidence says which runner was the yardstick in how many rounds."""
    from swarmfactory.harness.rounds import RIVAL

    rounds = 20
    setups = setups_for(rmsnorm, (2.0, 2.0, 2.0), rounds)
    for s in setups:  # the rival: what the candidate does, each round a little apart
        rng = np.random.default_rng(7)
        s["times"][f"{RIVAL}1"] = list(np.array(s["times"]["candidate"]) * (1 + 0.02 * rng.standard_normal(rounds)))
        s["runners"] = {"baseline": s["choice"], f"{RIVAL}1": {"name": "engine", "mode": "eager", "native": True}}
    log = RoundsLog(planned=rounds, run=rounds, clean=list(range(rounds)),
                    suffered=[{"candidate": 0.0, "baseline": 0.0}] * rounds)
    v = decide(rmsnorm, setups, log, None, HarnessConfig(rounds=rounds), lambda s: str(sorted(s.items())),
               lambda c: c["name"])
    assert v.outcome is Outcome.NOT_FASTER and 0.9 < v.speedup < 1.05, v.detail
    assert v.baseline == "torch or engine"
    assert "its rival engine (each input set's calls back to back)" in v.evidence["basis"]["baseline"]
    for wins in v.evidence["basis"]["yardstick_rounds"].values():
        assert wins["engine"] == rounds and wins["torch"] == 0, wins
    alone = verdict(rmsnorm, (2.0, 2.0, 2.0))   # the same rounds without the rival
    assert alone.outcome is Outcome.FASTER and alone.speedup > 1.8
