"""Lessons in the store, the same over every backend (SQLite always; PostgreSQL when
SWARMFACTORY_PG_URL points at a real server): append-only rows, the latest row of a key is the
lesson as it stands, and the analyst's evidence query joins evaluations with knobs."""

import os
import uuid

import pytest
from sqlalchemy import create_engine, text

from swarmfactory.agents.base import candidate_record
from swarmfactory.evidence.store import Store
from swarmfactory.harness.outcome import Outcome, ShapeTiming, Verdict
from swarmfactory.knowledge.analyst import Analyst
from swarmfactory.problems import load_problem

PG = os.environ.get("SWARMFACTORY_PG_URL")


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request, tmp_path):
    if request.param == "sqlite":
        yield Store(str(tmp_path / "e.db"))
        return
    if not PG:
        pytest.skip("SWARMFACTORY_PG_URL not set (CI starts a PostgreSQL server)")
    name = "sf_" + uuid.uuid4().hex[:10]
    admin = create_engine(PG.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    store = Store(PG.rsplit("/", 1)[0] + "/" + name)
    yield store
    store.engine.dispose()
    with admin.connect() as c:
        c.execute(text(f"DROP DATABASE {name}"))


def test_the_latest_row_of_a_key_is_the_lesson_and_earlier_rows_its_history(any_store):
    any_store.add_lesson("rmsnorm", "analyst", "claim A", {"key": "a", "status": "active", "knob": "vw"}, "r1")
    any_store.add_lesson("rmsnorm", "analyst", "claim B", {"key": "b", "status": "active", "knob": "acc"}, "r1")
    any_store.add_lesson("rmsnorm", "analyst", "claim A", {"key": "a", "status": "retired", "why": "contradicted"}, "r2")
    any_store.add_lesson("softmax", "analyst", "claim C", {"key": "c", "status": "active"}, "r2", hardware_id="other")
    active = any_store.current_lessons()
    assert [r["key"] for r in active] == ["b", "c"]          # any machine, oldest first
    assert [r["key"] for r in any_store.current_lessons("rmsnorm")] == ["b"]
    every = {r["key"]: r for r in any_store.current_lessons(include_retired=True)}
    assert every["a"]["status"] == "retired" and every["a"]["data"]["why"] == "contradicted"
    assert [h["data"]["status"] for h in every["a"]["history"]] == ["active"] and every["a"]["run_id"] == "r2"
    assert every["c"]["hardware_id"] == "other"
    assert len(any_store.lessons("rmsnorm")) == 3              # nothing was rewritten


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
    assert len(rows) == 12 and rows[0]["knobs"]["acc"] == 1 and rows[0]["shapes"][0]["speedup"] == 2.0
    written = Analyst(any_store).update()
    (lesson,) = any_store.current_lessons("rmsnorm")
    assert lesson["data"]["better"] == "none" and lesson["data"]["effect"] == pytest.approx(1.6)
    assert [w["key"] for w in written] == [lesson["key"]] and Analyst(any_store).update() == []
