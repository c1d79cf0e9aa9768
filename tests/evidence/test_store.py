"""Store conformance: the same behaviour over every backend (SQLite always; PostgreSQL when
SWARMFACTORY_PG_URL points at a real server, as CI provides)."""

import os
import uuid

import pytest
from sqlalchemy import create_engine, text

from swarmfactory.agents.base import candidate_record
from swarmfactory.evidence.store import Store, StoreError, content_hash
from swarmfactory.harness.outcome import Outcome, Verdict
from swarmfactory.problems import load_problem
from swarmfactory.problems.spec import Case

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
    url = PG.rsplit("/", 1)[0] + "/" + name
    store = Store(url)
    yield store
    store.engine.dispose()
    with admin.connect() as c:
        c.execute(text(f"DROP DATABASE {name}"))


def test_evaluations_candidates_and_champions_round_trip(any_store):
    p = load_problem("rmsnorm")
    run = any_store.create_run({"problems": ["rmsnorm"]})
    cand = candidate_record(p, p.render(), "seed", "defaults", knobs=dict(p.knob_defaults), run_id=run)
    v = Verdict(Outcome.FASTER, "1.5x", "measure", speedup=1.5, ci_low=1.4, ci_high=1.6)
    eid = any_store.record_verdict(p, cand, v, run, "vv1")
    assert any_store.record_candidate(cand) is False  # known content hash
    ev = any_store.evaluation(eid)
    assert ev["outcome"] == "faster" and ev["hardware"]["id"] == any_store.hardware["id"]
    assert ev["tools"]["torch"] and ev["validation_version"] == "vv1"
    any_store.set_champion(p, cand["id"], eid, 1.5, run, "first")
    assert any_store.champion(p)["candidate_id"] == cand["id"]
    any_store.set_champion(p, None, None, None, run, "dethroned")
    assert any_store.champion(p) is None
    assert len(any_store.champion_history("rmsnorm")) == 2


def test_cases_are_unique_and_keep_provenance(any_store):
    case = Case({"rows": 1, "cols": 3}, seed=5, dist="tiny")
    assert any_store.add_case("rmsnorm", case, "adversary", "abc", "rows==1")
    assert not any_store.add_case("rmsnorm", case, "adversary", "abc")
    (row,) = any_store.found_cases("rmsnorm")
    assert row["found_by"] == "adversary" and row["broke_candidate"] == "abc" and row["seed"] == 5


def test_content_hash_ignores_blank_lines_and_trailing_spaces():
    assert content_hash("a  \n\nb\n", "c") == content_hash("a\nb", "c")
    assert content_hash("a\nb", "c") != content_hash("a\nb", "c", ["-O2"])


def test_a_store_from_another_schema_version_is_refused(tmp_path):
    path = tmp_path / "old.db"
    store = Store(str(path))
    with store.engine.begin() as c:
        c.execute(text("UPDATE sf_meta SET value='999' WHERE key='schema_version'"))
    with pytest.raises(StoreError, match="schema v999"):
        Store(str(path))
