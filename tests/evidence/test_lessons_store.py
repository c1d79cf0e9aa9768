"""The analyst over every store backend (SQLite always; PostgreSQL on the tests' server): its
evidence query joins evaluations with knobs, and its lessons are written and read back through the
backend. The lesson rows themselves: tests/evidence/test_conformance.py."""

import pytest

from swarmfactory.agents.base import candidate_record
from swarmfactory.outcome import Outcome, ShapeTiming, Verdict
from swarmfactory.knowledge.analyst import Analyst
from swarmfactory.problems import load_problem


def test_the_analyst_reads_and_writes_through_the_backend(any_store):
    p = load_problem("rmsnorm")
    base = dict(p.knob_defaults)
    for acc in (1, 2, 4):
        for unroll in (1, 2):
            for threads, s in (("none", 2.0), ("omp", 1.25)):
                knobs = {**base, "acc": acc, "unroll": unroll, "threads": threads}
                cand = candidate_record(p, p.render(knobs), "knob-threading", "t", knobs=knobs)
                shapes = [ShapeTiming(dict(sh), 10 / s, 10.0, 12.0, s, s, s, s, 0.5) for sh in p.workload]
                any_store.record_verdict(p, cand, Verdict(Outcome.FASTER, "", "measure", speedup=s, ci_low=s, ci_high=s,
                                                   shapes=shapes), None, "vv")
    assert any_store.evaluated_problems() == ["rmsnorm"]
    rows = any_store.knob_evidence("rmsnorm")
    assert len(rows) == 12 and rows[0].knobs["acc"] == 1 and rows[0].shapes[0]["speedup"] == 2.0
    written = Analyst(any_store).update()
    (lesson,) = any_store.current_lessons("rmsnorm")
    assert lesson.data["better"] == "none" and lesson.data["effect"] == pytest.approx(1.6)
    assert [w["key"] for w in written] == [lesson.key] and Analyst(any_store).update() == []
