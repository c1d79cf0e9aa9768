"""The harness: static checks -> build -> verify -> measure (re-verifying while timing).

``Harness.evaluate`` turns candidate source into a typed ``Verdict``; it never raises for
anything the candidate does. ``prepare`` (static, build, verify) may run on several threads at
once; ``measure`` takes a lock so one measurement runs at a time on this machine.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from swarmfactory.backends import BuildError, get_backend
from swarmfactory.backends.base import Artifact
from swarmfactory.harness.baselines import EAGER_REFERENCE, BaselinePool
from swarmfactory.harness.outcome import Outcome, Rejected, ShapeTiming, Verdict
from swarmfactory.harness.roofline import measure_roofs, roofline_seconds
from swarmfactory.harness.sandbox import Worker
from swarmfactory.harness.static import check_source
from swarmfactory.harness.timing import calibrate, geomean, median_ci, sample
from swarmfactory.harness.verify import CASES, compare, slot_key, verify
from swarmfactory.problems.spec import Case, Problem


@dataclass(frozen=True)
class HarnessConfig:
    rounds: int = 20                 # interleaved rounds per workload shape (MEASURING: >= 20)
    min_effect: float = 0.03         # `faster` needs CI low > 1 + min_effect
    min_sample_ms: float = 1.0       # each timed sample loops the call for at least this long
    case_timeout_s: float = 10.0     # one verification call; a hang past it is `timed_out`
    measure_cpus: tuple[int, ...] | None = None  # None: every CPU this process may use
    verify_cpus: tuple[int, ...] | None = None
    compile_baselines: bool = True   # also try torch.compile for every baseline
    suspicious_speedup: float = 10.0
    mem_gb: float = 8.0
    rotate: int = 2                  # distinct input sets per shape while timing
    refresh_every: int = 5           # new candidate inputs every N rounds (defeats result caches)
    bootstrap_resamples: int = 2000

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
            reason = check_source(source)
            if reason:
                raise Rejected(Outcome.CHEATED, f"static check: {reason}", "static")
            try:
                prep.artifact = self.backend.build(source, problem.name)
            except BuildError as exc:
                raise Rejected(Outcome.BUILD_FAILED, str(exc), "build", log=exc.log[-4000:]) from None
            with self._worker(prep.artifact, problem, "verify") as w:
                prep.cases_checked = verify(w, problem, cases, self.config.case_timeout_s)
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
                    verdict.flags.append(f"suspicious: first measurement {first.speedup:.2f}x "
                                         f"{'beyond the roofline' if self._beyond_roof(first) else 'over ' + str(self.config.suspicious_speedup) + 'x'}; re-measured")
            except Rejected as rej:
                verdict = Verdict(rej.outcome, rej.detail, rej.stage, evidence=rej.evidence)
        verdict.cases_checked = prep.cases_checked
        verdict.seconds = prep.seconds + time.monotonic() - t0
        return verdict

    def evaluate(self, problem: Problem, source: str, cases: list[Case] | None = None,
                 measure: bool = True) -> Verdict:
        prep = self.prepare(problem, source, cases)
        if prep.rejected is not None:
            return self.rejected_verdict(prep)
        if not measure:
            return Verdict(Outcome.NOT_FASTER, "verified (not measured)", "verify",
                           cases_checked=prep.cases_checked, seconds=prep.seconds)
        return self.measure(prep)

    @staticmethod
    def rejected_verdict(prep: Prepared) -> Verdict:
        rej = prep.rejected
        return Verdict(rej.outcome, rej.detail, rej.stage, evidence=rej.evidence,
                       cases_checked=prep.cases_checked, seconds=prep.seconds)

    # -- internals ------------------------------------------------------------------------------
    def _worker(self, artifact: Artifact, problem: Problem, which: str) -> Worker:
        cpus = self.config.cpus(which)
        # verification runs at least two OpenMP threads, even on one core, so races show
        threads = max(2, len(cpus)) if which == "verify" else len(cpus)
        w = Worker(cpus=cpus, mem_gb=self.config.mem_gb, torch_threads=threads)
        try:
            w.request({"op": "load_c", "path": artifact.path, "symbol": problem.name,
                       "args": [(a.name, a.kind, a.dtype) for a in problem.args]},
                      self.config.case_timeout_s * 3, "load")
        except Rejected as rej:
            w.close()
            if rej.outcome == Outcome.CRASHED and "worker error" in rej.detail:
                raise Rejected(Outcome.BUILD_FAILED, f"cannot load the library: {rej.detail}", "load") from None
            raise
        return w

    def baseline_for(self, problem: Problem, shape) -> dict:
        key = (problem.name, problem.spec_hash(), slot_key(shape), self.config.compile_baselines)
        if key not in self._choices:
            record = self.store.get_baseline(problem, shape, self.config.compile_baselines) if self.store else None
            if record is None:
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
        cand = self._worker(prep.artifact, problem, "measure")
        try:
            setups = []
            for i, shape in enumerate(shapes):
                choice = self.baseline_for(problem, shape)
                key = slot_key(shape)
                slots = [f"t{j}-{key}" for j in range(cfg.rotate)]
                current = {}
                for j, slot in enumerate(slots):
                    case = Case(dict(shape), seed=50_000 + 100 * i + j)
                    inputs, _ = CASES.get(problem, case)
                    cand.request({"op": "set", "slot": slot, "inputs": inputs,
                                  "out_shapes": problem.output_shapes(shape)}, timeout, "measure")
                    base = self.baselines.set_inputs(problem, choice["name"], choice["mode"], slot, inputs, shape)
                    ref = self.baselines.set_inputs(problem, EAGER_REFERENCE, "eager", slot, inputs, shape)
                    current[slot] = case
                contenders = {"candidate": cand, "baseline": base, "reference": ref}
                iters = {n: calibrate(w, slots, cfg.min_sample_ms * 1e6, timeout, f"measure ({n})")
                         for n, w in contenders.items()}
                setups.append({"shape": shape, "slots": slots, "current": current, "choice": choice,
                               "contenders": contenders, "iters": iters,
                               "times": {n: [] for n in contenders}})
            for r in range(cfg.rounds):
                for i, s in enumerate(setups):
                    if r and r % cfg.refresh_every == 0:
                        self._refresh(cand, problem, s, i, r, timeout)
                    order = list(s["contenders"]) if r % 2 == 0 else list(reversed(s["contenders"]))
                    for name in order:
                        per_call, reply = sample(s["contenders"][name], s["slots"], s["iters"][name],
                                                 timeout, f"measure ({name})", outputs=name == "candidate")
                        s["times"][name].append(per_call)
                        if name == "candidate":
                            self._reverify(problem, s, reply)
        finally:
            cand.close()
        return self._verdict(problem, setups, roofs)

    def _refresh(self, cand: Worker, problem: Problem, s: dict, i: int, r: int, timeout: float) -> None:
        for j, slot in enumerate(s["slots"]):
            case = Case(dict(s["shape"]), seed=60_000 + 1000 * r + 100 * i + j)
            inputs, _ = CASES.get(problem, case)
            cand.request({"op": "set", "slot": slot, "inputs": inputs,
                          "out_shapes": problem.output_shapes(s["shape"])}, timeout, "measure")
            s["current"][slot] = case

    @staticmethod
    def _reverify(problem: Problem, s: dict, reply: dict) -> None:
        for slot, outputs in reply["outputs"].items():
            case = s["current"][slot]
            _, expected = CASES.get(problem, case)
            bad = compare(problem, expected, outputs, f"timed {problem.shape_label(case.shape)} seed={case.seed}")
            if bad:
                raise Rejected(Outcome.CHEATED, "outputs produced while timing are wrong although "
                               f"verification passed: {bad}", "measure")

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
        baseline = ", ".join(sorted({f"{s['choice']['name']} ({s['choice']['mode']})" for s in setups}))
        faster = lo > 1.0 + cfg.min_effect
        outcome = Outcome.FASTER if faster else Outcome.NOT_FASTER
        detail = (f"{med:.3f}x the baseline [{lo:.3f}, {hi:.3f}] (geomean over {len(shapes)} shapes, "
                  f"{cfg.rounds} interleaved rounds); {vs_ref:.2f}x the eager reference")
        if not faster:
            detail += f"; needs CI low > {1 + cfg.min_effect:.2f}"
        return Verdict(outcome, detail, "measure", speedup=med, ci_low=lo, ci_high=hi,
                       vs_reference=vs_ref, roofline_fraction=geomean(fracs) if fracs else None,
                       baseline=baseline, shapes=shapes)

    def close(self) -> None:
        self.baselines.close()
