"""The harness: static checks -> build -> verify -> measure (re-verifying while timing).

``Harness.evaluate`` turns candidate source into a typed ``Verdict``; it never raises for
anything the candidate does. ``prepare`` (static, build, verify) may run on several threads at
once; ``measure`` takes a lock so one measurement runs at a time on this machine.

One pipeline for every backend: the static check and the build are the backend's own
(``Backend.check``, ``Backend.build``); verification and measurement are those of the line that
runs what it built (``Backend.runner``): the sandboxed C driver here, or the GPU worker
(harness/gpu.py).

On the driver line the candidate runs only in a fresh driver process per stage (candidate.py),
locked down by a system-call allow-list and contained by a cgroup where the machine allows. The
trusted side writes its inputs into shared memory, owns the clock, checks every output it reads
back and decides the verdict. See docs/architecture.md for the attack classes and what stops each.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from swarmfactory import heap, lifecycle
from swarmfactory.backends import Backend, BuildError, CheatError, MissingTool, get_backend
from swarmfactory.backends.base import Artifact
from swarmfactory.evidence.processes import ProcessLedger
from swarmfactory.harness.arena import Arena
from swarmfactory.harness.baselines import EAGER_REFERENCE, BaselinePool, rivals
from swarmfactory.harness.candidate import CandidateProcess
from swarmfactory.outcome import Outcome, Rejected, Verdict
from swarmfactory.harness.roofline import known_or_measured, remeasure
from swarmfactory.harness.sampling import CandidateTimer
from swarmfactory.harness.slots import SlotGroup, group_bytes
from swarmfactory.harness.rounds import RIVAL, SINGLE, run_rounds
from swarmfactory.harness.timing import calibrate
from swarmfactory.harness.verdicts import MIN_EFFECT, OBJECTIVES, between_spread, decide, min_clean_rounds
from swarmfactory.harness.verify import slot_key, verify
from swarmfactory.problems.spec import Case, Problem

ARENA_BUDGET = 1 << 31   # bytes of shared memory one measurement may lay out
SYNC_SET_BYTES = 64 << 20  # input sets of one shape in sync mode (the baseline gets as many)


@dataclass(frozen=True)
class HarnessConfig:
    rounds: int = 20                 # interleaved rounds per workload shape (MEASURING: >= 20)
    min_effect: float = MIN_EFFECT   # `faster` needs CI low > 1 + min_effect
    min_sample_ms: float = 1.0       # each timed sample of a baseline lasts at least this long
    sample_ms: float = 2.0           # a candidate's sample: 1-1.5x this, ended at a random moment
    max_window_ms: float = 20.0      # longer, to hold 64 calls; kernels slower than that go sync
    case_timeout_s: float = 10.0     # one verification call; a hang past it is `timed_out`
    measure_cpus: tuple[int, ...] | None = None  # None: every CPU this process may use
    verify_cpus: tuple[int, ...] | None = None
    compile_baselines: bool = True   # also try torch.compile for every baseline
    suspicious_speedup: float = 10.0
    mem_gb: float = 8.0
    rotate: int = 2                  # input sets per shape while timing fast kernels
    audit: float = 0.2               # share of async samples stopped at a random call count, only checked
    refresh: float = 0.01            # share of every input replaced in secret between samples
    max_slots: int = 16              # input sets per shape for slow kernels (each called once)
    bootstrap_resamples: int = 2000
    static_checks: bool = True       # the source filter: a first, cheap `cheated`
    load_checks: bool = True         # the built library may run none of its code while it loads
    seccomp: bool = True             # the system-call allow-list (the protection; tests may
    contain: bool = True             # switch a layer off to prove the next one holds)
    trace: bool = True               # read FP state and filters from outside (ptrace) where allowed
    objective: str = "weighted"      # weighted | geomean | worst (harness/verdicts.py)

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}: one of {', '.join(OBJECTIVES)}")

    def cpus(self, which: str) -> list[int]:
        chosen = self.measure_cpus if which == "measure" else self.verify_cpus
        return list(chosen) if chosen else sorted(os.sched_getaffinity(0))


@dataclass
class Prepared:
    problem: Problem
    source: str
    backend: str  # what the source is written in: one of problem.backends
    artifact: Artifact | None = None
    cases_checked: int = 0
    rejected: Rejected | None = None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Line:
    """The stages that depend on what runs a built artifact (``Backend.runner``): ``verify``
    (the cases checked; Rejected on the first failure), ``measure`` (the verdict of a verified
    candidate) and ``missing_tool`` (the rejection when this machine lacks the backend's tool,
    given the backend's name)."""

    verify: Callable[[Prepared, list[Case]], int]
    measure: Callable[[Prepared], Verdict]
    missing_tool: Callable[[str, MissingTool], Rejected]


class Harness:
    def __init__(self, config: HarnessConfig | None = None, store=None):
        self.config = config or HarnessConfig()
        self.store = store
        heap.return_freed_memory()  # cases and references come and go here: give their pages back
        self.ledger = ProcessLedger(store) if store is not None else None
        lifecycle.watch(self.ledger)  # what a dead run left on this store ends; ours are recorded
        self.baselines = BaselinePool(self.config.cpus("measure"))
        self._choices: dict[tuple, dict] = {}
        self._roofs: dict | None = None
        self._exchange_ns: float | None = None
        self._dispatch: dict[int, float | None] = {}
        self.measure_lock = threading.Lock()

    # -- stages ---------------------------------------------------------------------------------
    def prepare(self, problem: Problem, source: str, cases: list[Case] | None = None,
                backend: str | None = None) -> Prepared:
        """Static checks, build, verification. Thread-safe. ``backend``: what ``source`` is
        written in, one of ``problem.backends`` (default ``problem.backend``)."""
        backend = backend or problem.backend
        if backend not in problem.backends:
            raise ValueError(f"{problem.name} takes {', '.join(problem.backends)} candidates, not {backend}")
        t0 = time.monotonic()
        builder = get_backend(backend)
        line = self._line(builder)
        prep = Prepared(problem, source, backend)
        cases = cases if cases is not None else problem.seed_cases()
        try:
            if not source.strip():
                raise Rejected(Outcome.BUILD_FAILED, "the source file is empty", "build")
            reason = builder.check(source) if self.config.static_checks else None
            if reason:
                raise Rejected(Outcome.CHEATED, f"static check: {reason}", "static")
            try:
                prep.artifact = builder.build(source, problem.entry, prototype=builder.signature(problem),
                                              checks=self.config.static_checks,
                                              load_checks=self.config.load_checks)
            except CheatError as exc:
                raise Rejected(Outcome.CHEATED, f"static check: {exc}", "static") from None
            except MissingTool as exc:  # not the candidate's doing: the checks without the tool passed
                raise line.missing_tool(backend, exc) from None
            except BuildError as exc:
                raise _build_failed(exc) from None
            prep.cases_checked = line.verify(prep, cases)
        except Rejected as rej:
            prep.rejected = rej
        prep.seconds = time.monotonic() - t0
        return prep

    def measure(self, prep: Prepared) -> Verdict:
        """The verdict of a verified candidate, from the line that runs its backend's artifacts.
        One at a time."""
        return self._line(get_backend(prep.backend)).measure(prep)

    def _line(self, backend: Backend) -> Line:
        """The stages for what runs ``backend``'s artifacts: "driver", this harness's sandboxed C
        driver; "gpu", a worker process per candidate (harness/gpu.py, imported where a GPU
        backend is first used)."""
        if backend.runner == "driver":  # a compiler missing here is a failed build, as any other
            return Line(self._verify, self._measure_on_driver, lambda _name, exc: _build_failed(exc))
        if backend.runner == "gpu":
            from swarmfactory.harness import gpu

            return Line(partial(gpu.verify, self), partial(gpu.measure, self), gpu.missing_tool)
        raise ValueError(f"backend {backend.name!r} runs on {backend.runner!r}: no line of this harness does")

    def _measure_on_driver(self, prep: Prepared) -> Verdict:
        """Interleaved timing against the baseline and the eager reference, in a fresh driver."""
        t0 = time.monotonic()
        with self.measure_lock, self._off_measure_cpus():
            self.baselines.hold_none()  # the last measurement's workers may be evicted now
            try:
                verdict = self._measure(prep)
                if verdict.speedup and self._implausible(verdict):
                    verdict = self._remeasure_audited(prep, verdict)
            except Rejected as rej:
                verdict = Verdict(rej.outcome, rej.detail, rej.stage, evidence=rej.evidence)
            finally:
                self.baselines.release()
        verdict.cases_checked = prep.cases_checked
        if "error_vs_torch" in prep.extra:  # the worst error over the cases, as a multiple of torch's
            verdict.evidence.setdefault("error_vs_torch", prep.extra["error_vs_torch"])
        verdict.seconds = prep.seconds + time.monotonic() - t0
        if prep.problem.note:
            verdict.flags.append(prep.problem.note)
        verdict.evidence.setdefault("isolation", prep.extra.get("isolation"))
        return verdict

    def evaluate(self, problem: Problem, source: str, cases: list[Case] | None = None,
                 measure: bool = True, backend: str | None = None) -> Verdict:
        prep = self.prepare(problem, source, cases, backend)
        if prep.rejected is not None:
            return self.rejected_verdict(prep)
        if not measure:
            return Verdict(Outcome.VERIFIED, "verified (not measured)", "verify",
                           cases_checked=prep.cases_checked, seconds=prep.seconds,
                           evidence={"isolation": prep.extra.get("isolation"),
                                     "error_vs_torch": prep.extra.get("error_vs_torch")})
        return self.measure(prep)

    @staticmethod
    def rejected_verdict(prep: Prepared) -> Verdict:
        rej = prep.rejected
        evidence = dict(rej.evidence)
        if prep.extra.get("isolation"):
            evidence.setdefault("isolation", prep.extra["isolation"])
        elif rej.stage in ("static", "build"):
            evidence.setdefault("isolation", "none: the candidate never ran")
        return Verdict(rej.outcome, rej.detail, rej.stage, evidence=evidence,
                       cases_checked=prep.cases_checked, seconds=prep.seconds)

    # -- internals ------------------------------------------------------------------------------
    def timed_threads(self) -> int:
        """The OpenMP threads a candidate is timed with: verification runs with as many, so the
        kernel cannot tell the two apart by its thread count (nor by anything in its environment)."""
        return len(self.config.cpus("measure"))

    def _process(self, artifact: Artifact, problem: Problem, arena: Arena, which: str,
                 threads: int | None = None) -> CandidateProcess:
        cpus = self.config.cpus(which)
        return CandidateProcess(artifact.path, problem.entry, arena, cpus, threads or self.timed_threads(),
                                mem_gb=self.config.mem_gb, seccomp=self.config.seccomp,
                                contain=self.config.contain, trace=self.config.trace,
                                load_timeout=self.config.case_timeout_s * 3)

    def _verify(self, prep: Prepared, cases: list[Case]) -> int:
        """Every case with the timed thread count; where that is one thread, the timed and stress
        shapes again with two (races show only with two or more)."""
        n = self._verify_pass(prep, cases, self.timed_threads())
        if self.timed_threads() < 2:
            stress = {slot_key(s) for s in prep.problem.stress_shapes}
            racy = [c for c in cases if c.dist == prep.problem.dists[0] and
                    (c.origin == "workload" or slot_key(c.shape) in stress)]
            if racy:
                self._verify_pass(prep, racy, 2)
        return n

    def _verify_pass(self, prep: Prepared, cases: list[Case], threads: int) -> int:
        problem = prep.problem
        shapes = {slot_key(c.shape): c.shape for c in cases}
        arena = Arena(sum(group_bytes(problem, s, 1, 0) for s in shapes.values()),
                      seed=int.from_bytes(os.urandom(4), "little"))
        try:
            layout = {k: SlotGroup(arena, problem, s, first=0, n=1) for k, s in shapes.items()}
            with self._process(prep.artifact, problem, arena, "verify", threads) as proc:
                prep.extra.setdefault("isolation", proc.isolation)
                n = verify(proc, layout, problem, cases, self.config.case_timeout_s, stats=prep.extra)
                proc.check_threads("verify")
                proc.check_contained("verify")
                return n
        finally:
            arena.close()

    def baseline_for(self, problem: Problem, shape) -> dict:
        key = (problem.name, problem.spec_hash(), slot_key(shape), self.config.compile_baselines)
        if key not in self._choices:
            record = self.store.get_baseline(problem, shape, self.config.compile_baselines) if self.store else None
            if record is None or "threads" not in record:
                record = self.baselines.choose(problem, shape, self.config.compile_baselines)
                if self.store:
                    self.store.put_baseline(problem, shape, self.config.compile_baselines, record)
            self._choices[key] = record
        return self._choices[key]

    def roofs(self) -> dict:
        """Reused from the store or this machine's cache where a recent, undisturbed record is
        there, else measured (half a minute) and recorded (roofline.known_or_measured)."""
        if self._roofs is None:
            self._roofs = known_or_measured(self.config.cpus("measure"), self.store)
        return self._roofs

    @contextlib.contextmanager
    def _off_measure_cpus(self):
        """This thread (it checks outputs and watches the counter while the candidate runs) keeps
        off the measurement CPUs where there are others."""
        own = os.sched_getaffinity(0)
        others = own - set(self.config.cpus("measure"))
        if others and others != own:
            os.sched_setaffinity(0, others)
        try:
            yield
        finally:
            if others and others != own:
                os.sched_setaffinity(0, own)

    def exchange_ns(self) -> float:
        """What one command costs the clock when the kernel does nothing: measured once, with a
        trusted no-op library in a driver on the measure CPUs (the least of 30 exchanges). A
        candidate's process cannot influence it, so it is safe to subtract from sync samples."""
        if self._exchange_ns is None:
            self._exchange_ns = measure_exchange(get_backend("c"), self.config.cpus("measure"))
        return self._exchange_ns

    def _remeasure_audited(self, prep: Prepared, first: Verdict) -> Verdict:
        """A figure over the plausible speedup or beyond the roofline is never the verdict: the
        roofs are measured again (they may be what was wrong: measured under load they come out
        low), then the kernel, with every sample's outputs checked and half the samples audits
        stopped at moments of the trusted clock's choosing; that audited figure is the verdict."""
        beyond = self._beyond_roof(first)
        if beyond:
            self._roofs = remeasure(self.config.cpus("measure"), self.roofs(), wait_s=5.0)
            if self.store:
                self.store.put_roofs(len(self.config.cpus("measure")), self._roofs)
        verdict = self._measure(prep, audited=True)
        why = "beyond the roofline" if beyond else f"over {self.config.suspicious_speedup}x"
        verdict.flags.append(f"suspicious: first measurement {first.speedup:.2f}x {why}; the verdict is "
                             "its re-measurement with every sample checked and half of them audits")
        verdict.evidence["first measurement"] = {"speedup": first.speedup, "why": why}
        return verdict

    def _dispatch_ns(self, worker, timeout: float) -> float | None:
        """What one call costs a Python caller around any op, in the baseline's own worker
        (measured once per worker)."""
        if id(worker) not in self._dispatch:
            worker.thaw()
            try:
                self._dispatch[id(worker)] = float(worker.request({"op": "dispatch"}, timeout, "measure (dispatch)")["ns"])
            except Rejected:
                self._dispatch[id(worker)] = None
            finally:
                worker.freeze()
        return self._dispatch[id(worker)]

    def _implausible(self, v: Verdict) -> bool:
        return v.speedup > self.config.suspicious_speedup or self._beyond_roof(v)

    @staticmethod
    def _beyond_roof(v: Verdict) -> bool:
        return "beyond the measured roof" in v.evidence

    def _measure(self, prep: Prepared, audited: bool = False) -> Verdict:
        problem, cfg = prep.problem, self.config
        timeout = max(30.0, cfg.case_timeout_s * 10)
        shapes = list(problem.workload)
        roofs = self.roofs() if problem.roofline else None
        rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
        per_shape = min(SYNC_SET_BYTES, ARENA_BUDGET // max(1, len(shapes)))
        total = 0
        for shape in shapes:
            slot_bytes = group_bytes(problem, shape, 1, False)
            sync = max(1, min(cfg.max_slots, per_shape // slot_bytes))
            total += group_bytes(problem, shape, cfg.rotate, 2) + group_bytes(problem, shape, sync, 2)
        arena = Arena(min(total, ARENA_BUDGET + (64 << 20)), seed=int(rng.integers(1 << 31)))
        try:
            with self._process(prep.artifact, problem, arena, "measure") as proc:
                prep.extra.setdefault("isolation", proc.isolation)
                timer = CandidateTimer(self, proc, arena, problem, rng, timeout, audited=audited)
                setups = [self._setup_shape(timer, problem, shape, i, per_shape, timeout)
                          for i, shape in enumerate(shapes)]
                pressure = (str(proc.containment.cgroup / "cpu.pressure")
                            if proc.containment.cgroup is not None else None)
                def ours() -> list[int]:  # this process, the candidate's driver, the baseline workers
                    return sorted({os.getpid(), proc.pid} | {w.proc.pid for s in setups for w in s["workers"].values()})
                log = run_rounds(timer, setups, cfg.rounds, timeout, min_clean_rounds(cfg.rounds), pressure,
                                 self.config.cpus("measure"), ours)
                proc.check_contained("measure")
        finally:
            arena.close()
        return decide(problem, setups, log, roofs, cfg, slot_key, _baseline_label,
                      between=between_spread(self.store, problem))

    def _setup_shape(self, timer: CandidateTimer, problem: Problem, shape, i: int,
                     per_shape: int, timeout: float) -> dict:
        cfg = self.config
        choice = self.baseline_for(problem, shape)
        per_call = timer.calibrate(shape, i)
        sample_ns = cfg.sample_ms * 1e6
        window_ns = max(sample_ns, 64 * per_call)  # >= 64 calls: the call in flight is noise
        if window_ns <= cfg.max_window_ms * 1e6:
            group, mode = timer.groups[i], "async"
        else:
            slot_bytes = group_bytes(problem, shape, 1, False)
            n = int(min(cfg.max_slots, max(1, per_shape // slot_bytes), max(1, math.ceil(sample_ns / per_call))))
            group, mode = timer.add_group(shape, i, n), "sync"
        key = slot_key(shape)
        slots = [f"t{j}-{key}" for j in range(group.n)]
        workers = {}
        # a multi-threaded yardstick is also timed on one thread in every round, and each round's
        # yardstick is the faster of the two (verdicts.yardstick_times): a team of threads can stall
        # waiting for one of its own (a wake-up the machine is slow to give: hundreds of times the
        # op's time, for a few rounds at a time, with nothing else running), and a stalled
        # yardstick must never make a candidate look faster than one thread of the same code
        single = (choice.get("threads") or 1) > 1
        # the chosen baseline's rivals are timed beside it in every round too, and each round's
        # yardstick is the fastest runner (baselines.rivals): a choice made from a few warm samples
        # can be the slower of two close contenders once the inputs rotate
        runners = {"baseline": choice, **({SINGLE: {**choice, "threads": 1}} if single else {}),
                   **{f"{RIVAL}{k + 1}": r for k, r in enumerate(rivals(choice))}}
        left_out: dict[str, str] = {}
        for j, slot in enumerate(slots):
            inputs = group.inputs(j)
            for name, r in list(runners.items()):
                try:
                    workers[name] = self.baselines.set_inputs(problem, r["name"], r["mode"], slot, inputs,
                                                              shape, r.get("threads"))
                except Exception as exc:
                    if name == "baseline":
                        raise
                    runners.pop(name)  # a rival that fails here is left out, said; the chosen one stands
                    workers.pop(name, None)
                    left_out[_baseline_label(r)] = str(exc)[:300]
            workers["reference"] = self.baselines.set_inputs(problem, EAGER_REFERENCE, "eager", slot,
                                                             inputs, shape, choice.get("threads"))
        # a baseline's sample lasts as long as the candidate's: the first calls after the other
        # contender ran find cold caches, and in a sample a third as long they weigh three times
        # as much (measured on Zen 3: the engine's 6528x640 Q8_0 matvec as a 1 ms yardstick read
        # 260-339 us a call, its own code as a 2-3 ms candidate 206-211 us)
        cand_ns = window_ns * 1.25 if mode == "async" else group.n * per_call
        target_ns = max(cfg.min_sample_ms * 1e6, cand_ns)
        iters = {}
        for name, w in workers.items():
            w.thaw()
            try:
                iters[name] = calibrate(w, slots, target_ns, timeout, f"measure ({name})")
            finally:
                w.freeze()
        # a native baseline's calls run in a C loop: no Python dispatch to take off
        dispatch = {name: None if workers[name].native else self._dispatch_ns(workers[name], timeout)
                    for name in runners}
        return {"shape": dict(shape), "group": group, "mode": mode, "slots": slots, "choice": choice,
                "runners": runners, "rivals_left_out": left_out, "per_call": per_call, "window_s": window_ns * 1e-9,
                "dispatch": dispatch,  # runner -> ns of one Python call around any op (None: native)
                "workers": workers, "iters": iters,
                "times": {"candidate": [], **{name: [] for name in runners}, "reference": []}}

    def close(self) -> None:
        self.baselines.close()
        if self.ledger is not None:
            lifecycle.stop_recording(self.ledger)


NOOP_KERNEL = "void sf_noop(void) {}\n"


def _build_failed(exc: BuildError) -> Rejected:
    return Rejected(Outcome.BUILD_FAILED, str(exc), "build", log=exc.log[-4000:])


def measure_exchange(backend, cpus: list[int], n: int = 30) -> float:
    """Nanoseconds of one command round trip (SIGCONT, one call of a no-op, reply, self-stop,
    waitpid) with a trusted library: the least of ``n``."""
    artifact = backend.build(NOOP_KERNEL, "sf_noop")
    arena = Arena(4096, seed=1)
    try:
        arena.write_slot(0, [])
        with CandidateProcess(artifact.path, "sf_noop", arena, cpus, len(cpus)) as proc:
            return float(min(proc.batch(0, 1, 1, 0, 10.0, "calibration") for _ in range(n)))
    finally:
        arena.close()


def _baseline_label(choice: dict) -> str:
    threads = choice.get("threads")
    how = "the engine's own C in a C loop" if choice.get("native") else choice["mode"]
    return f"{choice['name']} ({how}{f', {threads} threads' if threads else ''})"
