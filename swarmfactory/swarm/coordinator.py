"""The coordinator: the loop that turns agent proposals into evidence and champions.

The coordinator is a ``Factory`` of ``swarm/contract.py``, whose ``drive`` is the loop (the engine
factory's tuner runs on the same one). Per turn: pick a problem (round robin), ask agents in
bandit order for a proposal, drop duplicates (content hash, across runs on this hardware and
validation set), submit to the executor, and when a verdict returns: record it (its own
transaction), let it compete for the title (swarm/succession.py: only a ``faster`` verdict
measured on a machine that was not busy takes it), reward the agent. A candidate whose verdict
was ``inconclusive`` (the machine too busy to time it) is measured again later, up to
``RETRIES`` times. A ``kill -9`` loses only the evaluations in flight; ``resume`` continues the
run with the budget it had left. At the end each champion is re-measured before it is announced:
confirmed, kept unconfirmed, or demoted and succeeded by a fresh re-measure of the best retained
candidate.
The analyst turns the evidence into lessons at the start, every ``ANALYST_EVERY`` evaluations of
a problem, after each test of a lesson from elsewhere (agents/hypothesis.py) and at the end; the
boards carry the lessons that apply (prompt lines, knob priors).

Several coordinators may share one store: each claims a lease on a candidate before submitting
it (evidence/leases.py) and releases it once the verdict is recorded, so none evaluates a
candidate another holds or has done; leases of a coordinator that died expire and are taken over.
Everything per hardware (dedupe, champions) is keyed by the hardware the executor measures on.
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

from swarmfactory.adversary import Adversary
from swarmfactory.agents import make_agents
from swarmfactory.agents.base import Board, Entry, Proposal, knob_key
from swarmfactory.config import RunConfig
from swarmfactory.evidence.leases import CLAIMED, Leases
from swarmfactory.evidence.quality import weight
from swarmfactory.evidence.rows import CandidateRow
from swarmfactory.evidence.store import Store, StoreWriteError
from swarmfactory.harness.evaluate import Harness, HarnessConfig
from swarmfactory.outcome import CORRECT, MEASURED, Outcome, Verdict
from swarmfactory.knowledge.analyst import Analyst
from swarmfactory.knowledge.costmodel import evidence_rows
from swarmfactory.knowledge.priors import Knowledge, knowledge_for
from swarmfactory.llm.client import ChatClient, LLMError, parse_endpoint
from swarmfactory.problems import Problem, resolve_problems
from swarmfactory.swarm.bandit import Bandit
from swarmfactory.swarm.contract import Factory, drive, result
from swarmfactory.swarm.executors import Executor, ExecutorError, make_executor
from swarmfactory.swarm.succession import contend, rank_by_best, reverify_and_succeed
from swarmfactory.validation import drawn_evidence, validation_set


ADVERSARY_EVERY = 8      # evaluations of a problem between adversary turns (and after a new champion)
ADVERSARY_TARGETS = 3    # retained candidates the adversary aims at: the champion and the next best
RETRIES = 2              # an inconclusive candidate is measured again at most this many times
RETRY_AFTER_S = 20.0     # ... and not before this long after its inconclusive verdict
PROPOSALS_PER_ASK = 3    # ask for a few, so one duplicate does not cost the agent its turn
ANALYST_EVERY = 10       # evaluations of a problem between analyst passes (also at the start and the end)
DURATIONS_KEPT = 8       # an evaluation's expected duration: the median of a problem's last this many
ORPHANS_EVERY = 5.0      # seconds between looks for expired leases of dead coordinators to take over

log = logging.getLogger(__name__)


def kept_durations(kept: list[float], outcome, seconds: float | None) -> list[float]:
    """``kept`` with one more evaluation's seconds where it was measured (a rejection ends early:
    not what a keeper costs), the last ``DURATIONS_KEPT``: what an evaluation is expected to take."""
    return (kept + [seconds])[-DURATIONS_KEPT:] if seconds and outcome in MEASURED else kept


def typical_seconds(evaluations) -> float | None:
    """The median of ``kept_durations`` over recorded evaluations, oldest first (None: none measured)."""
    kept: list[float] = []
    for e in evaluations:
        kept = kept_durations(kept, e.outcome, e.seconds)
    return statistics.median(kept) if kept else None


class RunError(ValueError):
    """A run that cannot start or resume; the message says why."""


@dataclass
class ProblemState:
    problem: Problem
    cases: list
    vversion: str
    entries: list[Entry] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    champion: Entry | None = None
    exhausted: bool = False
    pending: dict[str, Entry] = field(default_factory=dict)  # in flight, by candidate id
    since_adversary: int = 0
    since_analysis: int = 0
    knowledge: Knowledge = field(default_factory=Knowledge)   # lessons that apply, as the board carries them
    draw: int = 0  # the next draw of full-size model cases (Problem.model_cases); one per evaluation
    # candidates whose verdict was ``inconclusive`` (the machine too busy to time them): measured
    # again once their time comes (monotonic seconds), at most ``RETRIES`` times each
    retry: list[tuple[float, Proposal, str, int]] = field(default_factory=list)
    # seconds its measured evaluations took on this machine: the last ones recorded here, then this run's
    seconds: list[float] = field(default_factory=list)


@dataclass
class Job:
    """One proposal in the loop: its problem, the proposal, its candidate id; ``orphan``: taken
    over from a coordinator that died (evaluated whatever this one has seen). Set at submit: the
    validation set it is verified on and the lease's attempts."""

    st: ProblemState
    prop: Proposal
    cid: str
    orphan: bool = False
    vversion: str | None = None
    attempts: int = 0
    draw: int | None = None
    drawn: list = field(default_factory=list)  # the model cases drawn for it, beside the validation set
    retry: int = 0   # > 0: measured again after that many inconclusive verdicts (no lease: it is ours)


class NullProgress:
    def start(self, run_id, total, time_s, problems): ...
    def update(self, done, champions, counts): ...
    def stop(self): ...


class Coordinator(Factory):
    def __init__(self, config: RunConfig, store: Store, resume: str | None = None,
                 progress=None, executor: Executor | None = None):
        self.store, self.progress = store, progress or NullProgress()
        self._new_limits: dict = {}
        if resume:
            row = store.run(resume)
            if row is None:
                raise RunError(f"no run {resume!r} in {store.shown}")
            if row.status == "finished":
                raise RunError(f"run {resume} already finished; start a new run (its champions carry over)")
            self.run_id = resume
            # the recorded configuration, but a budget or time limit given now replaces the recorded one
            self._new_limits = {k: getattr(config, k) for k in ("budget", "time_s")
                                if config is not None and getattr(config, k) is not None}
            config = RunConfig.build(**{**row.config, **self._new_limits})
            self._check_limits_left(config)
        else:
            self.run_id = None
        self.config = config
        self.problems = resolve_problems(",".join(config.problems))
        self.agents = {a.name: a for a in make_agents(config.agents)}
        self.adversary = Adversary() if "adversary" in config.agents else None
        if "llm" in config.agents and not config.llm:
            raise RunError("--agents includes llm but no endpoint was given: add --llm local, "
                           "--llm openai:MODEL or --llm http://HOST:PORT/v1 --llm-model NAME")
        try:  # fail early on a bad endpoint or a missing key, before any work
            for spec in config.llm:
                if spec != "local":
                    ChatClient(parse_endpoint(spec, config.llm_model))
        except LLMError as exc:
            raise RunError(str(exc)) from None
        if not self.agents and not config.llm:
            raise RunError("no agents to propose kernels; use --agents default")
        self.local_engine = None
        self.rng = random.Random(f"{config.seed}:{resume or ''}")
        self.bandit = Bandit(list(self.agents), self.rng)
        measure, verify = self._cpu_split(config.parallel)
        self.harness = Harness(HarnessConfig(rounds=config.rounds, min_effect=config.min_effect,
                                             objective=config.objective,
                                             compile_baselines=config.compile_baselines,
                                             measure_cpus=measure, verify_cpus=verify), store=store)
        try:
            self.executor = executor or make_executor(config, self.harness, store.url)
        except ExecutorError as exc:
            raise RunError(str(exc)) from None
        hw = self.executor.hardware
        if hw is not None and hw["id"] != store.hardware["id"]:  # measured elsewhere: keyed by that hardware
            self.store = store = store.on_hardware(hw)
            self.harness.store = store
        self.leases: Leases | None = None
        self._orphans_at = 0.0
        self.counts: Counter = Counter()
        self.duplicates = 0
        self._lead_failures: set[str] = set()   # agents whose leads() raised (warned once)
        self.analyst = Analyst(store)
        self.lessons_written = 0
        self.states: dict[str, ProblemState] = {}
        self._stops_reported: set[str] = set()

    @staticmethod
    def _cpu_split(parallel: int):
        cpus = sorted(os.sched_getaffinity(0))
        if parallel > 1 and len(cpus) >= 2:
            return (cpus[-1],), tuple(cpus[:-1])  # measurements pinned apart from builds
        return None, None

    # -- state ----------------------------------------------------------------------------------
    def _load_state(self) -> dict[str, ProblemState]:
        states = {}
        hw = self.store.hardware["id"]
        for p in self.problems:
            self.store.record_problem(p)
            cases, vversion = validation_set(p, self.store)
            evs = self.store.evaluations(problem=p.name, this_hardware=True)
            # draws continue where the evaluations recorded here left off, so runs go on round the cycle
            st = ProblemState(p, cases, vversion, draw=len(evs))
            for ev in evs:
                if ev.problem_spec != p.spec_hash() or ev.hardware_id != hw:
                    continue
                if ev.validation_version == vversion:
                    st.seen.add(ev.candidate_id)
                cand = self.store.candidate(ev.candidate_id)
                st.seconds = kept_durations(st.seconds, ev.outcome, ev.seconds)
                if cand is not None and ev.purpose in ("search", "eval"):
                    st.entries.append(self._entry(cand, ev.outcome.value, ev.speedup, ev.detail,
                                                  weight(ev.speedup, ev.ci_low, ev.ci_high, ev.evidence)))
            self._sync_champion(st)
            states[p.name] = st
        return states

    @staticmethod
    def _entry(cand: CandidateRow, outcome: str, speedup, detail: str, quality: float = 1.0) -> Entry:
        return Entry(cand.id, cand.knobs, outcome, speedup, cand.agent, cand.generation, detail, quality)

    def _sync_champion(self, st: ProblemState) -> None:
        """The board's champion: the store's (another coordinator on this hardware, an ``eval``
        or a re-measure may have changed it), at its confirmed figure."""
        champ = self.store.champion(st.problem)
        cand = self.store.candidate(champ.candidate_id) if champ else None
        st.champion = self._entry(cand, Outcome.FASTER.value, champ.speedup, "champion") if cand else None

    def _check_limits_left(self, config: RunConfig) -> None:
        """A resumed run's new limits must leave it something to do (they count the whole run)."""
        if "budget" in self._new_limits and self._done_in_run() >= config.budget:
            raise RunError(f"run {self.run_id} already made {self._done_in_run()} evaluations: --budget {config.budget} "
                           "leaves none (the budget counts the whole run): give a larger --budget")
        if "time_s" in self._new_limits and self._elapsed_before() >= config.time_s:
            raise RunError(f"run {self.run_id} already ran {self._elapsed_before():.0f} s: --time {config.time_s:g}s "
                           "leaves none (the time counts the whole run): give a longer --time")

    def _done_in_run(self) -> int:
        return sum(1 for e in self.store.evaluations(run_id=self.run_id) if e.purpose == "search")

    def _replay_bandit(self) -> None:
        champs = {r.candidate_id for p in self.problems for r in self.store.champion_history(p.name)
                  if r.run_id == self.run_id}
        for ev in self.store.evaluations(run_id=self.run_id):
            cand = self.store.candidate(ev.candidate_id)
            if ev.purpose == "search" and cand and cand.agent in self.agents:
                self.bandit.reward(cand.agent, ev.outcome.value, ev.candidate_id in champs)
                self.counts[ev.outcome.value] += 1

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> str:
        cfg = self.config
        if self.run_id is None:
            self.run_id = self.store.create_run(cfg.model_dump())
            elapsed = 0.0
        else:
            self.store.set_run_status(self.run_id, "running")
            if self._new_limits:  # what show, report and a later --resume read
                self.store.set_run_config(self.run_id, cfg.model_dump())
            elapsed = self._elapsed_before()
            self._replay_bandit()
        own_cpus = os.sched_getaffinity(0)
        if self.harness.config.verify_cpus:  # builds and references stay off the measurement CPU
            os.sched_setaffinity(0, self.harness.config.verify_cpus)
        self._start_llm_agents()
        for agent in self.agents.values():
            agent.bind(self.store, self.run_id)
        states = self.states = self._load_state()
        self.leases = Leases(self.store, self.run_id, cfg.lease_s)
        self.leases.start()
        self._learn(states.values())  # lessons from earlier evidence, before the first proposal
        self._done = self._done_in_run()
        deadline = time.monotonic() + cfg.time_s - elapsed if cfg.time_s else None
        self.progress.start(self.run_id, cfg.budget, cfg.time_s, [p.name for p in self.problems])
        self._turn, self._in_flight = 0, 0
        status = "finished"
        try:
            drive(self, parallel=cfg.parallel, budget=cfg.budget, deadline=deadline, done=self._done,
                  on_progress=lambda done: self.progress.update(done, self._champion_speedups(states), self.counts))
            stopped = self._all_stopped()
            if stopped:  # nobody left to propose: the run cannot do what it was asked (resumable)
                raise RunError("every agent stopped: " + "; ".join(stopped))
            for st in states.values():  # what the run retained since the adversary's last turn faces it
                if st.since_adversary:  # before the run ends, crowned or not (a busy machine crowns nothing)
                    self._adversary_turn(st)
            if cfg.remeasure_champions:
                self._remeasure(states)
            self._learn(states.values())
        except BaseException:  # Ctrl-C, every agent stopped, a store that takes no more writes
            status = "interrupted"
            self.executor.shutdown(wait=False)
            raise
        finally:
            if self.leases is not None:  # what was not recorded is free for others at once
                self.leases.stop(abandon_held=True)
            self.progress.stop()
            self._stop_llm_agents()
            os.sched_setaffinity(0, own_cpus)
            try:
                self.store.set_run_status(self.run_id, status)
            except StoreWriteError:
                pass  # kept in the store's journal; the error that ends the run says so
            if status == "finished":
                self.executor.shutdown()
            self.harness.close()
        return self.run_id

    def _start_llm_agents(self) -> None:
        from swarmfactory.agents.llm import LLMAgent

        cfg = self.config
        if not cfg.llm:
            return
        local_url = None
        if "local" in cfg.llm:
            from swarmfactory.llm.local import LocalEngine

            verify = self.harness.config.verify_cpus
            self.local_engine = LocalEngine(cpus=list(verify) if verify else None,
                                            threads=len(verify) if verify else None,
                                            max_batch=cfg.llm_concurrency)
            local_url = self.local_engine.url
        for spec in cfg.llm:
            ep = parse_endpoint(spec, None if spec == "local" else cfg.llm_model, local_url)
            client = ChatClient(ep, timeout_s=cfg.llm_timeout_s, concurrency=cfg.llm_concurrency,
                                cost_cap_usd=cfg.llm_cost_cap if ep.paid else None)
            agent = LLMAgent(client, concurrency=cfg.llm_concurrency, max_tokens=cfg.llm_max_tokens)
            self.agents[agent.name] = agent
            self.bandit.add(agent.name)

    def _stop_llm_agents(self) -> None:
        for agent in self.agents.values():
            agent.close()
        if self.local_engine is not None:
            self.local_engine.stop()
            self.local_engine = None

    def _elapsed_before(self) -> float:
        run = self.store.run(self.run_id)
        evs = self.store.evaluations(run_id=self.run_id)
        if not evs:
            return 0.0
        start, last = run.created_at, evs[-1].created_at
        return max(0.0, (last - start).total_seconds())

    # -- the contract the loop drives (swarm/contract.py) ----------------------------------------
    def key(self, job: Job) -> str:
        return f"{job.st.problem.name}/{job.cid}"

    def fresh(self, job: Job) -> bool:
        return job.orphan or job.retry > 0 or job.cid not in job.st.seen

    def mark(self, job: Job) -> None:
        job.st.seen.add(job.cid)

    def propose(self) -> Job | None:
        self._report_stops()
        cfg = self.config
        budget_left = cfg.budget and cfg.budget - self._done - self._in_flight
        job = (self._orphan_job(self.states) or self._retry_job(self.states)
               or self._next_job(self.states, self._turn, budget_left))
        self._turn += 1
        return job

    def submit(self, job: Job):
        st, prop, cid = job.st, job.prop, job.cid
        if job.retry:  # measured here before, inconclusive: its lease is done, the measurement ours
            attempts = 1
        else:
            claim = self.leases.claim(st.problem, cid, st.vversion)
            if claim.status != CLAIMED:  # another coordinator holds it or has done it
                self.duplicates += 1
                return None
            attempts = claim.attempts
        self.store.record_candidate(prop.record(st.problem, self.run_id))  # a taker-over finds its source
        st.pending[cid] = Entry(cid, prop.knobs, "pending", None, prop.agent, prop.generation)
        job.vversion, job.attempts = st.vversion, attempts
        job.draw, st.draw = st.draw, st.draw + 1
        job.drawn = st.problem.model_cases(job.draw)
        self._in_flight += 1
        return self._submit(st.problem, prop.source, st.cases + job.drawn, {"backend": prop.backend})

    def _submit(self, problem: Problem, source: str, cases: list, cand: CandidateRow | dict):
        """The executor's evaluation of a candidate in the backend it is written in: the problem's,
        or another the problem takes (a CUDA or PTX kernel of a Triton problem, from `eval`)."""
        backend = problem.backend_of(cand)
        extra = {"backend": backend} if backend != problem.backend else {}  # the common case: as before
        return self.executor.submit(problem, source, cases, **extra)

    def complete(self, job: Job, verdict: Verdict) -> None:
        st = job.st
        self._in_flight -= 1
        self._done += 1
        st.seconds = kept_durations(st.seconds, verdict.outcome, verdict.seconds)
        st.pending.pop(job.cid, None)
        if job.attempts > 1:
            verdict.evidence["lease"] = f"taken over after {job.attempts - 1} expired lease(s)"
        if job.drawn:
            verdict.evidence["model_draw"] = drawn_evidence(job.draw, job.drawn)
        if job.retry:
            verdict.evidence["retry"] = f"measured again after {job.retry} inconclusive verdict(s)"
        if verdict.outcome == Outcome.INCONCLUSIVE and job.retry < RETRIES:
            st.retry.append((time.monotonic() + RETRY_AFTER_S, job.prop, job.cid, job.retry + 1))
        if self._complete(st, job.prop, job.cid, verdict, job.vversion) or st.since_adversary >= ADVERSARY_EVERY:
            self._adversary_turn(st)
        self._keep_drawn_failure(st, job, verdict)
        if st.since_analysis >= ANALYST_EVERY or getattr(self.agents.get(job.prop.agent), "learns", False):
            self._learn([st])

    def thinking(self) -> bool:  # an agent is answering, or an inconclusive candidate waits its turn
        return any(a.busy() for a in self.agents.values()) or any(s.retry for s in self.states.values())

    def expected_seconds(self) -> float | None:
        """The next evaluation's expected seconds: the longest of the problems' median durations
        (of their last evaluations here, this run's included); None while one is unknown."""
        meds = []
        for st in self.states.values():
            if st.exhausted:
                continue
            if not st.seconds:
                return None
            meds.append(statistics.median(st.seconds))
        return max(meds) if meds else None

    def finished(self) -> bool:
        if any(s.retry for s in self.states.values()):
            return False
        return all(s.exhausted for s in self.states.values()) or bool(self._all_stopped())

    def _all_stopped(self) -> list[str]:
        """Why each agent stopped, when every one has (an LLM-only run whose endpoints keep
        failing); else an empty list."""
        why = [a.stopped for a in self.agents.values()]
        return why if why and all(why) else []

    def _report_stops(self) -> None:
        """One warning line per agent that stopped while others go on (when none is left, the run
        ends with the reasons instead)."""
        if self._all_stopped():
            return
        for name, agent in self.agents.items():
            if agent.stopped and name not in self._stops_reported:
                self._stops_reported.add(name)
                log.warning("warning: %s; the run goes on with the other agents", agent.stopped)

    def _orphan_job(self, states: dict[str, ProblemState]):
        """A candidate whose lease expired before its verdict was recorded (its coordinator died):
        evaluate it as its agent proposed it. Looked for every ``ORPHANS_EVERY`` seconds."""
        if time.monotonic() < self._orphans_at:
            return None
        self._orphans_at = time.monotonic() + ORPHANS_EVERY
        for st in states.values():
            for cid in self.leases.orphans(st.problem, st.vversion):
                cand = self.store.candidate(cid)
                if cid in st.pending or cand is None:
                    continue
                return Job(st, Proposal(cand.source, cand.agent, cand.operator, cand.knobs,
                                        list(cand.parents or []), cand.generation, cand.backend), cid,
                           orphan=True)
        return None

    def _retry_job(self, states: dict[str, ProblemState]) -> Job | None:
        """An inconclusive candidate whose time to be measured again has come (oldest first)."""
        now = time.monotonic()
        for st in states.values():
            for i, (at, prop, cid, n) in enumerate(st.retry):
                if at <= now and cid not in st.pending:
                    del st.retry[i]
                    return Job(st, prop, cid, retry=n)
        return None

    def _next_job(self, states: dict[str, ProblemState], turn: int, budget_left):
        names = [p.name for p in self.problems]
        for i in range(len(names)):
            st = states[names[(turn + i) % len(names)]]
            if st.exhausted:
                continue
            board = Board(st.problem, st.entries + list(st.pending.values()), st.champion, st.knowledge.lines,
                          self.rng, budget_left, priors=st.knowledge.priors, transfer=st.knowledge.rows,
                          hardware=self.store.hardware, hypotheses=st.knowledge.hypotheses)
            order = self.bandit.order()
            first = sorted((a for a in order if self._leads(a, board)),
                           key=lambda a: getattr(self.agents[a], "lead_rank", 1))
            order = first + [a for a in order if a not in first]
            for agent_name in order:
                try:
                    props = self.agents[agent_name].propose(board, PROPOSALS_PER_ASK)
                except Exception:  # an agent's bug costs it its turn, not the run
                    props = []
                fresh = None
                for prop in props:
                    prop.backend = st.problem.backend  # what the candidate is written in
                    cid = prop.candidate_id
                    if cid in st.seen:
                        self.duplicates += 1
                    else:
                        fresh = Job(st, prop, cid)
                        break
                if fresh:
                    return fresh
                if agent_name != "seed" and not self.agents[agent_name].busy():
                    self.bandit.idle(agent_name)
            if self._space_exhausted(st):
                st.exhausted = True
        return None

    def _leads(self, agent_name: str, board: Board) -> bool:
        """Does the agent ask to propose first? An agent's bug here costs it its place, not the run."""
        try:
            return bool(self.agents[agent_name].leads(board))
        except Exception:
            if agent_name not in self._lead_failures:   # once per agent, not at every turn
                self._lead_failures.add(agent_name)
                log.warning("agent %s failed to say whether it leads; it takes its turns in the bandit's order",
                            agent_name, exc_info=True)
            return False

    @staticmethod
    def _space_exhausted(st: ProblemState) -> bool:
        size = st.problem.knob_space_size() if st.problem.knobs else 0
        tried = {knob_key(e.knobs) for e in st.entries if e.knobs}
        return size == 0 or len(tried) >= size

    def _complete(self, st: ProblemState, prop: Proposal, cid: str, verdict: Verdict,
                  vversion: str | None = None) -> bool:
        """Record a verdict (against the validation set it was verified on) and release its lease;
        returns True when it made a new champion."""
        cand = prop.record(st.problem, self.run_id)
        assert cand["id"] == cid
        vversion = vversion or st.vversion
        eval_id = self.store.record_verdict(st.problem, cand, verdict, self.run_id, vversion)
        if self.leases is not None:
            self.leases.release(st.problem, cid, vversion)
        entry = Entry(cid, prop.knobs, verdict.outcome.value, verdict.speedup, prop.agent,
                      prop.generation, verdict.detail,
                      weight(verdict.speedup, verdict.ci_low, verdict.ci_high, verdict.evidence))
        st.entries.append(entry)
        st.since_adversary += 1
        st.since_analysis += 1
        self.counts[verdict.outcome.value] += 1
        decision = contend(self.store, st.problem, eval_id, self.run_id, self._remeasurer(st))
        improved = decision.crowned == cid
        if decision.change:
            log.info("%s: %s", st.problem.name, decision.change)
        self._sync_champion(st)
        if prop.agent in self.agents:
            self.bandit.reward(prop.agent, verdict.outcome.value, improved)
        return improved

    # -- lessons ----------------------------------------------------------------------------------
    def _learn(self, states) -> None:
        """The analyst over these problems' evidence on this machine (new, re-checked and retired
        lessons recorded with the run id); then every problem's board knowledge is refreshed, since
        a lesson of one problem also shapes the priors of problems like it, and the evidence of
        other problems and machines becomes the cost model's transferred rows. Pure Python over the
        store; a failure is logged and costs the run nothing but the lessons."""
        states = list(states)
        for st in states:
            st.since_analysis = 0
        try:
            written = self.analyst.update([st.problem for st in states], self.run_id, [self.store.hardware["id"]])
            self.lessons_written += len(written)
            lessons = self.store.current_lessons()
            rows = evidence_rows(self.store)
            hw = self.store.hardware["id"]
            for st in self.states.values():
                st.knowledge = knowledge_for(st.problem, lessons, self.store.hardware)
                st.knowledge.rows = [r for r in rows if (r.problem, r.hardware_id) != (st.problem.name, hw)]
        except Exception as exc:  # lessons are advice; a bug in deriving them must not end the run
            log.warning("analyst failed: %s: %s", type(exc).__name__, exc)

    # -- the adversary and re-verification --------------------------------------------------------
    def _adversary_turn(self, st: ProblemState) -> None:
        st.since_adversary = 0
        if self.adversary is None:
            return
        retained = rank_by_best((e.candidate_id, e.speedup) for e in st.entries if e.correct)
        # passed verification, speed not known yet (measured on a busy machine, to be measured
        # again): retained as much as a measured one, so attacked too, after the measured ones
        unmeasured = [e.candidate_id for e in reversed(st.entries) if e.outcome in CORRECT and not e.correct]
        ids = list(dict.fromkeys(([st.champion.candidate_id] if st.champion else [])
                                 + [cid for cid, _ in retained] + unmeasured))[:ADVERSARY_TARGETS]
        targets = [c for c in (self.store.candidate(i) for i in ids) if c]
        if not targets:
            return
        known = {c.key() for c in st.cases}
        findings = self.adversary.hunt(self.harness, st.problem, targets, self._failures(st), self.rng, known)
        added = [f for f in findings if self.store.add_case(st.problem.name, f.case, self.adversary.name,
                                                            f.broke, f.detail[:500])]
        self.counts["cases_found"] += len(added)
        if added:
            self.reverify(st)

    def _keep_drawn_failure(self, st: ProblemState, job: Job, verdict: Verdict) -> None:
        """A drawn model case that broke a candidate becomes a permanent validation case (the
        validation set improves itself), and the champions are re-verified against it."""
        key = verdict.evidence.get("case") if verdict.outcome == Outcome.WRONG else None
        case = next((c for c in job.drawn if c.key() == key), None)
        if case is None:
            return
        if self.store.add_case(st.problem.name, case, "model-draw", job.cid,
                               f"{case.origin}: {verdict.detail[:400]}"):
            self.counts["cases_found"] += 1
            self.reverify(st)

    def _failures(self, st: ProblemState) -> list[dict]:
        """Shapes and distributions of cases that broke kernels of this problem before."""
        out = []
        for ev in self.store.evaluations(problem=st.problem.name):
            key = (ev.evidence or {}).get("case")
            if ev.outcome == Outcome.WRONG and key:
                out.append(json.loads(key))
        return out[-50:]

    def reverify(self, st: ProblemState) -> None:
        """The validation set grew: re-verify the champion; a failing one is dethroned and the best
        retained candidates are re-measured afresh, the first faster one taking its place."""
        st.cases, st.vversion = validation_set(st.problem, self.store)
        if self.store.champion(st.problem) is None:
            return
        ranked = rank_by_best((e.candidate_id, e.speedup) for e in st.entries if e.correct)
        res = reverify_and_succeed(self.store, self.harness, st.problem, st.cases, st.vversion, ranked, self.run_id,
                                   remeasure=self._remeasurer(st))
        failed = {r["candidate_id"]: r["outcome"] for r in res["rows"] if not r["passes"]}
        for e in st.entries:
            if e.candidate_id in failed:
                e.outcome = failed[e.candidate_id]
        if res["change"]:
            log.info("%s: %s", st.problem.name, res["change"])
        self._sync_champion(st)

    def _remeasurer(self, st: ProblemState):
        """A fresh re-measure of a candidate (verified on today's cases first, on the executor's
        hardware), recorded with purpose ``remeasure``: what succession calls."""
        def remeasure(cand: CandidateRow) -> int:
            verdict = result(self._submit(st.problem, cand.source, st.cases, cand))
            return self.store.record_verdict(st.problem, cand, verdict, self.run_id, st.vversion, "remeasure")
        return remeasure

    def _remeasure(self, states: dict[str, ProblemState]) -> None:
        """Champions are re-measured (and re-verified) before they are announced: confirmed,
        kept unconfirmed (inconclusive), or demoted and succeeded (swarm/succession.py)."""
        for st in states.values():
            champ = self.store.champion(st.problem)
            if champ is None:
                continue
            cand = self.store.candidate(champ.candidate_id)
            remeasure = self._remeasurer(st)
            decision = contend(self.store, st.problem, remeasure(cand), self.run_id, remeasure)
            if decision.change:
                log.info("%s: %s", st.problem.name, decision.change)
            self._sync_champion(st)

    def _champion_speedups(self, states) -> dict[str, float | None]:
        return {n: (s.champion.speedup if s.champion else None) for n, s in states.items()}

