"""Executors: where evaluations run. The coordinator only submits jobs and reads futures.

``LocalExecutor`` runs ``parallel`` evaluations at once on this machine: builds and
verifications side by side, measurements one at a time (the harness's measure lock). A Ray
executor implements the same two methods, with one measurement slot per node as a Ray resource
(``swarm/ray_executor.py``). ``make_executor`` picks one by the run config's ``executor``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor

from swarmfactory.harness.evaluate import Harness
from swarmfactory.outcome import Verdict
from swarmfactory.problems.spec import Case, Problem


class ExecutorError(RuntimeError):
    """An executor that cannot start (Ray not installed, a cluster out of reach); one line."""


class Executor(ABC):
    #: The fingerprint of the hardware this executor measures on; None: this machine's.
    hardware: dict | None = None

    @abstractmethod
    def submit(self, problem: Problem, source: str, cases: list[Case], backend: str | None = None) -> Future:
        """Evaluate ``source`` (written in ``backend``, one of ``problem.backends``; default
        ``problem.backend``); the future's result is a ``Verdict`` (never an exception for
        anything the candidate did)."""

    @abstractmethod
    def shutdown(self, wait: bool = True) -> None:
        """Stop; with ``wait=False`` kill what is running."""


class LocalExecutor(Executor):
    def __init__(self, harness: Harness, parallel: int = 2):
        self.harness = harness
        self.pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="sf-eval")

    def _run(self, problem: Problem, source: str, cases: list[Case], backend: str | None = None) -> Verdict:
        prep = self.harness.prepare(problem, source, cases, backend)
        if prep.rejected is not None:
            return self.harness.rejected_verdict(prep)
        return self.harness.measure(prep)

    def submit(self, problem: Problem, source: str, cases: list[Case], backend: str | None = None) -> Future:
        return self.pool.submit(self._run, problem, source, cases, backend)

    def shutdown(self, wait: bool = True) -> None:
        if not wait:
            from swarmfactory import lifecycle

            self.pool.shutdown(wait=False, cancel_futures=True)
            lifecycle.kill_all()
        self.pool.shutdown(wait=wait)


def make_executor(config, harness: Harness, store_url: str | None = None) -> Executor:
    """The executor a run config names: ``local`` (this machine) or ``ray``."""
    if config.executor == "ray":
        from swarmfactory.swarm.ray_executor import RayExecutor

        return RayExecutor(harness.config, config.ray_address, store_url, config.parallel, config.ray_hardware)
    return LocalExecutor(harness, config.parallel)
