"""Leases, snapshots and per-hardware champions over every store backend (SQLite always;
PostgreSQL when SWARMFACTORY_PG_URL points at a real server, as CI provides)."""

import threading
import time

import pytest

from swarmfactory.agents.base import candidate_record
from swarmfactory.evidence.leases import CLAIMED, DONE, TAKEN, Leases
from swarmfactory.evidence.store import Store
from swarmfactory.harness.outcome import Outcome, Verdict
from swarmfactory.problems import load_problem
from swarmfactory.tools import tool_versions


def record(store, problem, cand, verdict, run_id, vversion):
    """The problem, candidate and evaluation rows of one verdict, as a coordinator records them."""
    store.record_problem(problem)
    store.record_candidate(cand)
    return store.record_evaluation(cand["id"], problem, verdict, run_id, vversion, tool_versions())


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "e.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def two_stores(store_url):
    """Two coordinators' stores: separate engines (connections) on one database."""
    a, b = Store(store_url), Store(store_url)
    yield a, b
    a.engine.dispose()
    b.engine.dispose()


P = load_problem("rmsnorm")


def test_a_claimed_candidate_is_taken_for_others_and_done_after_release(two_stores):
    a, b = two_stores
    la, lb = Leases(a, "runa", ttl_s=60), Leases(b, "runb", ttl_s=60)
    assert la.claim(P, "c1", "v1").status == CLAIMED
    assert lb.claim(P, "c1", "v1").status == TAKEN
    assert la.claim(P, "c1", "v1").status == TAKEN  # a second claim by the holder is refused too
    assert lb.claim(P, "c1", "v2").status == CLAIMED  # another validation set is another key
    la.release(P, "c1", "v1")
    assert lb.claim(P, "c1", "v1").status == DONE
    la.abandon(P, "c1", "v2")  # not the holder's: nothing happens
    assert la.claim(P, "c1", "v2").status == TAKEN
    lb.abandon(P, "c1", "v2")
    assert la.claim(P, "c1", "v2").status == CLAIMED


def test_an_expired_lease_is_an_orphan_taken_over_once(two_stores):
    a, b = two_stores
    dead, la, lb = Leases(a, "dead", ttl_s=0.3), Leases(a, "runa", ttl_s=60), Leases(b, "runb", ttl_s=60)
    assert dead.claim(P, "c1", "v1").status == CLAIMED
    assert la.orphans(P, "v1") == []
    time.sleep(0.6)
    assert la.orphans(P, "v1") == ["c1"] and lb.orphans(P, "v1") == ["c1"]
    results = {}
    barrier = threading.Barrier(2)

    def take(name, leases):
        barrier.wait()
        results[name] = leases.claim(P, "c1", "v1")

    threads = [threading.Thread(target=take, args=(n, lz)) for n, lz in (("a", la), ("b", lb))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status for r in results.values()) == [CLAIMED, TAKEN]
    winner = next(r for r in results.values() if r.status == CLAIMED)
    assert winner.attempts == 2
    assert la.orphans(P, "v1") == []


def test_the_heartbeat_keeps_a_lease_alive_past_its_ttl(two_stores):
    a, b = two_stores
    la, lb = Leases(a, "runa", ttl_s=0.4), Leases(b, "runb", ttl_s=60)
    assert la.claim(P, "c1", "v1").status == CLAIMED
    la.start()
    try:
        time.sleep(1.0)
        assert lb.orphans(P, "v1") == [] and lb.claim(P, "c1", "v1").status == TAKEN
    finally:
        la.stop()
    time.sleep(0.6)
    assert lb.claim(P, "c1", "v1").status == CLAIMED


def test_a_recorded_verdict_is_done_even_without_a_lease(two_stores):
    a, b = two_stores
    cand = candidate_record(P, P.render(), "seed", "defaults")
    record(a, P, cand, Verdict(Outcome.WRONG, "bad", "verify"), None, "v1")
    assert Leases(b, "runb").claim(P, cand["id"], "v1").status == DONE
    assert Leases(b, "runb").claim(P, cand["id"], "v2").status == CLAIMED


def test_a_consistent_read_does_not_see_writes_made_meanwhile(two_stores):
    reader, writer = two_stores
    run = writer.create_run({"problems": ["rmsnorm"]})
    with reader.consistent():
        before = reader.evaluations(run_id=run)
        cand = candidate_record(P, P.render(), "seed", "defaults")
        record(writer, P, cand, Verdict(Outcome.WRONG, "bad", "verify"), run, "v1")
        assert reader.evaluations(run_id=run) == before == []
    assert len(reader.evaluations(run_id=run)) == 1


def test_champions_are_per_hardware(store_url):
    store = Store(store_url)
    zen3 = store.on_hardware({**store.hardware, "id": "zen3aaaaaaaa", "model": "AMD Zen 3"})
    zen4 = store.on_hardware({**store.hardware, "id": "zen4bbbbbbbb", "model": "AMD Zen 4"})
    slow = candidate_record(P, P.render(), "seed", "defaults")
    fast = candidate_record(P, P.render() + "\n/* other */\n", "seed", "defaults")
    e4 = record(zen4, P, slow, Verdict(Outcome.FASTER, "", "measure", speedup=1.2), None, "v1")
    zen4.set_champion(P, slow["id"], e4, 1.2, None, "first on zen4")
    e3 = record(zen3, P, fast, Verdict(Outcome.FASTER, "", "measure", speedup=3.0), None, "v1")
    zen3.set_champion(P, fast["id"], e3, 3.0, None, "first on zen3")
    assert zen4.champion(P)["candidate_id"] == slow["id"]
    assert zen3.champion(P)["candidate_id"] == fast["id"]
    assert store.champion(P) is None  # this machine has none
    assert {e["hardware_id"] for e in zen3.evaluations(this_hardware=True)} == {"zen3aaaaaaaa"}
    assert store.evaluation(e3)["hardware"]["model"] == "AMD Zen 3"


def test_a_resumed_run_takes_over_its_own_leases_at_once(two_stores):
    a, b = two_stores
    killed, resumed, other = Leases(a, "run1", ttl_s=60), Leases(b, "run1", ttl_s=60), Leases(b, "run2", ttl_s=60)
    assert killed.claim(P, "c1", "v1").status == CLAIMED
    assert other.orphans(P, "v1") == [] and other.claim(P, "c1", "v1").status == TAKEN
    assert resumed.orphans(P, "v1") == ["c1"]
    assert resumed.claim(P, "c1", "v1").status == CLAIMED
