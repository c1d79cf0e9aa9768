"""The title (swarm/succession.py): who is champion, and why it still is, on a real SQLite store.

The verdicts here are recorded as the harness would record them; what is under test is what the
title does with them (the harness's own tests cover how a verdict is reached, and
tests/swarm/test_run.py drives the same rules through real measurements).
"""

from __future__ import annotations

import pytest

from swarmfactory.agents.base import candidate_record
from swarmfactory.evidence.store import Store
from swarmfactory.outcome import Outcome, Verdict
from swarmfactory.problems import load_problem
from swarmfactory.swarm.succession import busy_refusal, confirmation, contend, retained

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
