"""`engine tune`: search engine designs on this machine, keep the best verified one as a profile.

The loop is the kernel factory's (``swarm/contract.py``: the Tuner is a ``Factory`` that
proposes, keys and evaluates designs; ``drive`` owns dedupe, budget and deadline). Its parts:

- space.py: the problem and its design space (knobs declared on ``EngineConfig``, validity,
  render), searched by the kernel factory's agents as a kernel problem's knobs are;
- propose.py: what to evaluate next (re-qualifications, the design LLM, kernel-champion swaps,
  the agents' pool ranked by a cost model);
- evaluate.py: one design started, verified end to end and measured, behind the runner seam
  (runner.py: server.py's ``ServingRunner`` serves it for real, ``ReplayRunner`` replays
  recorded figures); screen.py prunes it on a short measurement first;
- confirm.py: a design that beats the champion is confirmed in a second, back-to-back round;
- records.py: everything read from and written to the evidence store.

The default design (what ``engine serve`` runs without a profile) is measured first and is the
baseline. At the end the champion is stored as this machine's profile for the model (the
evidence store's champion row for the problem ``engine:<model>``); ``engine serve`` picks it up
(profiles.py).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass

from swarmfactory.contention import BUSY
from swarmfactory.engine.config import EngineConfig
from swarmfactory.evidence.quality import busy
from swarmfactory.outcome import Outcome, Verdict
from swarmfactory.swarm.contract import Factory, done_future, drive

from . import design as D
from . import records
from .confirm import Confirmation
from .evaluate import Evaluated, evaluate
from .measure import Entry
from .propose import Pick, Proposer
from .runner import Runner, RunnerError
from .screen import Screen
from .server import ServingRunner
from .space import EngineSpace


class TuneError(ValueError):
    """A tune run that cannot start or resume; the message says why."""


@dataclass(frozen=True)
class TuneConfig:
    model: str | None = None
    weights: str = "q4_1"
    concurrency: tuple[int, ...] = (1, 16)
    workloads: tuple[tuple[int, int], ...] = ((128, 128), (1024, 128))
    prompts_per_stream: int = 2          # prompts per level = max(4, this x concurrency)
    time_s: float = 1200.0
    budget: int | None = None            # most designs to evaluate (None: time decides)
    ttft_p99_s: float | None = None      # ceiling at every level; None: none
    min_effect: float = 0.03
    seed: int = 0
    fixed: tuple[tuple[str, object], ...] = ()   # knobs the deployment fixes (e.g. threads)
    screen: float | None = 0.10          # screening: a design whose short first measurement is more than
                                         # this fraction below the champion's is not measured in full

    def __post_init__(self):
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise TuneError(f"concurrency levels must be >= 1, got {list(self.concurrency)}")
        for i, o in self.workloads:
            if i < 1 or o < 2:
                raise TuneError(f"a workload needs >= 1 input and >= 2 output tokens, got {i}x{o}")
        if self.weights not in ("fp32", "bf16", "q4_1"):
            raise TuneError(f"weights must be fp32, bf16 or q4_1, got {self.weights!r}")
        if self.time_s <= 0:
            raise TuneError("time must be positive")
        for name, val in self.fixed:
            if name not in D.KNOBS:
                raise TuneError(f"unknown design knob {name!r} (known: {', '.join(D.KNOBS)})")
            if val not in D.KNOBS[name]:
                raise TuneError(f"design knob {name}={val!r} is not one of {list(D.KNOBS[name])}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["concurrency"], d["workloads"] = list(self.concurrency), [list(w) for w in self.workloads]
        d["fixed"] = [list(f) for f in self.fixed]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TuneConfig":
        d = dict(d)
        d.pop("kind", None)
        d["concurrency"] = tuple(d["concurrency"])
        d["workloads"] = tuple(tuple(w) for w in d["workloads"])
        d["fixed"] = tuple(tuple(f) for f in d.get("fixed", ()))
        d.setdefault("screen", None)  # runs recorded before screening existed measured everything in full
        return cls(**d)

    def max_seq_len(self) -> int:
        return max(2048, max(i + o for i, o in self.workloads) + 16)

    def prompts(self, c: int) -> int:
        return max(4, self.prompts_per_stream * c)

    def screen_workloads(self) -> tuple[tuple[int, int], ...]:
        return self.workloads[:1]


def parse_workloads(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for item in text.split(","):
        a, sep, b = item.strip().lower().partition("x")
        if not sep or not a.isdigit() or not b.isdigit():
            raise TuneError(f"a workload is INPUTxOUTPUT tokens, e.g. 128x128; got {item.strip()!r}")
        out.append((int(a), int(b)))
    return tuple(out)


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise TuneError(f"concurrency is a comma list of integers, e.g. 1,16,64; got {text!r}") from None
    if not levels:
        raise TuneError("no concurrency level given")
    return levels


class NullProgress:
    def start(self, run_id: str, time_s: float, budget: int | None): ...
    def update(self, done: int, best: float, note: str): ...
    def stop(self): ...


class Tuner(Factory):
    """One tune run (see the module docstring). ``llm``: a DesignLLM (llm_designs.py) that proposes
    designs too, or None; ``runner``: how designs run (default: served for real, server.py)."""

    def __init__(self, cfg: TuneConfig | None, store, resume: str | None = None, progress=None, log=None,
                 llm=None, runner: Runner | None = None):
        from swarmfactory.engine.gguf_loader import resolve_model_path

        from .verify import model_digest

        self.store, self.progress, self.llm = store, progress or NullProgress(), llm
        self._log = log or (lambda msg: None)
        self.t0 = time.monotonic()
        if resume:
            try:
                cfg = TuneConfig.from_dict(records.resumable(store, resume))
            except ValueError as e:
                raise TuneError(str(e)) from None
        self.cfg, self.run_id = cfg, resume
        try:
            self.model_path = resolve_model_path(cfg.model)
        except Exception as e:  # ModelNotFound and friends
            raise TuneError(str(e)) from None
        self.base = EngineConfig(model=cfg.model, weights=cfg.weights, max_seq_len=cfg.max_seq_len())
        # the kernel factory's champions here: designs with kernels=champion / matvec=champion pin them
        self.champions = records.kernel_champions(store, cfg.model) if cfg.weights == "q4_1" else {}
        self.fixed = dict(cfg.fixed)
        for knob, problem in D.CHAMPION_KNOBS.items():
            if (D.champion_kernels(cfg.model, self.champions) if knob == "kernels"
                    else D.champion_native_matmul(cfg.model, self.champions) if knob == "qmatmul"
                    else problem in self.champions):
                continue
            if self.fixed.get(knob) == "champion":
                raise TuneError(f"{knob}=champion: no {problem} champion on this hardware in {store.shown} "
                                f"(swarmfactory run --problems {problem} makes one)")
            self.fixed[knob] = "builtin"
        self.problem = EngineSpace(self.model_path, model_digest(self.model_path), cfg, self.base, self.champions,
                                   self.fixed)
        self.runner = runner or ServingRunner(store.url)
        self.rng = random.Random(f"{cfg.seed}:{resume or ''}")
        self.proposer = Proposer(self.problem, self.rng, store.hardware, llm, self.log)
        self.confirmation = Confirmation(self.runner, cfg, self.log)
        self.entries: list[Entry] = []
        self.seen: set[str] = set()
        self.default: Entry | None = None
        self.champion: Entry | None = None
        self.prior_champion: Entry | None = None  # the profile an earlier session left
        self.evaluated = 0
        self.inconclusive = 0  # designs measured on a busy machine this session (no verdict on their speed)
        self.default_ok = False
        self.default_busy = False  # the default design's figures were measured on a busy machine

    def log(self, msg: str) -> None:
        m, sec = divmod(int(time.monotonic() - self.t0), 60)
        self._log(f"[{m:02d}:{sec:02d}] {msg}")

    def run(self) -> str:
        self.run_id = records.open_run(self.store, self.problem, self.run_id,
                                       {"kind": "engine-tune", **self.cfg.to_dict()})
        if self.llm is not None:
            self.llm.bind(self.store, self.run_id, self.problem.name)
        spent, self.evaluated, self.inconclusive = records.spent(self.store, self.problem, self.run_id)
        # the deadline runs from here: the runner's preparation (the reference, once per model file)
        # and the default design's measurement (the baseline) are spent from --time like every design
        self.deadline = time.monotonic() + max(0.0, self.cfg.time_s - spent)
        try:
            self.runner.open(self.model_path, self.deadline, self.log)
        except RunnerError as e:
            raise TuneError(str(e)) from None
        self._prior()
        self.progress.start(self.run_id, self.cfg.time_s, self.cfg.budget)
        status = "interrupted"
        try:
            if self.deadline <= time.monotonic():
                self.log(f"run {self.run_id} has no time left ({spent:.0f} s of {self.cfg.time_s:.0f} s spent): "
                         "closing it")
            else:
                self._loop()
            status = "finished"
        finally:
            self.progress.stop()
            if self.llm is not None:
                self.llm.close()
            self.runner.close()
            records.close_run(self.store, self.run_id, status)
        return self.run_id

    def _prior(self) -> None:
        """What the store holds (records.py ``prior``): designs never to evaluate again, the
        measured ones for the proposers, the profile so far; the agents' bandit as the run left it
        (on resume); designs on an earlier kernel champion queued for re-verification."""
        prior = records.prior(self.store, self.problem, self.run_id)
        self.seen |= prior.seen
        self.entries += prior.entries
        self.prior_champion = prior.champion
        for agent, outcome, champion in records.replay(self.store, self.problem, self.run_id):
            self.proposer.reward(agent, outcome, champion)
        self.proposer.requalify(self.entries, self.prior_champion, self.seen)

    def _loop(self) -> None:
        default = self.problem.build({})
        result = self._evaluate(default, "default design", baseline=True)
        if result.served is not None:
            result.served.close()
        verdict = result.verdict
        fit = verdict.evidence.get("fitness", 0.0)
        self.default_busy = bool(fit) and busy(verdict.evidence)
        if fit and verdict.outcome.correct:
            verdict.speedup = verdict.ci_low = verdict.ci_high = 1.0
            verdict.detail = verdict.detail or f"the default design: {fit:.1f} tok/s (geomean)"
            if self.default_busy:  # still the baseline (the figure there is), never the profile
                verdict.detail += " (the baseline all the same)"
        elif fit:  # failed verification, measured as the baseline users run today
            verdict.detail += f" (measured anyway as the baseline: {fit:.1f} tok/s geomean)"
        eid = records.record(self.store, self.problem, self.run_id, default, verdict, "default", "baseline", [],
                             purpose="baseline")
        self.seen.add(default.key)
        if not fit:
            raise TuneError(f"the default design could not be measured on this machine: {verdict.outcome.value}: "
                            f"{verdict.detail}")
        self.default = Entry(default, 1.0, fit, eid, verdict.evidence.get("screen_fitness"),
                             verdict.evidence.get("screen"), verdict.outcome.value, verdict.detail)
        self.default_ok = verdict.outcome.correct
        # the champion is the best *verified* design; the default counts only if it passed
        self.champion = self.default if self.default_ok else None
        prior = self.prior_champion
        if prior is not None and (self.champion is None or prior.ratio > 1.0):
            # measured in an earlier session: its ratio carries over, its fitness is rescaled to today's default
            prior.fitness = prior.ratio * fit
            prior.screen = None  # likewise its screening bar (screen.py)
            self.champion = prior
        if self.default_ok:
            self.entries.append(self.default)
        self.log(f"default design: {verdict.outcome.value}, {fit:.1f} tok/s (geomean over {self._pairs()} pairs)"
                 + ("" if self.default_ok and not self.default_busy else f"; {verdict.detail}"))
        self._costs, self._stop, self._pending = [], False, {}
        drive(self, budget=self.cfg.budget, deadline=self.deadline, done=self.evaluated)
        if self.champion is None:
            self.log("no design passed verification: no profile stored")
        elif self.champion is self.default and self.default_busy:
            self.log("the default design was measured on a busy machine: not stored as the profile")
        elif self.champion is self.default:
            records.crown(self.store, self.problem, self.default, self.run_id,
                          "no design beat the default design on this machine")
        self.log(self.busy_summary())

    def busy_summary(self) -> str:
        """The run's last word on contention: how many designs were inconclusive (busy machine)."""
        return (f"{self.inconclusive} design(s) inconclusive because the machine was busy (other processes took "
                f"over {BUSY:.0%} of the CPUs at a level after its repeats; a later tune measures them again)"
                + ("; the default design's figures were measured on a busy machine too" if self.default_busy else ""))

    def _evaluate(self, design: D.Design, note: str, baseline: bool = False) -> Evaluated:
        """``design`` evaluated (evaluate.py), screened against the bar as the run stands now."""
        def on_level(wl, lv):
            self.progress.update(self.evaluated, self._best_ratio(),
                                 f"{note}: {wl} c={lv['concurrency']} {lv['output_tok_s']:.1f} tok/s")

        screen = Screen(self.cfg, self.default, self.champion) if self.cfg.screen is not None else None
        return evaluate(self.runner, design, self.cfg, screen, deadline=self.deadline, baseline=baseline,
                        on_level=on_level)

    def _best_ratio(self) -> float:
        return self.champion.ratio if self.champion else 0.0

    def _pairs(self) -> int:
        return len(self.cfg.workloads) * len(self.cfg.concurrency)

    # -- the contract the loop drives (swarm/contract.py): a proposal is a Pick (design, agent, parents) --
    def key(self, prop: Pick) -> str:
        return prop.design.key

    def propose(self) -> Pick | None:
        costs = self._costs  # seconds per design so far: one that cannot finish in time is not started
        if costs and self.deadline - time.monotonic() < 0.75 * statistics.median(costs):
            self.log(f"{self.deadline - time.monotonic():.0f} s left, a design takes ~{statistics.median(costs):.0f} s: "
                     "stopping here")
            self._stop = True
            return None
        prop = self._propose()
        if prop is None:
            self.log("no new design left to try")
            self._stop = True
        return prop

    def _propose(self) -> Pick | None:
        return self.proposer.next(self.entries, self.default, self.champion, self.seen)

    def finished(self) -> bool:
        return self._stop

    def submit(self, prop: Pick):
        """Verify and measure a design (and confirm it against the champion where it won its first
        round), in place: one design at a time owns the machine's CPUs."""
        t_design = time.monotonic()
        self.evaluated += 1
        note = f"design {self.evaluated}"
        self.progress.update(self.evaluated, self._best_ratio(), f"{note}: {prop.design.describe()}")
        result = self._evaluate(prop.design, note)
        verdict, entry, new_champion = result.verdict, Entry(prop.design, 0.0, 0.0), False
        if result.pruned is not None and not result.pruned.busy and self.default.screen:
            # verified, measured briefly: the cost model learns its estimated ratio, not a failure
            entry.screen = result.pruned.evidence.get("screen_fitness")
            entry.ratio = verdict.speedup = result.pruned.ratio(self.default.screen)
        if result.served is not None:
            try:
                entry, new_champion = self.confirmation.judge(prop.design, verdict, result.served,
                                                              default=self.default, champion=self.champion,
                                                              deadline=self.deadline, note=note)
            finally:
                result.served.close()
        self._pending[prop.design.key] = (entry, new_champion, note)
        self._costs.append(time.monotonic() - t_design)
        return done_future(verdict)

    def complete(self, prop: Pick, verdict: Verdict) -> None:
        design, agent, parents = prop
        entry, new_champion, note = self._pending.pop(design.key)
        entry.outcome, entry.detail = verdict.outcome.value, verdict.detail
        entry.evaluation_id = records.record(self.store, self.problem, self.run_id, design, verdict, agent,
                                             "mutate" if parents else "sample", parents,
                                             self.proposer.rationale.get(design.key))
        if verdict.evidence.get("out_of_time"):  # unknown, not bad: neither learnt from nor rewarded
            self.log(f"{note}: {verdict.detail}")
            self._stop = True
            return
        self.proposer.reward(agent, verdict.outcome.value, new_champion)
        if verdict.outcome is Outcome.INCONCLUSIVE:  # likewise: measured on a busy machine
            self.inconclusive += 1
            self.log(f"{note} inconclusive: {verdict.detail} [{design.describe()}]")
            return
        self.entries.append(entry)
        self.log(f"{note} {verdict.outcome.value}: {verdict.detail} [{design.describe()}]")
        if new_champion:
            self.champion = entry
            records.crown(self.store, self.problem, entry, self.run_id, verdict.detail)
