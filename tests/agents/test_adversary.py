"""The adversary finds what the seed cases miss, the cases persist, and champions fall."""

import dataclasses
import random
from pathlib import Path

import pytest

from swarmfactory.adversary import Adversary, well_defined
from swarmfactory.agents.base import candidate_record
from swarmfactory.config import RunConfig
from swarmfactory.evidence.quality import busy
from swarmfactory.evidence.rows import CandidateRow
from swarmfactory.evidence.store import Store
from swarmfactory.outcome import Outcome, Verdict
from swarmfactory.problems import load_problem
from swarmfactory.problems.spec import Case
from swarmfactory.swarm.coordinator import Coordinator
from swarmfactory.validation import validation_set

PLANTED = Path(__file__).parents[1] / "planted" / "rmsnorm"
DATA = Path(__file__).parents[1] / "swarm" / "data"


@pytest.mark.parametrize("name, condition", [
    ("rows_over_1024", lambda s: s["rows"] > 1024),
    ("single_long_row", lambda s: s["rows"] == 1 and s["cols"] >= 1024 and s["cols"] % 256),
])
def test_adversary_finds_planted_bugs_the_seed_cases_miss(harness, name, condition):
    # the seed cases without the fixed sample of model shapes, which catches single_long_row on
    # its own (one row of 4544 columns: tests/problems/test_model_shapes.py): the adversary must
    # still find what a validation set misses
    problem = dataclasses.replace(load_problem("rmsnorm"), model_shapes=())
    source = (PLANTED / f"{name}.c").read_text()
    assert harness.prepare(problem, source).rejected is None, "seed cases should miss the planted bug"
    findings = Adversary().hunt(harness, problem, [CandidateRow.of({"id": name, "source": source})], [],
                                     random.Random(1), {c.key() for c in problem.seed_cases()})
    assert findings, "the adversary found nothing"
    for f in findings:
        assert condition(f.case.shape), f.case
        assert f.broke == name and f.detail.startswith("wrong")


def test_adversary_cases_are_well_defined_and_new():
    problem = load_problem("softmax")
    known = {c.key() for c in problem.seed_cases()}
    cases = Adversary(cases_per_turn=10).propose_cases(problem, [], random.Random(0), set(known))
    assert len(cases) == 10
    assert all(c.key() not in known and well_defined(problem, c) for c in cases)
    assert all(problem.valid_shape(c.shape) for c in cases)


def test_found_cases_persist_and_change_the_validation_version(tmp_path):
    problem = load_problem("rmsnorm")
    db = str(tmp_path / "e.db")
    _, v0 = validation_set(problem, Store(db))
    Store(db).add_case("rmsnorm", Case({"rows": 1, "cols": 6}, 3, "normal"), "adversary", "abc", "tail")
    cases, v1 = validation_set(problem, Store(db))  # a fresh process would see the same
    assert v1 != v0 and any(c.shape == {"rows": 1, "cols": 6} and c.origin == "adversary" for c in cases)


def test_a_dethroned_champion_is_replaced_by_the_next_correct_candidate(tmp_path):
    problem = load_problem("rmsnorm")
    store = Store(str(tmp_path / "e.db"))
    cfg = RunConfig.build(problems="rmsnorm", budget=1, rounds=3, compile_baselines=False)
    _, vv = validation_set(problem, store)
    fast_buggy = candidate_record(problem, (PLANTED / "tail_mod4.c").read_text(), "knob-unrolling", "x")
    slower_ok = candidate_record(problem, problem.render(), "seed", "defaults", knobs=dict(problem.knob_defaults))
    for cand, speed in ((fast_buggy, 20.0), (slower_ok, 10.0)):
        eid = store.record_verdict(problem, cand, Verdict(Outcome.FASTER, "", "measure", speedup=speed), None, vv)
    store.set_champion(problem, fast_buggy["id"], None, 20.0, None, "planted")
    store.add_case("rmsnorm", Case({"rows": 3, "cols": 66}, 5, "normal"), "adversary", fast_buggy["id"])
    coord = Coordinator(cfg, store)
    try:
        state = coord._load_state()["rmsnorm"]
        coord.run_id = None
        coord.reverify(state)
    finally:
        coord.harness.close()
    # the successor is re-measured afresh: it takes the title only on a faster figure measured on
    # a machine that was not busy
    [again] = [e for e in store.evaluations(candidate_id=slower_ok["id"]) if e.purpose == "remeasure"]
    reasons = [r.reason for r in store.champion_history("rmsnorm")]
    assert reasons[-2].startswith(f"dethroned {fast_buggy['id']}")
    if again.outcome == "faster" and not busy(again.evidence):
        assert store.champion(problem).candidate_id == slower_ok["id"]
        assert reasons[-1].startswith(f"replaces demoted {fast_buggy['id']}")
    else:
        assert store.champion(problem) is None and reasons[-1].startswith(f"successor {slower_ok['id']} not crowned")
    assert any(e.purpose == "reverify" and e.outcome == "wrong"
               for e in store.evaluations(candidate_id=fast_buggy["id"]))


@pytest.mark.skipif(not __import__("swarmfactory.contention", fromlist=["x"]).pressure_available(),
                    reason="no CPU pressure information (PSI) on this kernel")
def test_candidates_a_busy_machine_could_not_time_still_face_the_adversary(tmp_path, monkeypatch, cpu_hogs):
    """Busy loops on the measurement CPU for the whole run: every candidate passes verification
    but is `inconclusive` (its timing disturbed), so nothing is measured and nothing crowned. It
    is still retained (measured again later, crowned if it wins then), so the adversary attacks it
    before the run ends; the buggy seed's case is found on a machine that could time nothing."""
    import os

    from swarmfactory.harness import rounds
    from swarmfactory.swarm import coordinator

    monkeypatch.setattr(coordinator, "RETRY_AFTER_S", 3600.0)   # no retry within the run
    monkeypatch.setattr(rounds, "WAIT_TOTAL_S", 2.0)  # the hogs never stop: do not wait for them long
    store = Store(str(tmp_path / "e.db"))
    cfg = RunConfig.build(problems=str(DATA / "planted_problem.py"), budget=2, rounds=3, parallel=2,
                          compile_baselines=False, agents="seed,random-restart,adversary",
                          remeasure_champions=False)
    with cpu_hogs(sorted(os.sched_getaffinity(0))[-1], 2):
        run_id = Coordinator(cfg, store).run()
    evs = [e for e in store.evaluations(run_id=run_id) if e.purpose == "search"]
    assert evs and all(e.outcome == "inconclusive" for e in evs), [(e.outcome, e.detail[:80]) for e in evs]
    found = store.found_cases("rmsnorm")
    assert found and all(r.found_by == "adversary" and r.shape["rows"] > 1024 for r in found)


def test_a_run_with_the_adversary_dethrones_a_buggy_champion_and_the_cases_outlive_it(tmp_path):
    store = Store(str(tmp_path / "e.db"))
    cfg = RunConfig.build(problems=str(DATA / "planted_problem.py"), budget=4, rounds=3, parallel=1,
                          compile_baselines=False, agents="seed,random-restart,adversary")
    run_id = Coordinator(cfg, store).run()
    found = store.found_cases("rmsnorm")
    assert found and all(r.found_by == "adversary" for r in found)
    assert all(r.shape["rows"] > 1024 for r in found)
    champ = store.champion(load_problem(str(DATA / "planted_problem.py")))
    if champ is not None:  # whatever holds the title now passes the found cases
        assert 'tail == "buggy"' not in store.candidate(champ.candidate_id).source
        assert store.candidate(champ.candidate_id).knobs["tail"] == "correct"
    # a second run starts from the grown validation set: the buggy seed is not re-admitted
    second = Coordinator(cfg, store).run()
    assert second != run_id
    assert not [e for e in store.evaluations(run_id=second)
                if e.outcome == "faster" and store.candidate(e.candidate_id).knobs["tail"] == "buggy"]
