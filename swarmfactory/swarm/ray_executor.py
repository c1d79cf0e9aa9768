"""The Ray executor: evaluations spread over a Ray cluster's nodes.

Each evaluation is two Ray tasks on one node: ``prepare`` (static checks, build, verification;
one CPU, many at once per node) and ``measure`` (one CPU plus the node's measurement slot, the
custom resource ``swarmfactory_measure``: each node declares one, so two measurements never share
a node's measurement CPUs). The build is native to the node (``-march=native``), so both tasks run
on the node that built it, and every node of a run has the same hardware key: the executor
measures on one hardware class (the class of most nodes, or the one asked for), and the evidence
records which node measured each candidate. Run one coordinator per class to search them all;
champions are kept per hardware.

A worker or node that dies mid-evaluation costs that evaluation only: it is run again once, on
another node of the class where there is one, and the verdict says so (``evidence["retried"]``);
a second death records a ``crashed`` verdict naming both. Ray's own task retries are off so the
retry is counted here.

Nodes need the swarmfactory package installed (a local cluster started here inherits this
process's environment). Start them with the measurement slot::

    ray start --head --resources '{"swarmfactory_measure": 1}'
    ray start --address HEAD:6379 --resources '{"swarmfactory_measure": 1}'
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor

from swarmfactory.harness.evaluate import Harness, HarnessConfig, Prepared
from swarmfactory.outcome import Outcome, Verdict
from swarmfactory.problems.spec import Case, Problem
from swarmfactory.swarm.executors import Executor, ExecutorError

MEASURE_RESOURCE = "swarmfactory_measure"
INSTALL_HINT = "--executor ray needs Ray: pip install swarmfactory[ray]"
START_HINT = f"ray start --head --resources '{{\"{MEASURE_RESOURCE}\": 1}}'"

log = logging.getLogger(__name__)


def _ray():
    try:
        import ray
    except ImportError:
        raise ExecutorError(INSTALL_HINT) from None
    return ray


def _death_errors(ray) -> tuple:
    """What Ray raises when the process or node running a task is gone (not the task's own error)."""
    names = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "ObjectLostError",
             "OwnerDiedError", "TaskUnschedulableError", "RaySystemError")
    return tuple(getattr(ray.exceptions, n) for n in names if hasattr(ray.exceptions, n))


class RayExecutor(Executor):
    """``address``: a Ray address (``auto``, ``HOST:PORT``); None: the Ray this process already
    joined, else a local cluster started here on this machine's CPUs (stopped at ``shutdown``)."""

    def __init__(self, harness_config: HarnessConfig, address: str | None = None, store_url: str | None = None,
                 parallel: int = 2, hardware_id: str | None = None, num_cpus: int | None = None):
        ray = self.ray = _ray()
        self._owned = False
        address = address or os.environ.get("RAY_ADDRESS") or None
        if not ray.is_initialized():
            _check_reachable(address)
            try:
                if address:
                    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
                else:
                    ray.init(num_cpus=num_cpus, resources={MEASURE_RESOURCE: 1}, include_dashboard=False,
                             logging_level="ERROR", log_to_driver=False)
            except Exception as exc:
                raise ExecutorError(f"cannot reach a Ray cluster at {address or 'a new local cluster'}: "
                                    f"{_first_line(exc)} (start one with `{START_HINT}` or check --ray-address)"
                                    ) from None
            self._owned = True
        # the workers' harness: the CPU split is each node's own (see _worker_harness)
        self.config = dataclasses.replace(harness_config, measure_cpus=None, verify_cpus=None)
        self.store_url = store_url
        self.nodes, self.hardware = self._discover(hardware_id)
        self._in_flight: Counter = Counter()
        self._lock = threading.Lock()
        self._refs: set = set()
        self.pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="sf-ray")
        opts = dict(max_retries=0, num_cpus=1)
        self._prepare = ray.remote(**opts)(_prepare_task)
        self._measure = ray.remote(**opts, resources={MEASURE_RESOURCE: 1})(_measure_task)

    # -- the cluster --------------------------------------------------------------------------------
    def _discover(self, hardware_id: str | None):
        """Probe every live node with a measurement slot for its hardware fingerprint; keep the
        nodes of one hardware class."""
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(MEASURE_RESOURCE)]
        if not nodes:
            self.shutdown()
            raise ExecutorError(f"no node of the Ray cluster offers the measurement slot {MEASURE_RESOURCE!r}: "
                                f"start nodes with `{START_HINT}`")
        probe = ray.remote(num_cpus=0, max_retries=0)(_probe_task)
        refs = {n["NodeID"]: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote() for n in nodes}
        found = {nid: ray.get(ref, timeout=120) for nid, ref in refs.items()}
        classes: dict[str, list[str]] = {}
        for nid, info in found.items():
            classes.setdefault(info["hardware"]["id"], []).append(nid)
        if hardware_id is None:
            cpus = {nid: n["Resources"].get("CPU", 0) for n in nodes for nid in [n["NodeID"]]}
            hardware_id = max(classes, key=lambda h: (len(classes[h]), sum(cpus[n] for n in classes[h]), h))
        elif hardware_id not in classes:
            self.shutdown()
            raise ExecutorError(f"no node of hardware {hardware_id!r} in the Ray cluster (it has "
                                f"{', '.join(sorted(classes))})")
        self.node_info = {nid: found[nid] for nid in classes[hardware_id]}
        if len(classes) > 1:
            log.warning("the Ray cluster has %d hardware classes; this run measures on %s (%d nodes); "
                        "run one coordinator per class", len(classes), hardware_id, len(classes[hardware_id]))
        return list(classes[hardware_id]), found[classes[hardware_id][0]]["hardware"]

    def _alive(self) -> list[str]:
        alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
        return [n for n in self.nodes if n in alive]

    def _pick(self, avoid: str | None = None) -> str:
        """The least busy live node of the class (another than ``avoid`` where there is one)."""
        with self._lock:
            alive = self._alive() or list(self.nodes)
            choices = [n for n in alive if n != avoid] or alive
            node = min(choices, key=lambda n: (self._in_flight[n], n))
            self._in_flight[node] += 1
            return node

    # -- evaluations ------------------------------------------------------------------------------------
    def submit(self, problem: Problem, source: str, cases: list[Case], backend: str | None = None) -> Future:
        return self.pool.submit(self._evaluate, problem, source, cases, backend)

    def _run_on(self, node: str, problem: Problem, source: str, cases: list[Case], backend: str | None) -> Verdict:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        where = NodeAffinitySchedulingStrategy(node, soft=False)
        ref = self._prepare.options(scheduling_strategy=where).remote(self.config, self.store_url, problem,
                                                                      source, cases, backend)
        prep = self._get(ref)
        if isinstance(prep, Verdict):  # rejected before measuring
            return prep
        return self._get(self._measure.options(scheduling_strategy=where).remote(self.config, self.store_url, prep))

    def _get(self, ref):
        with self._lock:
            self._refs.add(ref)
        try:
            return self.ray.get(ref)
        finally:
            with self._lock:
                self._refs.discard(ref)

    def _evaluate(self, problem: Problem, source: str, cases: list[Case], backend: str | None = None) -> Verdict:
        deaths: list[str] = []
        node = None
        for _ in range(2):
            node = self._pick(avoid=node)
            try:
                verdict = self._run_on(node, problem, source, cases, backend)
            except _death_errors(self.ray) as exc:
                deaths.append(f"{type(exc).__name__} on node {node[:12]}")
                continue
            finally:
                with self._lock:
                    self._in_flight[node] -= 1
            info = self.node_info.get(node, {})
            verdict.evidence["node"] = {"node_id": node, "host": info.get("host"),
                                        "hardware_id": info.get("hardware", {}).get("id")}
            if deaths:
                verdict.evidence["retried"] = f"retried after worker death ({deaths[0]})"
                verdict.detail = f"{verdict.detail} (retried after worker death)"
            return verdict
        return Verdict(Outcome.CRASHED, f"evaluation lost: the Ray worker died twice ({'; '.join(deaths)})",
                       "harness", evidence={"retried": f"retried after worker death ({deaths[0]}); died again",
                                            "deaths": deaths})

    def shutdown(self, wait: bool = True) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            if not wait:
                with self._lock:
                    refs = list(self._refs)
                for ref in refs:
                    try:
                        self.ray.cancel(ref, force=True)
                    except Exception:
                        pass
            pool.shutdown(wait=wait, cancel_futures=not wait)
        if self._owned and self.ray.is_initialized():
            self.ray.shutdown()
            self._owned = False


# -- on the nodes ----------------------------------------------------------------------------------------
_HARNESSES: dict = {}
_HLOCK = threading.Lock()


def _worker_harness(config: HarnessConfig, store_url: str | None) -> Harness:
    """One harness per worker process and config. The node's CPUs split as the local executor
    splits a machine's: the last measures, the others build and verify (this process stays on
    them). The node's fingerprint is taken before the split (it counts the node's CPUs)."""
    key = (config, store_url)
    with _HLOCK:
        if key not in _HARNESSES:
            from swarmfactory.hardware import cpu_fingerprint

            cpu_fingerprint()
            if threading.current_thread() is threading.main_thread():  # Ray runs tasks there
                from swarmfactory.harness import sandbox

                sandbox.DIE_WITH_PARENT = True  # a killed worker takes its frozen baseline workers along
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) >= 2:
                config = dataclasses.replace(config, measure_cpus=(cpus[-1],), verify_cpus=tuple(cpus[:-1]))
                os.sched_setaffinity(0, cpus[:-1])
            _HARNESSES[key] = Harness(config, store=_worker_store(store_url))
        return _HARNESSES[key]


def _worker_store(url: str | None):
    """The store, where this node reaches it (PostgreSQL; SQLite on the coordinator's machine):
    baselines and roofs measured here are recorded under this node's hardware. Elsewhere None."""
    if not url:
        return None
    from swarmfactory.evidence.store import Store, StoreError

    try:
        return Store(url, create=False)
    except StoreError:
        return None


def _probe_task() -> dict:
    from swarmfactory.hardware import cpu_fingerprint

    return {"hardware": cpu_fingerprint(), "host": socket.gethostname(), "pid": os.getpid()}


def _prepare_task(config: HarnessConfig, store_url: str | None, problem: Problem, source: str, cases,
                  backend: str | None = None):
    """Build and verify; a rejected candidate's verdict, or what ``measure`` needs."""
    harness = _worker_harness(config, store_url)
    prep = harness.prepare(problem, source, cases, backend)
    if prep.rejected is not None:
        return harness.rejected_verdict(prep)
    return prep


def _measure_task(config: HarnessConfig, store_url: str | None, prep: Prepared) -> Verdict:
    return _worker_harness(config, store_url).measure(prep)


def _check_reachable(address: str | None) -> None:
    """Fail in seconds, with the address in the message, where Ray itself would retry for minutes."""
    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        raise ExecutorError(f"cannot reach the Ray cluster at {address}: {exc} (start one with "
                            f"`{START_HINT}` or check --ray-address)") from None


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
