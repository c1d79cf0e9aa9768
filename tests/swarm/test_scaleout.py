"""Scale-out: the Ray executor on a real local Ray cluster, several coordinators on one store
(a real PostgreSQL server: ``pg_server`` in tests/conftest.py), kill -9 and a
Ray worker killed mid-evaluation. No mocks of either."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from sqlalchemy import select

from swarmfactory.agents.base import candidate_record
from swarmfactory.config import RunConfig
from swarmfactory.evidence import schema as S
from swarmfactory.evidence.store import Store
from swarmfactory.harness.evaluate import HarnessConfig
from swarmfactory.outcome import Outcome, Verdict
from swarmfactory.problems import load_problem
from swarmfactory.swarm.coordinator import Coordinator, RunError
from swarmfactory.swarm.summary import summarize
from swarmfactory.tools import tool_versions


def record(store, problem, cand, verdict, run_id, vversion):
    """The problem, candidate and evaluation rows of one verdict, as a coordinator records them."""
    store.record_problem(problem)
    store.record_candidate(cand)
    return store.record_evaluation(cand["id"], problem, verdict, run_id, vversion, tool_versions())


MEASURED_OR_BUSY = ("faster", "not_faster", "inconclusive")
FAST = dict(rounds=3, compile_baselines=False, parallel=2, remeasure_champions=False)
CLI = [sys.executable, "-m", "swarmfactory.cli"]


def search_evals(store, run_id=None):
    return [e for e in store.evaluations(run_id=run_id) if e.purpose == "search"]


def leases(store):
    with store.engine.connect() as c:
        return [dict(r._mapping) for r in c.execute(select(S.leases))]


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for the module: two CPUs, one measurement slot (as a node started
    with `ray start --resources '{"swarmfactory_measure": 1}'`)."""
    ray = pytest.importorskip("ray")
    from swarmfactory.swarm.ray_executor import MEASURE_RESOURCE

    ray.init(num_cpus=2, resources={MEASURE_RESOURCE: 1}, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow(covers=("swarmfactory/swarm/ray_executor.py", "swarmfactory/swarm/executors.py",
                          "swarmfactory/swarm/coordinator.py", "swarmfactory/evidence/leases.py"))
def test_ray_run_records_verdicts_with_the_node_and_keeps_champions_per_hardware(ray_cluster, tmp_path):
    store = Store(str(tmp_path / "e.db"))
    p = load_problem("rmsnorm")
    # a faster champion measured on other hardware: it must neither be beaten nor be the start here
    other = store.on_hardware({**store.hardware, "id": "otherhw00000", "model": "another CPU"})
    planted = candidate_record(p, p.render() + "\n/* measured elsewhere */\n", "seed", "defaults")
    eid = record(other, p, planted, Verdict(Outcome.FASTER, "planted", "measure", speedup=50.0), None, "v0")
    other.set_champion(p, planted["id"], eid, 50.0, None, "planted on other hardware")

    cfg = RunConfig.build(problems="rmsnorm", budget=2, executor="ray", **FAST)
    run_id = Coordinator(cfg, store).run()
    evs = search_evals(store, run_id)
    # correct verdicts; on a small machine the Ray daemons themselves take the measurement CPU
    # from the timed code, and the harness says so (`inconclusive`) instead of giving a figure
    assert len(evs) == 2 and all(e.outcome in MEASURED_OR_BUSY for e in evs), \
        [(e.outcome, e.detail) for e in evs]
    assert all(e.evidence["contention"]["rounds"] >= 3 for e in evs)
    nodes = {n["NodeID"] for n in ray_cluster.nodes()}
    for e in evs:
        node = e.evidence["node"]
        assert node["node_id"] in nodes and node["hardware_id"] == e.hardware_id
    summary = summarize(store, run_id)["problems"][0]
    assert summary["started_from"] is None  # the other hardware's champion is not this one's
    champ = store.champion(p)
    if champ is not None:  # a faster quiet measurement here, confirmed by a fresh re-measure (on the cluster too)
        assert champ.candidate_id != planted["id"] and champ.hardware_id == evs[0].hardware_id
        held = store.evaluation(champ.evaluation_id)
        assert held.purpose == "remeasure" and held.outcome == "faster" and not held.evidence["contention"]["busy"]
    if not any(e.outcome == "faster" and not e.evidence["contention"]["busy"] for e in evs):
        assert champ is None  # nothing measured faster here on a quiet machine: no champion, not the planted one
    assert other.champion(p).candidate_id == planted["id"]  # untouched by a faster-looking run here
    assert not [lz for lz in leases(store) if lz["state"] == "held"]


@pytest.mark.slow(covers=("swarmfactory/swarm/ray_executor.py", "swarmfactory/swarm/executors.py",
                          "swarmfactory/swarm/coordinator.py", "swarmfactory/evidence/leases.py"))
def test_a_ray_worker_killed_mid_evaluation_is_retried_once(ray_cluster):
    from swarmfactory.swarm.ray_executor import RayExecutor

    p = load_problem("rmsnorm")
    source = p.render() + f"\n/* {uuid.uuid4().hex}: a fresh build */\n"
    ex = RayExecutor(HarnessConfig(rounds=3, compile_baselines=False), parallel=1)
    try:
        fut = ex.submit(p, source, p.seed_cases())
        victim = None
        deadline = time.monotonic() + 60
        while victim is None and time.monotonic() < deadline and not fut.done():
            victim = _worker_running("ray::_prepare_task")
            time.sleep(0.02)
        assert victim is not None, "the evaluation's build and verification never showed up"
        os.kill(victim, signal.SIGKILL)
        verdict = fut.result(timeout=300)
    finally:
        ex.shutdown()
    assert verdict.outcome.value in MEASURED_OR_BUSY, verdict.detail
    assert "retried after worker death" in verdict.evidence["retried"]
    assert "WorkerCrashedError" in verdict.evidence["retried"] and "(retried after worker death)" in verdict.detail


def _worker_running(title: str) -> int | None:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[0].decode(errors="replace").startswith(title):
                        return int(pid)
            except OSError:
                continue
    return None


def test_ray_executor_without_ray_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: `import ray` fails
    cfg = RunConfig.build(problems="rmsnorm", budget=1, executor="ray", **FAST)
    with pytest.raises(RunError, match=r"pip install swarmfactory\[ray\]"):
        Coordinator(cfg, Store(str(tmp_path / "e.db")))


def test_an_unreachable_ray_address_is_a_one_line_error(tmp_path):
    proc = subprocess.run([*CLI, "run", "--problems", "rmsnorm", "--budget", "1", "--executor", "ray",
                           "--ray-address", "127.0.0.1:9", "--store", str(tmp_path / "e.db")],
                          capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "cannot reach the Ray cluster at 127.0.0.1:9" in lines[0]
    assert not (tmp_path / "e.db").exists()


def _run(url, tmp_path, *args):
    cfg = tmp_path / "fast.yaml"
    cfg.write_text("remeasure_champions: false\n")
    return subprocess.Popen([*CLI, "run", "--problems", "rmsnorm", "--store", url, "--rounds", "3",
                             "--no-compile-baselines", "--parallel", "1", "--config", str(cfg), "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow(covers=("swarmfactory/evidence/", "swarmfactory/swarm/coordinator.py", ".ci/"))
def test_two_coordinators_on_one_postgresql_store_never_evaluate_a_candidate_twice(pg_url, tmp_path):
    # the same seed: both propose the same candidates in the same order
    procs = [_run(pg_url, tmp_path, "--budget", "2", "--seed", "7") for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    store = Store(pg_url, create=False)
    runs = {e.run_id for e in search_evals(store)}
    evs = search_evals(store)
    assert len(runs) == 2 and len(evs) == 4  # every verdict of both runs is there
    ids = [e.candidate_id for e in evs]
    assert len(set(ids)) == 4, ids  # none evaluated twice
    seed = candidate_record(load_problem("rmsnorm"), load_problem("rmsnorm").render(), "seed", "defaults")
    assert ids.count(seed["id"]) == 1  # both proposed the seed first; one evaluated it
    done = leases(store)
    assert {lz["candidate_id"] for lz in done} == set(ids) and all(lz["state"] == "done" for lz in done)
    store.close()


def test_a_coordinator_killed_with_9_leaves_leases_that_another_run_takes_over(pg_url, tmp_path):
    url = pg_url
    victim = _run(url, tmp_path, "--budget", "6", "--lease", "3")
    store = None
    held = []
    deadline = time.monotonic() + 300
    try:
        while not held and time.monotonic() < deadline and victim.poll() is None:
            time.sleep(0.1)
            try:
                store = store or Store(url, create=False)
                held = [lz for lz in leases(store) if lz["state"] == "held"]
            except Exception:
                continue  # the store or its leases table is not there yet
        assert held, "the run ended or never claimed a lease"
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.communicate()
    held = [lz for lz in leases(store) if lz["state"] == "held"]
    assert held  # what it held when it died stays held until it expires
    time.sleep(3.5)
    # another run (a new one, not a resume) takes the expired leases over and evaluates them
    cfg = RunConfig.build(problems="rmsnorm", budget=2, lease_s=3, seed=1, **{**FAST, "parallel": 1})
    run_id = Coordinator(cfg, store).run()
    for lz in held:
        evs = [e for e in search_evals(store) if e.candidate_id == lz["candidate_id"]]
        assert len(evs) == 1 and evs[0].run_id == run_id, evs
        assert "taken over after 1 expired lease" in evs[0].evidence["lease"]
    assert not [lz for lz in leases(store) if lz["state"] == "held"]
    store.close()
