"""Store conformance: every public ``Store`` method, the same behaviour over every backend (SQLite
always; PostgreSQL on the tests' server, ``pg_server`` in tests/conftest.py, skipped where none can
be started). What the store reads back are frozen rows (``evidence/rows.py``)."""

import dataclasses
import threading
import time

import pytest
from sqlalchemy import text

from swarmfactory.agents.base import candidate_record
from swarmfactory.evidence import rows as R
from swarmfactory.evidence.store import Store, StoreError, content_hash, store_url
from swarmfactory.outcome import MEASURED, Outcome, ShapeTiming, Verdict
from swarmfactory.problems import load_problem
from swarmfactory.problems.spec import Case
from swarmfactory.tools import tool_versions

P = load_problem("rmsnorm")


def _cand(tag: str = "", **fields) -> dict:
    return candidate_record(P, P.render() + (f"\n/* {tag} */\n" if tag else ""), "seed", "defaults", **fields)


def _faster(speedup: float, **evidence) -> Verdict:
    shapes = [ShapeTiming(dict(sh), 10 / speedup, 10.0, 12.0, speedup, speedup * 0.9, speedup * 1.1, speedup, 0.5)
              for sh in P.workload[:2]]
    return Verdict(Outcome.FASTER, f"{speedup}x", "measure", speedup=speedup, ci_low=speedup * 0.9,
                   ci_high=speedup * 1.1, shapes=shapes, evidence=evidence)


class _EngineProblem:
    """An engine problem as the store records one: a name, a spec, a signature."""

    version = 1
    c_signature = "engine design"
    description = "an engine design"

    def __init__(self, model: str):
        self.name, self._spec = f"engine:{model}", f"spec-{model}"

    def spec_hash(self) -> str:
        return self._spec


# -- opening, closing, the URL ------------------------------------------------------------------------
def test_a_store_opens_again_and_closes_as_a_context_manager(any_url):
    with Store(any_url) as first:
        assert first.created and first.replayed == (0, 0) and first.unwritable is None
        assert "not writable" in first.write_failure() and "secret" not in first.shown
        first.run()  # a read hands its connection back to the pool
        assert first.engine.pool.checkedin() >= 1
    assert first.engine.pool.checkedin() == 0  # closed: no connection kept
    with Store(any_url, create=False) as again:
        assert not again.created and again.run() is None
    again.close()  # closing twice is harmless
    assert again.run() is None  # used after close: connects again


def test_discard_if_created_removes_only_a_new_sqlite_file(any_url, tmp_path):
    with Store(any_url) as kept:
        kept.create_run({})
    again = Store(any_url)
    again.discard_if_created()  # not created by this call: left alone
    with Store(any_url, create=False) as st:
        assert st.run() is not None
    if any_url.endswith(".db"):
        fresh = Store(str(tmp_path / "fresh.db"))
        fresh.discard_if_created()
        assert not (tmp_path / "fresh.db").exists()


def test_store_url_and_content_hash(any_url):
    url = store_url(any_url)
    assert url.startswith("sqlite:///") or url.startswith("postgresql+psycopg://")
    assert content_hash("a  \n\nb\n", "c") == content_hash("a\nb", "c")
    assert content_hash("a\nb", "c") != content_hash("a\nb", "c", ["-O2"])


def test_a_store_from_another_schema_version_is_refused(any_url):
    with Store(any_url) as store, store.engine.begin() as c:
        c.execute(text("UPDATE sf_meta SET value='999' WHERE key='schema_version'"))
    with pytest.raises(StoreError, match="schema v999"):
        Store(any_url)


# -- runs ----------------------------------------------------------------------------------------------
def test_runs(any_store):
    first = any_store.create_run({"problems": ["rmsnorm"], "budget": 3})
    time.sleep(1.1)  # SQLite's clock has whole seconds: the latest run is the later one
    second = any_store.create_run({"problems": ["softmax"]}, parent_run=first)
    run = any_store.run(first)
    assert isinstance(run, R.Run) and run.status == "running" and run.finished_at is None
    assert run.config == {"problems": ["rmsnorm"], "budget": 3} and run.hardware_id == any_store.hardware["id"]
    assert any_store.run().id == second and any_store.run(second).parent_run == first  # the latest by default
    any_store.set_run_config(first, {"problems": ["rmsnorm"], "budget": 9})
    any_store.set_run_status(first, "interrupted")
    run = any_store.run(first)
    assert run.status == "interrupted" and run.finished_at is not None and run.config["budget"] == 9
    assert any_store.run("nosuchrun") is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.status = "finished"


# -- problems, candidates, evaluations ------------------------------------------------------------------
def test_evaluations_candidates_and_champions_round_trip(any_store):
    run = any_store.create_run({"problems": ["rmsnorm"]})
    cand = candidate_record(P, P.render(), "seed", "defaults", knobs=dict(P.knob_defaults), run_id=run)
    v = Verdict(Outcome.FASTER, "1.5x", "measure", speedup=1.5, ci_low=1.4, ci_high=1.6)
    eid = any_store.record_verdict(P, cand, v, run, "vv1")
    assert any_store.record_candidate(cand) is False  # known content hash
    ev = any_store.evaluation(eid)
    assert ev.outcome == "faster" and ev.hardware["id"] == any_store.hardware["id"]
    assert ev.tools["torch"] and ev.validation_version == "vv1"
    any_store.set_champion(P, cand["id"], eid, 1.5, run, "first")
    assert any_store.champion(P).candidate_id == cand["id"]
    any_store.set_champion(P, None, None, None, run, "dethroned")
    assert any_store.champion(P) is None
    assert len(any_store.champion_history("rmsnorm")) == 2


def test_candidates_and_evaluations_read_back_as_rows(any_store):
    run = any_store.create_run({"problems": ["rmsnorm"]})
    any_store.record_problem(P)
    any_store.record_problem(P)  # once per name and spec
    cand = _cand(knobs=dict(P.knob_defaults), run_id=run)
    assert any_store.record_candidate(cand) is True
    row = any_store.candidate(cand["id"])
    assert isinstance(row, R.CandidateRow) and row.source == cand["source"] and row.knobs == P.knob_defaults
    assert row.as_dict()["parents"] == [] and row.created_at is not None
    assert any_store.record_candidate(row) is False  # a row read back is the same candidate
    other = _cand("other")
    assert any_store.record_candidate(other)
    assert [c.id for c in any_store.candidates("rmsnorm", run)] == [cand["id"]]
    assert {c.id for c in any_store.candidates("rmsnorm")} == {cand["id"], other["id"]}
    assert any_store.candidate("nosuchid") is None

    e1 = any_store.record_evaluation(cand["id"], P, _faster(2.0, contention={"suffered": 0.01, "busy": False}),
                                     run, "v1", tool_versions())
    e2 = any_store.record_verdict(P, other, Verdict(Outcome.WRONG, "bad", "verify"), None, "v1", purpose="eval")
    e3 = any_store.record_verdict(P, row, Verdict(Outcome.NOT_FASTER, "0.9x", "measure", speedup=0.9), run, "v1",
                                  purpose="remeasure")  # a row read back may be recorded again
    ev = any_store.evaluation(e1)
    assert isinstance(ev, R.Evaluation) and isinstance(ev.outcome, Outcome) and ev.outcome is Outcome.FASTER
    assert ev.speedup == 2.0 and ev.shapes[0]["speedup"] == 2.0 and ev.evidence["contention"]["suffered"] == 0.01
    assert ev.problem_spec == P.spec_hash() and ev.purpose == "search" and ev.run_id == run
    assert f"{any_store.evaluation(e2).outcome}" == "wrong" and any_store.evaluation(99999) is None
    assert [e.id for e in any_store.evaluations()] == [e1, e2, e3]  # oldest first
    assert [e.id for e in any_store.evaluations(run_id=run)] == [e1, e3]
    assert [e.id for e in any_store.evaluations(candidate_id=other["id"])] == [e2]
    assert [e.id for e in any_store.evaluations(problem="softmax")] == []
    assert len(any_store.on_hardware({"id": "elsewhere"}).evaluations(this_hardware=True)) == 0
    figures = any_store.measured_figures(P)
    assert all(isinstance(f, R.MeasuredFigure) for f in figures)
    assert [(f.candidate_id, f.speedup) for f in figures] == [(cand["id"], 2.0), (cand["id"], 0.9)]
    assert figures[0].contention == {"suffered": 0.01, "busy": False} and figures[1].contention is None
    assert any_store.evaluated_problems() == ["rmsnorm"]
    knobs = any_store.knob_evidence("rmsnorm")
    assert all(isinstance(k, R.KnobEvidence) for k in knobs) and [k.id for k in knobs] == [e1, e2, e3]
    assert knobs[0].knobs == P.knob_defaults and knobs[0].agent == "seed" and knobs[1].outcome == "wrong"
    assert {k.outcome for k in knobs} - {Outcome.WRONG} <= set(MEASURED)


def test_one_store_takes_verdicts_from_several_threads(any_store):
    errors = []

    def record(i):
        try:
            any_store.record_verdict(P, _cand(f"t{i}"), _faster(1.0 + i / 10), None, "v1")
        except Exception as exc:  # pragma: no cover - the assertion below says which
            errors.append(exc)

    threads = [threading.Thread(target=record, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(any_store.evaluations()) == 8 and len(any_store.candidates("rmsnorm")) == 8


# -- champions ---------------------------------------------------------------------------------------------
def test_champions_are_rows_per_hardware_and_history_is_kept(any_store):
    here, there = any_store, any_store.on_hardware({**any_store.hardware, "id": "otherhw00000"})
    a, b = _cand("a"), _cand("b")
    ea = here.record_verdict(P, a, _faster(1.5), None, "v1")
    eb = there.record_verdict(P, b, _faster(3.0), None, "v1")
    here.set_champion(P, a["id"], ea, 1.5, None, "first")
    there.set_champion(P, b["id"], eb, 3.0, None, "first there")
    champ = here.champion(P)
    assert isinstance(champ, R.Champion)
    assert (champ.candidate_id, champ.evaluation_id, champ.speedup) == (a["id"], ea, 1.5)
    assert there.champion(P).candidate_id == b["id"] and there.evaluation(eb).hardware_id == "otherhw00000"
    here.set_champion(P, None, ea, None, None, "demoted")
    assert here.champion(P) is None and there.champion(P) is not None
    assert [(r.candidate_id, r.reason) for r in here.champion_history("rmsnorm")] == [(a["id"], "first"),
                                                                                      (None, "demoted")]


# -- validation cases ----------------------------------------------------------------------------------------
def test_cases_are_unique_and_keep_provenance(any_store):
    case = Case({"rows": 1, "cols": 3}, seed=5, dist="tiny")
    assert any_store.add_case("rmsnorm", case, "adversary", "abc", "rows==1")
    assert not any_store.add_case("rmsnorm", case, "adversary", "abc")
    (row,) = any_store.found_cases("rmsnorm")
    assert isinstance(row, R.FoundCase) and row.case_key == case.key() and row.shape == {"rows": 1, "cols": 3}
    assert row.found_by == "adversary" and row.broke_candidate == "abc" and row.seed == 5 and row.note == "rows==1"
    assert any_store.found_cases("softmax") == []


# -- measured machine facts ------------------------------------------------------------------------------------
def test_baselines_and_roofs_are_kept_per_hardware(any_store):
    shape = {"rows": 8, "cols": 576}
    assert any_store.get_baseline(P, shape, False) is None
    any_store.put_baseline(P, shape, False, {"threads": 2, "us": 10.5})
    any_store.put_baseline(P, shape, False, {"threads": 4, "us": 9.5})
    assert any_store.get_baseline(P, shape, False) == {"threads": 4, "us": 9.5}  # the latest
    assert any_store.get_baseline(P, shape, True) is None
    assert any_store.on_hardware({"id": "elsewhere"}).get_baseline(P, shape, False) is None
    assert any_store.latest_roofs(2) is None
    any_store.put_roofs(2, {"bandwidth": 1.0})
    any_store.put_roofs(2, {"bandwidth": 2.0})
    record, at = any_store.latest_roofs(2)
    assert record == {"bandwidth": 2.0} and (at is None or at > 0)
    assert any_store.latest_roofs(4) is None


# -- LLM calls --------------------------------------------------------------------------------------------------
def test_llm_calls(any_store):
    run = any_store.create_run({})
    call = {"run_id": run, "agent": "llm:local", "endpoint": {"label": "local", "base_url": "http://127.0.0.1:1/v1"},
            "model": "m", "problem": "rmsnorm", "operator": "rewrite", "status": "ok", "prompt_tokens": 10,
            "completion_tokens": 20, "cost_usd": 0.0, "seconds": 1.5, "error": None, "raw": None, "parent": None}
    any_store.record_llm_call(call)
    any_store.record_llm_call({**call, "run_id": None, "status": "stopped", "error": "no endpoint"})
    (row,) = any_store.llm_calls(run)
    assert isinstance(row, R.LlmCall) and (row.status, row.prompt_tokens, row.completion_tokens) == ("ok", 10, 20)
    assert [c.status for c in any_store.llm_calls()] == ["ok", "stopped"]


# -- lessons ------------------------------------------------------------------------------------------------------
def test_the_latest_row_of_a_key_is_the_lesson_and_earlier_rows_its_history(any_store):
    any_store.add_lesson("rmsnorm", "analyst", "claim A", {"key": "a", "status": "active", "knob": "vw"}, "r1")
    any_store.add_lesson("rmsnorm", "analyst", "claim B", {"key": "b", "status": "active", "knob": "acc"}, "r1")
    any_store.add_lesson("rmsnorm", "analyst", "claim A", {"key": "a", "status": "retired", "why": "contradicted"},
                         "r2")
    any_store.add_lesson("softmax", "analyst", "claim C", {"key": "c", "status": "active"}, "r2", hardware_id="other")
    active = any_store.current_lessons()
    assert all(isinstance(r, R.Lesson) for r in active)
    assert [r.key for r in active] == ["b", "c"]          # any machine, oldest first
    assert [r.key for r in any_store.current_lessons("rmsnorm")] == ["b"]
    every = {r.key: r for r in any_store.current_lessons(include_retired=True)}
    assert every["a"].status == "retired" and every["a"].data["why"] == "contradicted"
    assert [h.status for h in every["a"].history] == ["active"] and every["a"].run_id == "r2"
    assert every["a"].history[0].history == () and every["c"].hardware_id == "other"
    assert [r.text for r in any_store.lessons("rmsnorm")] == ["claim A", "claim B", "claim A"]  # newest first
    assert len(any_store.lessons()) == 3 and len(any_store.lessons(limit=1)) == 1  # this hardware's


# -- snapshots ------------------------------------------------------------------------------------------------------
def test_a_consistent_read_does_not_see_writes_made_meanwhile(any_url):
    with Store(any_url) as reader, Store(any_url) as writer:
        run = writer.create_run({"problems": ["rmsnorm"]})
        with reader.consistent():
            before = reader.evaluations(run_id=run)
            writer.record_verdict(P, _cand(), Verdict(Outcome.WRONG, "bad", "verify"), run, "v1")
            assert reader.evaluations(run_id=run) == before == []
        assert len(reader.evaluations(run_id=run)) == 1


# -- engine profiles --------------------------------------------------------------------------------------------------
def _design(store, problem, tag: str, speedup: float, model: str, busy: bool = False, outcome=Outcome.FASTER) -> str:
    cand = candidate_record(problem, f"weights: q4_1\n# {tag}\n", "engine-knobs", "mutate", backend="engine",
                            knobs={"tag": tag})
    verdict = Verdict(outcome, "", "measure", speedup=speedup,
                      evidence={"model_sha256": model, "serving": {"tok_s": 10 * speedup}, "design": f"design {tag}",
                                "contention": {"suffered": 0.5 if busy else 0.0, "busy": busy}})
    eid = store.record_verdict(problem, cand, verdict, None, "engine-v1")
    store.set_champion(problem, cand["id"], eid, speedup, None, f"{tag} takes it")
    return cand["id"]


def test_profiles_are_rows_keyed_by_model_hardware_and_tools(any_store):
    m1, m2 = _EngineProblem("one"), _EngineProblem("two")
    elsewhere = any_store.on_hardware({**any_store.hardware, "id": "otherhw00000", "model": "Other CPU"})
    _design(any_store, m1, "old", 1.1, "sha-one")
    newest_here = _design(any_store, m1, "new", 1.4, "sha-one")      # the latest champions row counts
    there = _design(elsewhere, m1, "there", 1.2, "sha-one")
    two = _design(any_store, m2, "two", 1.3, "sha-two", busy=True)
    _design(any_store, _EngineProblem("three"), "unmeasured", 1.0, "sha-three", outcome=Outcome.VERIFIED)
    profiles = any_store.profiles()
    assert all(isinstance(p, R.Profile) for p in profiles)
    assert [p.id for p in profiles] == [two, there, newest_here]  # newest first, one per problem and machine
    p = profiles[-1]
    assert (p.problem, p.model_sha256, p.speedup, p.reason) == ("engine:one", "sha-one", 1.4, "new takes it")
    assert p.config_yaml.startswith("weights: q4_1") and p.knobs == {"tag": "new"} and p.description == "design new"
    assert p.serving == {"tok_s": 14.0} and p.contention == {"suffered": 0.0, "busy": False}
    assert p.tools["torch"] and p.hardware["id"] == any_store.hardware["id"]
    assert [p.id for p in any_store.profiles(model_sha256="sha-one")] == [there, newest_here]
    assert [p.id for p in any_store.profiles(hardware_id="otherhw00000")] == [there]
    assert [p.id for p in any_store.profiles(tools={"torch": "0.0", "cc_version": "none"})] == []
    assert len(any_store.profiles(model_sha256="sha-one", hardware_id=any_store.hardware["id"],
                                  tools=tool_versions())) == 1
    here = any_store.hardware["id"]
    assert p.mismatch("sha-one", here, tool_versions()) is None
    assert p.mismatch("sha-two", here, tool_versions()) == "tuned for another model file"
    assert "another CPU" in profiles[1].mismatch("sha-one", here, tool_versions())
    assert "busy machine" in profiles[0].mismatch("sha-two", here, tool_versions())
    assert "tuned with torch" in p.mismatch("sha-one", here, {**tool_versions(), "torch": "0.0"})
