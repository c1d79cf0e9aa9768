"""The title (swarm/succession.py): who is champion, and why it still is, on a real SQLite store.

The verdicts here are recorded as the harness would record them; what is under test is what the
title does with them (the harness's own tests cover how a verdict is reached, and
tests/swarm/test_run.py drives the same rules through real measurements).
"""

from __future__ import annotations

import math

import pytest

from swarmfactory.agents.base import candidate_record
from swarmfactory.evidence.store import Store
from swarmfactory.harness.verdicts import pool
from swarmfactory.outcome import Outcome, ShapeTiming, Verdict
from swarmfactory.problems import load_problem
from swarmfactory.swarm.succession import POOL_MAX, busy_refusal, confirmation, contend, pooled, retained

QUIET = {"contention": {"suffered": 0.01, "busy": False, "worst": 0.02}}
LOUD = {"contention": {"suffered": 0.42, "busy": True, "worst": 0.7}}


@pytest.fixture
def world(tmp_path):
    store = Store(str(tmp_path / "e.db"))
    problem = load_problem("rmsnorm")
    yield store, problem
    store.close()


def kernel(problem, n: int, agent="seed") -> dict:
    return candidate_record(problem, f"/* kernel {n} */ int k{n};", agent=agent, operator="test",
                            backend=problem.backend)


def record(store, problem, cand, outcome: Outcome, speedup=None, evidence=QUIET, purpose="search") -> int:
    store.record_candidate(cand)
    ci = (speedup * 0.95, speedup * 1.05) if speedup else (None, None)
    verdict = Verdict(outcome, f"{outcome.value} (test)", "measure", speedup=speedup, ci_low=ci[0], ci_high=ci[1],
                      evidence=dict(evidence))
    return store.record_verdict(problem, cand, verdict, None, "v1", purpose)


def remeasurer(store, problem, figures: dict):
    """Succession's re-measure: records the figure given for each candidate id (outcome, speedup,
    evidence), and keeps the order it was asked in."""
    asked = []

    def remeasure(cand):
        asked.append(cand.id)
        outcome, speedup, evidence = figures[cand.id]
        return record(store, problem, cand, outcome, speedup, evidence, purpose="remeasure")
    remeasure.asked = asked
    return remeasure


def test_a_faster_quiet_measurement_takes_the_title_and_a_smaller_one_does_not(world):
    store, p = world
    a, b, c = kernel(p, 1), kernel(p, 2), kernel(p, 3)
    d = contend(store, p, record(store, p, a, Outcome.FASTER, 2.0))
    assert d.crowned == a["id"] and store.champion(p).candidate_id == a["id"]
    assert contend(store, p, record(store, p, b, Outcome.FASTER, 1.5)).crowned is None
    assert contend(store, p, record(store, p, c, Outcome.FASTER, 3.0)).crowned == c["id"]
    assert store.champion(p).speedup == 3.0


def test_a_challenger_takes_the_title_only_when_a_fresh_remeasure_confirms_it(world):
    store, p = world
    a, b, c, d = (kernel(p, i) for i in range(1, 5))
    again = remeasurer(store, p, {a["id"]: (Outcome.FASTER, 1.8, QUIET),
                                  b["id"]: (Outcome.NOT_FASTER, 0.95, QUIET),  # the first figure was noise
                                  c["id"]: (Outcome.FASTER, 1.7, QUIET),       # faster, not above the title
                                  d["id"]: (Outcome.FASTER, 2.4, LOUD)})       # measured busy: settles nothing
    first = contend(store, p, record(store, p, a, Outcome.FASTER, 2.0), remeasure=again)
    champ = store.champion(p)
    assert first.crowned == a["id"] and champ.candidate_id == a["id"]
    assert champ.speedup == 1.8 and store.evaluation(champ.evaluation_id).purpose == "remeasure"
    assert "confirmed by a fresh re-measure: 1.80x" in store.champion_history(p.name)[-1].reason
    for k, s in ((b, 2.5), (c, 3.0), (d, 2.2)):
        got = contend(store, p, record(store, p, k, Outcome.FASTER, s), remeasure=again)
        assert got.crowned is None and "not crowned" in got.change
        assert store.champion(p).candidate_id == a["id"] and store.champion(p).speedup == 1.8
    assert again.asked == [a["id"], b["id"], c["id"], d["id"]]
    assert len(store.champion_history(p.name)) == 1  # a refused challenger writes no title row
    # not faster than the title: nothing to confirm, no re-measure spent
    assert contend(store, p, record(store, p, kernel(p, 9), Outcome.FASTER, 1.5), remeasure=again).change is None
    assert len(again.asked) == 4


def test_busy_or_inconclusive_measurements_never_take_the_title(world):
    store, p = world
    a, b = kernel(p, 1), kernel(p, 2)
    assert contend(store, p, record(store, p, a, Outcome.FASTER, 9.0, LOUD)).crowned is None
    assert contend(store, p, record(store, p, b, Outcome.INCONCLUSIVE, None, LOUD)).crowned is None
    assert store.champion(p) is None
    assert retained(store, p) == []  # nor do they make a candidate a successor


def test_a_champion_whose_remeasure_is_slower_is_demoted_and_the_best_retained_one_replaces_it(world):
    store, p = world
    champ, second, third = kernel(p, 1), kernel(p, 2), kernel(p, 3)
    contend(store, p, record(store, p, third, Outcome.FASTER, 1.3))
    contend(store, p, record(store, p, second, Outcome.FASTER, 1.6))
    contend(store, p, record(store, p, champ, Outcome.FASTER, 1.9))
    assert store.champion(p).candidate_id == champ["id"]
    # the re-measure of the champion: slower than the baseline now; the next best (1.6x) is
    # re-measured afresh and is no longer faster; the one after it is, and takes the title at its
    # fresh figure
    again = remeasurer(store, p, {second["id"]: (Outcome.NOT_FASTER, 0.97, QUIET),
                                  third["id"]: (Outcome.FASTER, 1.25, QUIET)})
    eid = record(store, p, champ, Outcome.NOT_FASTER, 0.13, purpose="remeasure")
    d = contend(store, p, eid, remeasure=again)
    assert again.asked == [second["id"], third["id"]]
    assert d.crowned == third["id"] and "demoted" in d.change
    now = store.champion(p)
    assert now.candidate_id == third["id"] and now.speedup == 1.25
    reasons = [r.reason for r in store.champion_history(p.name)]
    assert any(r.startswith(f"demoted {champ['id']}") and "0.13x" in r for r in reasons)
    assert any(r.startswith(f"successor {second['id']} not crowned") for r in reasons)


def test_a_demoted_champion_with_no_faster_successor_leaves_no_champion(world):
    store, p = world
    champ, other = kernel(p, 1), kernel(p, 2)
    contend(store, p, record(store, p, other, Outcome.FASTER, 1.2))
    contend(store, p, record(store, p, champ, Outcome.FASTER, 2.0))
    again = remeasurer(store, p, {other["id"]: (Outcome.INCONCLUSIVE, None, LOUD)})
    contend(store, p, record(store, p, champ, Outcome.WRONG, None, purpose="remeasure"), remeasure=again)
    assert store.champion(p) is None and again.asked == [other["id"]]


def test_an_inconclusive_remeasure_keeps_the_title_unconfirmed_and_says_since_when(world):
    store, p = world
    champ = kernel(p, 1)
    first = record(store, p, champ, Outcome.FASTER, 2.0)
    contend(store, p, first)
    d = contend(store, p, record(store, p, champ, Outcome.INCONCLUSIVE, None, LOUD, purpose="remeasure"))
    assert "not confirmed" in d.change
    assert store.champion(p).candidate_id == champ["id"] and store.champion(p).speedup == 2.0
    assert confirmation(store, p, champ["id"]).id == first
    # a busy measurement of the champion neither confirms nor demotes it
    contend(store, p, record(store, p, champ, Outcome.NOT_FASTER, 0.5, LOUD, purpose="remeasure"))
    assert store.champion(p).candidate_id == champ["id"]
    # a quiet faster re-measure confirms it at the new figure
    last = record(store, p, champ, Outcome.FASTER, 1.8, purpose="remeasure")
    contend(store, p, last)
    assert store.champion(p).speedup == 1.8 and confirmation(store, p, champ["id"]).id == last


def test_an_eval_of_a_faster_kernel_competes_for_the_title(world):
    store, p = world
    champ, user = kernel(p, 1), kernel(p, 2, agent="user")
    contend(store, p, record(store, p, champ, Outcome.FASTER, 3.11))
    d = contend(store, p, record(store, p, user, Outcome.FASTER, 10.79, purpose="eval"))
    assert d.crowned == user["id"]
    assert "eval evaluation" in store.champion_history(p.name)[-1].reason


def test_the_engine_refuses_a_champion_last_confirmed_on_a_busy_machine(world):
    store, p = world
    champ = kernel(p, 1)
    contend(store, p, record(store, p, champ, Outcome.FASTER, 2.0))
    assert busy_refusal(store, p, champ["id"]) is None
    # an old store: the champion row names an evaluation whose contention was busy (recorded
    # before titles were refused on it)
    eid = record(store, p, champ, Outcome.FASTER, 2.5, LOUD, purpose="remeasure")
    store.set_champion(p, champ["id"], eid, 2.5, None, "re-measured: 2.50x (old rules)")
    why = busy_refusal(store, p, champ["id"])
    assert why and "busy machine" in why and "suffered 42%" in why


def test_evaluations_of_another_machine_change_nothing(world):
    store, p = world
    other = store.on_hardware({**store.hardware, "id": "another-machine"})
    a = kernel(p, 1)
    other.record_candidate(a)
    eid = other.record_verdict(p, a, Verdict(Outcome.FASTER, "x", "measure", speedup=5.0, ci_low=4.0, ci_high=6.0,
                                             evidence=dict(QUIET)), None, "v1", "search")
    assert contend(store, p, eid).crowned is None and store.champion(p) is None


# -- independent measurements pooled --------------------------------------------------------------
# What one evaluation records on a quiet 2-core machine: its rounds' interval widened by the spread
# between evaluations (sigma 0.08), so about +-17% whatever the kernel; shapes as the harness keeps
# them. A kernel steadily 1.19x faster is `not_faster` in every one of them.
WIDE = 1.175


def measured(store, problem, cand, speedup, purpose="search", shapes=None, evidence=QUIET) -> int:
    store.record_candidate(cand)
    lo, hi = speedup / WIDE, speedup * WIDE
    outcome = Outcome.FASTER if lo > 1.03 else Outcome.NOT_FASTER
    ev = {**evidence, "objective": "weighted", "bar": 1.03, "between": {"sigma": 0.08, "source": "test"}}
    shapes = [{"shape": {"n": n}, "speedup": s, "ci_low": s / WIDE, "ci_high": s * WIDE}
              for n, s in (shapes or {1024: speedup}).items()]
    verdict = Verdict(outcome, f"{outcome.value} (test)", "measure", speedup=speedup, ci_low=lo, ci_high=hi,
                      shapes=[ShapeTiming(shape=s["shape"], candidate_us=1.0, baseline_us=s["speedup"],
                                          reference_us=1.0, speedup=s["speedup"], ci_low=s["ci_low"],
                                          ci_high=s["ci_high"], vs_reference=1.0) for s in shapes],
                      evidence=ev)
    return store.record_verdict(problem, cand, verdict, None, "v1", purpose)


def measurer(store, problem, figures: dict):
    """A re-measure recording the next figure of each candidate's list (with optional shapes)."""
    asked = []

    def remeasure(cand):
        asked.append(cand.id)
        speedup, shapes = figures[cand.id].pop(0)
        return measured(store, problem, cand, speedup, "remeasure", shapes)
    remeasure.asked = asked
    return remeasure


def test_pooling_narrows_the_interval_of_a_steady_kernel_and_widens_it_for_a_jumpy_one(world):
    store, p = world
    steady, jumpy = kernel(p, 1), kernel(p, 2)
    for _ in range(3):
        measured(store, p, steady, 1.19)
    for s in (1.6, 0.9, 1.2):
        measured(store, p, jumpy, s)
    one = pool(store.evaluations(candidate_id=steady["id"])[:1])
    three = pooled(store, p, steady["id"])
    assert one.k == 1 and not one.clears and one.ci_low == pytest.approx(1.19 / WIDE, rel=1e-3)
    assert three.k == 3 and three.clears and three.speedup == pytest.approx(1.19)
    # each interval's own (within) part and the 8% between them, both over k
    within = math.sqrt(math.log(WIDE) ** 2 - (1.96 * 0.08) ** 2) / 1.96
    assert three.ci_low == pytest.approx(1.19 * math.exp(-1.96 * math.sqrt((within ** 2 + 0.08 ** 2) / 3)), rel=1e-6)
    wild = pooled(store, p, jumpy["id"])
    assert wild.sigma > 0.25 and not wild.clears  # the kernel's own figures spread more than 8%
    assert pooled(store, p, steady["id"], extra=1).k == 4


def test_a_busy_measurement_is_not_pooled(world):
    store, p = world
    k = kernel(p, 1)
    measured(store, p, k, 1.19)
    measured(store, p, k, 3.0, evidence=LOUD)
    assert pooled(store, p, k["id"]).k == 1


def test_a_steady_not_faster_kernel_is_remeasured_and_crowned_on_its_pooled_measurements(world):
    store, p = world
    k = kernel(p, 1)
    again = measurer(store, p, {k["id"]: [(1.17, None)]})
    d = contend(store, p, measured(store, p, k, 1.19), remeasure=again)
    assert again.asked == [k["id"]]
    assert d.crowned == k["id"]
    champ = store.champion(p)
    assert champ.speedup == 1.17 and store.evaluation(champ.evaluation_id).outcome == Outcome.NOT_FASTER
    reason = store.champion_history(p.name)[-1].reason
    assert "pooled over 2 clean measurements" in reason and "a fresh re-measure 1.17x" in reason
    # the engine's view: confirmed by that re-measure, not on a busy machine
    assert confirmation(store, p, k["id"]).id == champ.evaluation_id
    assert busy_refusal(store, p, k["id"]) is None


def test_a_lucky_first_figure_is_not_crowned_by_pooling(world):
    store, p = world
    lucky, slow = kernel(p, 1), kernel(p, 2)
    again = measurer(store, p, {lucky["id"]: [(1.0, None)], slow["id"]: [(1.2, None)]})
    d = contend(store, p, measured(store, p, lucky, 1.19), remeasure=again)
    assert d.crowned is None and "not crowned" in d.change and "pooled over 2" in d.change
    assert store.champion(p) is None
    # a figure one more measurement at its mean could not lift over the bar costs no re-measure
    assert contend(store, p, measured(store, p, slow, 1.10), remeasure=again).change is None
    assert again.asked == [lucky["id"]]
    # nor a pooled-promising candidate already measured POOL_MAX times
    many = kernel(p, 3)
    for _ in range(POOL_MAX - 1):
        measured(store, p, many, 1.0)
    assert contend(store, p, measured(store, p, many, 1.19), remeasure=again).change is None
    # a shape pooled below 1 keeps the kernel out, however fast the rest
    mixed = kernel(p, 4)
    again = measurer(store, p, {mixed["id"]: [(1.19, {64: 1.5, 4096: 0.85})]})
    d = contend(store, p, measured(store, p, mixed, 1.19, shapes={64: 1.5, 4096: 0.9}), remeasure=again)
    assert d.crowned is None and "slower on" in d.change and '{"n": 4096}: 0.87x' in d.change
    # and one already slower on a shape in the first measurement is not worth a re-measure
    worse = kernel(p, 5)
    d = contend(store, p, measured(store, p, worse, 1.19, shapes={64: 1.5, 4096: 0.8}), remeasure=again)
    assert d.change is None and again.asked == [mixed["id"]]


def test_a_champion_stays_while_its_pooled_measurements_clear_the_bar(world):
    store, p = world
    champ = kernel(p, 1)
    again = measurer(store, p, {champ["id"]: [(1.18, None)]})
    contend(store, p, measured(store, p, champ, 1.2), remeasure=again)
    assert store.champion(p).candidate_id == champ["id"]
    d = contend(store, p, measured(store, p, champ, 1.15, purpose="remeasure"))
    assert "confirmed" in d.change and "pooled over 3" in d.change
    assert store.champion(p).speedup == 1.15
    d = contend(store, p, measured(store, p, champ, 0.97, purpose="remeasure"))
    assert "demoted" in d.change and store.champion(p) is None


def test_an_eval_of_a_kernel_measured_before_adds_to_its_pooled_evidence(world):
    store, p = world
    k = kernel(p, 1)
    assert contend(store, p, measured(store, p, k, 1.18)).change is None  # no re-measure to call: one figure
    d = contend(store, p, measured(store, p, k, 1.20, purpose="eval"))
    assert d.crowned == k["id"] and "pooled over 2" in d.change
    assert store.champion(p).speedup == 1.20
