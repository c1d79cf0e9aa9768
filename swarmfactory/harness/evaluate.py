"""The harness: static checks -> build -> verify -> measure (re-verifying while timing).

``Harness.evaluate`` turns candidate source into a typed ``Verdict``; it never raises for
anything the candidate does. ``prepare`` (static, build, verify) may run on several threads at
once; ``measure`` takes a lock so one measurement runs at a time on this machine.

The candidate runs only in a fresh driver process per stage (candidate.py), locked down by a
system-call allow-list and contained by a cgroup where the machine allows. The trusted side
writes its inputs into shared memory, owns the clock, checks every output it reads back and
decides the verdict. See docs/architecture.md for the attack classes and what stops each.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from swarmfactory.backends import BuildError, get_backend
from swarmfactory.backends.base import Artifact, CheatError
from swarmfactory.harness.arena import Arena
from swarmfactory.harness.baselines import EAGER_REFERENCE, BaselinePool
from swarmfactory.harness.candidate import CandidateProcess
from swarmfactory.harness.outcome import Outcome, Rejected, ShapeTiming, Verdict
from swarmfactory.harness.roofline import measure_roofs, roofline_seconds
from swarmfactory.harness.slots import SlotGroup, group_bytes
from swarmfactory.harness.static import check_source
from swarmfactory.harness.timing import calibrate, geomean, median_ci, sample
from swarmfactory.harness.verify import check_slot, expected_for, slot_key, verify
from swarmfactory.problems.spec import Case, Problem

ARENA_BUDGET = 1 << 31   # bytes of shared memory one measurement may lay out


@dataclass(frozen=True)
class HarnessConfig:
    rounds: int = 20                 # interleaved rounds per workload shape (MEASURING: >= 20)
    min_effect: float = 0.03         # `faster` needs CI low > 1 + min_effect
    min_sample_ms: float = 1.0       # each timed sample of a baseline lasts at least this long
    sample_ms: float = 4.0           # a candidate's sample: 1-1.5x this, ended at a random moment
    case_timeout_s: float = 10.0     # one verification call; a hang past it is `timed_out`
    measure_cpus: tuple[int, ...] | None = None  # None: every CPU this process may use
    verify_cpus: tuple[int, ...] | None = None
    compile_baselines: bool = True   # also try torch.compile for every baseline
    suspicious_speedup: float = 10.0
    mem_gb: float = 8.0
    rotate: int = 3                  # input sets per shape while timing fast kernels
    max_slots: int = 32              # input sets per shape for slow kernels (each called once)
    bootstrap_resamples: int = 2000
    static_checks: bool = True       # the source filter: a first, cheap `cheated`
    seccomp: bool = True             # the system-call allow-list (the protection; tests may
    contain: bool = True             # switch a layer off to prove the next one holds)

    def cpus(self, which: str) -> list[int]:
        chosen = self.measure_cpus if which == "measure" else self.verify_cpus
        return list(chosen) if chosen else sorted(os.sched_getaffinity(0))


@dataclass
class Prepared:
    problem: Problem
    source: str
    artifact: Artifact | None = None
    cases_checked: int = 0
    rejected: Rejected | None = None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


class Harness:
    def __init__(self, config: HarnessConfig | None = None, store=None, backend: str = "c"):
        self.config = config or HarnessConfig()
        self.store = store
        self.backend = get_backend(backend)
        self.baselines = BaselinePool(self.config.cpus("measure"))
        self._choices: dict[tuple, dict] = {}
        self._roofs: dict | None = None
        self.measure_lock = threading.Lock()

    # -- stages ---------------------------------------------------------------------------------
    def prepare(self, problem: Problem, source: str, cases: list[Case] | None = None) -> Prepared:
        """Static checks, build, verification. Thread-safe."""
        t0 = time.monotonic()
        prep = Prepared(problem, source)
        cases = cases if cases is not None else problem.seed_cases()
        try:
            if not source.strip():
                raise Rejected(Outcome.BUILD_FAILED, "the source file is empty", "build")
            reason = check_source(source) if self.config.static_checks else None
            if reason:
                raise Rejected(Outcome.CHEATED, f"static check: {reason}", "static")
            try:
                prep.artifact = self.backend.build(source, problem.name, prototype=problem.c_prototype,
                                                   checks=self.config.static_checks)
            except CheatError as exc:
                raise Rejected(Outcome.CHEATED, f"static check: {exc}", "static") from None
            except BuildError as exc:
                raise Rejected(Outcome.BUILD_FAILED, str(exc), "build", log=exc.log[-4000:]) from None
            prep.cases_checked = self._verify(prep, cases)
        except Rejected as rej:
            prep.rejected = rej
        prep.seconds = time.monotonic() - t0
        return prep

    def measure(self, prep: Prepared) -> Verdict:
        """Interleaved timing against the baseline and the eager reference. One at a time."""
        t0 = time.monotonic()
        with self.measure_lock:
            try:
                verdict = self._measure(prep)
                if verdict.speedup and self._implausible(verdict):
                    first = verdict
                    verdict = self._measure(prep)
                    why = ("beyond the roofline" if self._beyond_roof(first)
                           else f"over {self.config.suspicious_speedup}x")
                    verdict.flags.append(f"suspicious: first measurement {first.speedup:.2f}x {why}; re-measured")
            except Rejected as rej:
                verdict = Verdict(rej.outcome, rej.detail, rej.stage, evidence=rej.evidence)
        verdict.cases_checked = prep.cases_checked
        verdict.seconds = prep.seconds + time.monotonic() - t0
        if prep.problem.note:
            verdict.flags.append(prep.problem.note)
        verdict.evidence.setdefault("isolation", prep.extra.get("isolation"))
        return verdict

    def evaluate(self, problem: Problem, source: str, cases: list[Case] | None = None,
                 measure: bool = True) -> Verdict:
        prep = self.prepare(problem, source, cases)
        if prep.rejected is not None:
            return self.rejected_verdict(prep)
        if not measure:
            return Verdict(Outcome.NOT_FASTER, "verified (not measured)", "verify",
                           cases_checked=prep.cases_checked, seconds=prep.seconds,
                           evidence={"isolation": prep.extra.get("isolation")})
        return self.measure(prep)

    @staticmethod
    def rejected_verdict(prep: Prepared) -> Verdict:
        rej = prep.rejected
        evidence = dict(rej.evidence)
        if prep.extra.get("isolation"):
            evidence.setdefault("isolation", prep.extra["isolation"])
        return Verdict(rej.outcome, rej.detail, rej.stage, evidence=evidence,
                       cases_checked=prep.cases_checked, seconds=prep.seconds)

    # -- internals ------------------------------------------------------------------------------
    def _process(self, artifact: Artifact, problem: Problem, arena: Arena, which: str) -> CandidateProcess:
        cpus = self.config.cpus(which)
        # verification runs at least two OpenMP threads, even on one core, so races show
        threads = max(2, len(cpus)) if which == "verify" else len(cpus)
        return CandidateProcess(artifact.path, problem.name, arena, cpus, threads,
                                mem_gb=self.config.mem_gb, seccomp=self.config.seccomp,
                                contain=self.config.contain, passive_wait=which == "verify",
                                load_timeout=self.config.case_timeout_s * 3)

    def _verify(self, prep: Prepared, cases: list[Case]) -> int:
        problem = prep.problem
        shapes = {slot_key(c.shape): c.shape for c in cases}
        arena = Arena(sum(group_bytes(problem, s, 1, False) for s in shapes.values()),
                      seed=int.from_bytes(os.urandom(4), "little"))
        try:
            layout = {k: SlotGroup(arena, problem, s, first=0, n=1) for k, s in shapes.items()}
            with self._process(prep.artifact, problem, arena, "verify") as proc:
                prep.extra["isolation"] = proc.isolation
                n = verify(proc, layout, problem, cases, self.config.case_timeout_s)
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
        """Measured once per harness (a few seconds; the machine's state today) and recorded."""
        if self._roofs is None:
            cpus = self.config.cpus("measure")
            self._roofs = measure_roofs(cpus)
            if self.store:
                self.store.put_roofs(len(cpus), self._roofs)
        return self._roofs

    def _implausible(self, v: Verdict) -> bool:
        return v.speedup > self.config.suspicious_speedup or self._beyond_roof(v)

    @staticmethod
    def _beyond_roof(v: Verdict) -> bool:
        return any((s.roofline_fraction or 0) > 1.0 for s in v.shapes)

    def _measure(self, prep: Prepared) -> Verdict:
        problem, cfg = prep.problem, self.config
        timeout = max(30.0, cfg.case_timeout_s * 10)
        shapes = list(problem.workload)
        roofs = self.roofs() if problem.roofline else None
        rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
        per_shape = ARENA_BUDGET // max(1, len(shapes))
        total = 0
        for shape in shapes:
            slot_bytes = group_bytes(problem, shape, 1, False)
            sync = max(1, min(cfg.max_slots, per_shape // slot_bytes))
            total += group_bytes(problem, shape, cfg.rotate, True) + group_bytes(problem, shape, sync, True)
        arena = Arena(min(total, ARENA_BUDGET + (64 << 20)), seed=int(rng.integers(1 << 31)))
        try:
            with self._process(prep.artifact, problem, arena, "measure") as proc:
                prep.extra.setdefault("isolation", proc.isolation)
                timer = _CandidateTimer(self, proc, arena, problem, rng, timeout)
                setups = [self._setup_shape(timer, problem, shape, i, per_shape, timeout)
                          for i, shape in enumerate(shapes)]
                for r in range(cfg.rounds):
                    for s in setups:
                        order = ["candidate", "baseline", "reference"]
                        if r % 2:
                            order.reverse()
                        for name in order:
                            if name == "candidate":
                                s["times"][name].append(timer.sample(s, r in (0, cfg.rounds - 1)))
                            else:
                                w = s["workers"][name]
                                w.thaw()
                                try:
                                    per_call, _ = sample(w, s["slots"], s["iters"][name], timeout,
                                                         f"measure ({name})")
                                finally:
                                    w.freeze()
                                s["times"][name].append(per_call)
                proc.check_contained("measure")
        finally:
            arena.close()
        return self._verdict(problem, setups, roofs)

    def _setup_shape(self, timer: "_CandidateTimer", problem: Problem, shape, i: int,
                     per_shape: int, timeout: float) -> dict:
        cfg = self.config
        choice = self.baseline_for(problem, shape)
        per_call = timer.calibrate(shape, i)
        sample_ns = cfg.sample_ms * 1e6
        if per_call * 64 <= sample_ns:
            group, mode = timer.groups[i], "async"
        else:
            slot_bytes = group_bytes(problem, shape, 1, False)
            n = int(min(cfg.max_slots, max(1, per_shape // slot_bytes), max(1, math.ceil(sample_ns / per_call))))
            group, mode = timer.add_group(shape, i, n), "sync"
        key = slot_key(shape)
        slots = [f"t{j}-{key}" for j in range(group.n)]
        workers = {}
        for j, slot in enumerate(slots):
            inputs = group.inputs(j)
            workers["baseline"] = self.baselines.set_inputs(problem, choice["name"], choice["mode"], slot,
                                                            inputs, shape, choice.get("threads"))
            workers["reference"] = self.baselines.set_inputs(problem, EAGER_REFERENCE, "eager", slot,
                                                             inputs, shape, choice.get("threads"))
        iters = {}
        for name, w in workers.items():
            w.thaw()
            try:
                iters[name] = calibrate(w, slots, cfg.min_sample_ms * 1e6, timeout, f"measure ({name})")
            finally:
                w.freeze()
        return {"shape": dict(shape), "group": group, "mode": mode, "slots": slots, "choice": choice,
                "workers": workers, "iters": iters, "times": {"candidate": [], "baseline": [], "reference": []}}

    def _verdict(self, problem: Problem, setups: list[dict], roofs: dict | None) -> Verdict:
        cfg = self.config
        shapes, round_ratios = [], []
        for s in setups:
            c = np.array(s["times"]["candidate"])
            b = np.array(s["times"]["baseline"])
            ref = np.array(s["times"]["reference"])
            med, lo, hi = median_ci(b / c, cfg.bootstrap_resamples)
            round_ratios.append(b / c)
            frac = None
            if roofs is not None:
                rl = problem.roofline(s["shape"])
                frac = roofline_seconds(roofs, rl.bytes, rl.flops) / (float(np.median(c)) * 1e-9)
            shapes.append(ShapeTiming(
                shape=dict(s["shape"]), candidate_us=float(np.median(c)) / 1e3,
                baseline_us=float(np.median(b)) / 1e3, reference_us=float(np.median(ref)) / 1e3,
                speedup=med, ci_low=lo, ci_high=hi, vs_reference=float(np.median(ref / c)),
                roofline_fraction=frac))
        per_round = np.exp(np.mean(np.log(np.vstack(round_ratios)), axis=0))
        med, lo, hi = median_ci(per_round, cfg.bootstrap_resamples)
        vs_ref = geomean([s.vs_reference for s in shapes])
        fracs = [s.roofline_fraction for s in shapes if s.roofline_fraction]
        baseline = ", ".join(sorted({_baseline_label(s["choice"]) for s in setups}))
        faster = lo > 1.0 + cfg.min_effect
        outcome = Outcome.FASTER if faster else Outcome.NOT_FASTER
        detail = (f"{med:.3f}x the baseline [{lo:.3f}, {hi:.3f}] (geomean over {len(shapes)} shapes, "
                  f"{cfg.rounds} interleaved rounds); {vs_ref:.2f}x the eager reference")
        if not faster:
            detail += f"; needs CI low > {1 + cfg.min_effect:.2f}"
        evidence = {"timing": {slot_key(s["shape"]): {"mode": s["mode"], "sets": s["group"].n}
                               for s in setups}}
        return Verdict(outcome, detail, "measure", speedup=med, ci_low=lo, ci_high=hi,
                       vs_reference=vs_ref, roofline_fraction=geomean(fracs) if fracs else None,
                       baseline=baseline, shapes=shapes, evidence=evidence)

    def close(self) -> None:
        self.baselines.close()


def _baseline_label(choice: dict) -> str:
    threads = choice.get("threads")
    return f"{choice['name']} ({choice['mode']}{f', {threads} threads' if threads else ''})"


class _CandidateTimer:
    """Lays out a shape's input sets for the candidate and takes its timed samples.

    Fast kernels (>= 64 calls per sample) run in ``async`` mode: calls rotate over a few input
    sets, one unit of every input replaced before each call, until the trusted side stops the
    process at a random moment; the driver's call counter must agree with the replayed inputs,
    and the outputs of every set but the one in flight are checked. Slow kernels run in ``sync``
    mode: one call on each of up to ``max_slots`` sets, all inputs checked, outputs of a random
    subset. Outputs are checked in every sample while the reference costs less than the sample,
    else in a random subset of at least a quarter of them (and always in the first and last
    round): the candidate cannot know which.
    """

    def __init__(self, harness: Harness, proc: CandidateProcess, arena: Arena, problem: Problem,
                 rng: np.random.Generator, timeout: float):
        self.h, self.proc, self.arena, self.problem, self.rng = harness, proc, arena, problem, rng
        self.timeout = timeout
        self.groups: dict[int, SlotGroup] = {}
        self.next_slot = 0
        self.check_cost: dict[int, float] = {}

    def _new_group(self, shape, i: int, n: int) -> SlotGroup:
        donors = self.problem.case_inputs(Case(dict(shape), seed=int(self.rng.integers(1 << 40))))
        group = SlotGroup(self.arena, self.problem, shape, self.next_slot, n, donors=donors)
        self.next_slot += n
        for j in range(n):
            case = Case(dict(shape), seed=int(self.rng.integers(1 << 40)))
            group.load(j, self.problem.case_inputs(case))
        return group

    def add_group(self, shape, i: int, n: int) -> SlotGroup:
        self.groups[i] = self._new_group(shape, i, n)
        return self.groups[i]

    def calibrate(self, shape, i: int) -> float:
        """Nanoseconds per call (an upper bound: it includes the exchange's overhead)."""
        group = self.add_group(shape, i, self.h.config.rotate)
        iters, target = group.n, self.h.config.min_sample_ms * 1e6
        self.proc.batch(group.first, group.n, group.n, int(self.rng.integers(1 << 62)), self.timeout,
                        "measure (warm-up)")
        while True:
            seed = int(self.rng.integers(1 << 62))
            ns = self.proc.batch(group.first, group.n, iters, seed, self.timeout, "measure (calibration)")
            self._reload(group)
            if ns >= target or iters >= 1 << 24:
                # the least of three: one slow exchange on a busy machine must not pick the mode
                for _ in range(2):
                    seed = int(self.rng.integers(1 << 62))
                    ns = min(ns, self.proc.batch(group.first, group.n, iters, seed, self.timeout,
                                                 "measure (calibration)"))
                    self._reload(group)
                return ns / iters
            iters = int(-(-max(iters * 2, iters * target / max(ns, 1.0) * 1.2) // group.n) * group.n)

    def _reload(self, group: SlotGroup) -> None:
        for j in range(group.n):
            group.load(j, group.inputs(j))

    def sample(self, s: dict, always_check: bool) -> float:
        group: SlotGroup = s["group"]
        seed = int(self.rng.integers(1 << 62))
        where = f"timed {self.problem.shape_label(s['shape'])}"
        if s["mode"] == "async":
            seconds = self.h.config.sample_ms * 1e-3 * float(self.rng.uniform(1.0, 1.5))
            calls, ns = self.proc.run_for(group.first, group.n, seed, seconds, self.timeout, "measure",
                                          min_calls=4 * group.n)
            if calls < 1:
                raise Rejected(Outcome.TIMED_OUT, f"no call completed in {self.timeout:.0f} s of timing "
                               f"on {where} (calibration measured far less)", "measure")
            in_flight = calls % group.n
            idx = np.arange(calls + 1)
            for j in range(group.n):
                mine = idx[idx % group.n == j]
                done = mine[mine < calls]
                if j == in_flight:
                    self._check_in_flight(group, j, seed, done, calls, where)
                    continue
                group.replay(j, seed, done)
                self._check(group, j, s, where + f" (set {j}, after {len(done)} calls)", always_check)
            self.proc.halt(self.timeout, "measure")
            self._reload(group)
            return ns / calls
        ns = self.proc.batch(group.first, group.n, group.n, seed, self.timeout, "measure")
        checked = set(self.rng.choice(group.n, size=min(2, group.n), replace=False).tolist())
        for j in range(group.n):
            group.replay(j, seed, np.array([j]))
            if j in checked:
                self._check(group, j, s, where + f" (set {j})", always_check)
            else:
                self._check_inputs(group, j, where)
        for j in range(group.n):
            group.poison(j)
        return ns / group.n

    def _check_inputs(self, group: SlotGroup, j: int, where: str) -> None:
        damage = group.damage(j)
        if damage:
            raise Rejected(Outcome.WRONG, f"{damage} on {where} (an out-of-bounds write)", "measure")
        changed = group.changed_inputs(j)
        if changed:
            raise Rejected(Outcome.CHEATED, f"while timed, the inputs of {where} differ from what the "
                           f"harness wrote (`{changed[0]}` changed: the kernel wrote to an input, or "
                           "the call counter was forged)", "measure")

    def _check_in_flight(self, group: SlotGroup, j: int, seed: int, done: np.ndarray, calls: int,
                         where: str) -> None:
        """The set whose call the stop interrupted: inputs as after ``done`` or one call more;
        its output may be half written and is not checked."""
        before = group.replayed(j, seed, done)
        after = group.replayed(j, seed, np.append(done, calls))
        for name in before:  # the stop may fall between two inputs' mutations
            if group.equals(j, name, before[name]):
                group.copies[j][name] = before[name]
            elif group.equals(j, name, after[name]):
                group.copies[j][name] = after[name]
            else:
                group.copies[j][name] = before[name]
                self._check_inputs(group, j, where)
        damage = group.damage(j)
        if damage:
            raise Rejected(Outcome.WRONG, f"{damage} on {where} (an out-of-bounds write)", "measure")

    def _check(self, group: SlotGroup, j: int, s: dict, where: str, always: bool) -> None:
        self._check_inputs(group, j, where)
        cost = self.check_cost.get(id(group))
        sample_s = self.h.config.sample_ms * 1e-3
        if not always and cost is not None and cost > sample_s:
            if self.rng.random() > max(0.25, sample_s / cost):
                return
        t0 = time.perf_counter()
        data = expected_for(self.problem, group.inputs(j))
        try:
            check_slot(group, j, self.problem, data, where, "measure")
        except Rejected as rej:
            raise Rejected(Outcome.CHEATED, "outputs produced while timing are wrong although "
                           f"verification passed: {rej.detail}", "measure") from None
        self.check_cost[id(group)] = time.perf_counter() - t0
