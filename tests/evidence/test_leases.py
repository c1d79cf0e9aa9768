"""Evaluation leases over every store backend (SQLite always; PostgreSQL on the tests' server,
``pg_server`` in tests/conftest.py). Snapshots and per-hardware champions:
tests/evidence/test_conformance.py."""

import threading
import time

import pytest

from swarmfactory.agents.base import candidate_record
from swarmfactory.evidence.leases import CLAIMED, DONE, TAKEN, Leases
from swarmfactory.evidence.store import Store
from swarmfactory.outcome import Outcome, Verdict
from swarmfactory.problems import load_problem
from swarmfactory.tools import tool_versions


def record(store, problem, cand, verdict, run_id, vversion):
    """The problem, candidate and evaluation rows of one verdict, as a coordinator records them."""
    store.record_problem(problem)
    store.record_candidate(cand)
    return store.record_evaluation(cand["id"], problem, verdict, run_id, vversion, tool_versions())


@pytest.fixture
def two_stores(any_url):
    """Two coordinators' stores: separate engines (connections) on one database."""
    with Store(any_url) as a, Store(any_url) as b:
        yield a, b


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


def test_a_resumed_run_takes_over_its_own_leases_at_once(two_stores):
    a, b = two_stores
    killed, resumed, other = Leases(a, "run1", ttl_s=60), Leases(b, "run1", ttl_s=60), Leases(b, "run2", ttl_s=60)
    assert killed.claim(P, "c1", "v1").status == CLAIMED
    assert other.orphans(P, "v1") == [] and other.claim(P, "c1", "v1").status == TAKEN
    assert resumed.orphans(P, "v1") == ["c1"]
    assert resumed.claim(P, "c1", "v1").status == CLAIMED
