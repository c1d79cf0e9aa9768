"""The engine tuner's logic on replayed figures (enginefactory/runner.py ``ReplayRunner``): no model
is loaded and nothing is served, so a whole tune (baseline, proposals by the kernel factory's
agents, screening, confirmation rounds, champions, records, resume) runs in seconds. Also: the
engine's design space is a search space like a kernel problem's, a knob declared on one
``EngineConfig`` field reaches the design space, the LLM's prompt and the ``--set`` help, and
design keys hash only non-default fields."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import random
from pathlib import Path
from typing import Annotated

import pytest

from swarmfactory.agents.base import Board, candidate_record
from swarmfactory.agents.base import Entry as BoardEntry
from swarmfactory.agents.crossover import CrossoverAgent
from swarmfactory.agents.knobs import KnobAgent, RandomRestartAgent
from swarmfactory.agents.model_guided import ModelGuidedAgent
from swarmfactory.engine.config import EngineConfig, Knob
from swarmfactory.enginefactory import design as D
from swarmfactory.enginefactory import records
from swarmfactory.enginefactory.llm_designs import design_prompt
from swarmfactory.enginefactory.propose import Proposer
from swarmfactory.enginefactory.runner import Recording, ReplayRunner
from swarmfactory.enginefactory.space import EngineSpace, InvariantAgent
from swarmfactory.enginefactory.tune import TuneConfig, Tuner
from swarmfactory.evidence.store import Store
from swarmfactory.outcome import Outcome, Verdict
from swarmfactory.problems import load_problem
from swarmfactory.problems.space import SearchSpace

CFG = TuneConfig(workloads=((16, 8),), concurrency=(1, 4), time_s=600, fixed=(("threads", 0),))


# -- a machine on record ---------------------------------------------------------------------------
def figures(cfg: TuneConfig, tok_s: float) -> dict:
    """Serving figures as bench/serving.py reports them: ``tok_s`` at one stream, more in parallel."""
    return {f"{i}x{o}": [{"concurrency": c, "num_prompts": cfg.prompts(c), "completed": cfg.prompts(c), "errors": 0,
                          "duration_s": 1.0, "output_tok_s": tok_s * c ** 0.5, "ttft_ms_p99": 100.0,
                          "contention": {"others": 0.0, "suffered": 0.0, "busy": False, "attempts": 1}}
                         for c in cfg.concurrency] for i, o in cfg.workloads}


def speed(knobs: dict) -> float:
    """The recorded machine's tok/s for a design: larger batches and the native decoder pay."""
    s = 100.0 * {16: 0.8, 32: 1.0, 64: 1.25, 128: 1.1}[knobs["max_batch"]]
    s *= {64: 0.9, 128: 1.0, 256: 1.05, 512: 1.0}[knobs["prefill_chunk"]]
    s *= 1.3 if knobs["native_decode"] else 1.0
    return s * (0.6 if knobs["kv_dtype"] == "int8" else 1.0)


def machine(cfg: TuneConfig = CFG):
    """What each design did on the recorded machine: the default is not batch invariant (wrong, served
    anyway as the baseline), a bf16 KV cache crashes at load, the rest serve at ``speed``."""
    def recorded(config: EngineConfig) -> Recording:
        knobs = {"max_batch": config.max_batch, "prefill_chunk": config.prefill_chunk,
                 "native_decode": config.native_decode, "kv_dtype": config.kv_dtype}
        serving = [figures(cfg, speed(knobs))]
        if config.kv_dtype == "bf16":
            return Recording(Verdict(Outcome.CRASHED, "load: the replayed machine has no bf16 cache", "load"))
        if config.native_decode is None:  # calibrated: paths mixed by batch size
            return Recording(Verdict(Outcome.WRONG, "batched vs alone: prompt 0 diverged at token 5", "verify"),
                             serving)
        return Recording(serving=serving)

    return recorded


def searched(store, tuner) -> list:
    return [e for e in store.evaluations(problem=tuner.problem.name) if e.purpose == "search"]


# -- the protocol ------------------------------------------------------------------------------------
def test_a_kernel_problem_and_the_engine_design_space_are_both_search_spaces(tmp_path):
    tuner = Tuner(CFG, Store(str(tmp_path / "e.db")), runner=ReplayRunner(machine()))
    space = tuner.problem
    assert isinstance(load_problem("rmsnorm"), SearchSpace) and isinstance(space, SearchSpace)
    assert space.knobs["threads"] == (0,) and space.knobs["max_batch"] == D.KNOBS["max_batch"]  # --set narrows
    assert space.knob_defaults == {**D.DEFAULT_KNOBS, "threads": 0, "kernels": "builtin", "matvec": "builtin"}
    assert space.knob_aspects["max_batch"] == "blocking" and space.knob_aspects["threads"] == "threading"
    assert not space.valid_knobs({})  # q4_1: the calibrated default mixes paths by batch size
    invariant = {"native_decode": 0, "dense": "none", "attention": "exact"}
    assert space.valid_knobs(invariant) and not space.valid_knobs({**invariant, "max_batch": 7})
    design = space.render(invariant)
    assert design.key == D.build(invariant, tuner.base).key and design.config.native_decode == 0


def test_the_kernel_factorys_agents_propose_engine_designs(tmp_path):
    """The knob agents, crossover, random restarts and the model-guided agent read only the protocol:
    on the engine's design space their proposals are designs of the space, valid and untried."""
    space = Tuner(CFG, Store(str(tmp_path / "e.db")), runner=ReplayRunner(machine())).problem
    rng = random.Random(1)
    measured = []
    for _ in range(12):  # a dozen designs measured on the recorded machine
        knobs = D.make_invariant({n: rng.choice(list(v)) for n, v in space.knobs.items()}, rng)
        design = space.render(knobs)
        measured.append(BoardEntry(design.key, design.knobs, "not_faster", speed(design.knobs) / 100, "", 0))
    board = Board(space, measured, max(measured, key=lambda e: e.speedup), [], rng, hardware={"id": "test"})
    agents = [KnobAgent("blocking"), KnobAgent("algorithm"), CrossoverAgent(), RandomRestartAgent(),
              ModelGuidedAgent(), InvariantAgent()]
    for agent in agents:
        props = agent.propose(board, 3)
        assert props, agent.name
        for p in props:
            assert all(p.knobs[n] in space.knobs[n] for n in p.knobs) and space.valid_knobs(p.knobs), (agent.name, p)
            assert isinstance(p.source, D.Design) and p.source.knobs == space.render(p.knobs).knobs
    assert KnobAgent("threading").propose(board, 3) == []  # threads is fixed: nothing to move


# -- a tune ------------------------------------------------------------------------------------------
def test_a_tune_on_replayed_figures_screens_confirms_crowns_and_records_every_design(tmp_path):
    store = Store(str(tmp_path / "e.db"))
    runner = ReplayRunner(machine())
    logs: list[str] = []
    tuner = Tuner(dataclasses.replace(CFG, budget=12), store, runner=runner, log=logs.append)
    run_id = tuner.run()
    assert store.run(run_id).status == "finished"
    assert runner.started[0] == tuner.problem.build({}).config  # the default design first: the baseline
    (baseline,) = [e for e in store.evaluations(problem=tuner.problem.name) if e.purpose == "baseline"]
    assert baseline.outcome == "wrong" and "measured anyway as the baseline" in baseline.detail
    evs = searched(store, tuner)
    assert len(evs) == 12 and len({e.candidate_id for e in evs}) == 12  # the budget, no design twice
    for e in evs:
        cand = store.candidate(e.candidate_id)
        design = tuner.problem.build(cand.knobs)
        assert design.key == e.candidate_id and D.batch_invariant(design.knobs)  # q4_1: invariant only
        assert cand.agent in [*tuner.proposer.agents, "champion", "requalify"]
        if design.config.kv_dtype == "bf16":
            assert e.outcome == "crashed"
        elif e.evidence.get("screened_out"):
            assert e.outcome == "not_faster" and e.detail.startswith("screened out: ")
            assert "serving" not in e.evidence and e.evidence["screen_fitness"] > 0
        else:
            assert e.outcome in ("faster", "not_faster"), e
            assert e.evidence["fitness"] == pytest.approx(speed(design.knobs) * 2 ** 0.5)  # geomean of c=1, 4
    # confirmation: every first-round win started the champion (or the default) again; replayed rounds agree
    rounds = [e for e in evs if "vs_champion" in e.evidence and "unconfirmed" not in e.evidence]
    assert len(runner.started) == 1 + len(evs) + len(rounds)
    assert all(e.outcome == "faster" and e.evidence["vs_champion"][0] == e.evidence["vs_champion"][1]
               for e in rounds)
    # the champion: the first verified design (the default failed), then each that beat it twice
    measured = [e for e in evs if e.outcome in ("faster", "not_faster") and not e.evidence.get("screened_out")]
    best = max(e.evidence["fitness"] for e in measured)
    assert tuner.champion is not None and tuner.champion.fitness * (1 + CFG.min_effect) >= best
    assert store.champion(tuner.problem).candidate_id == tuner.champion.design.key
    # the bandit shared the pool: every verdict on an agent's design is on its arm
    arms = tuner.proposer.bandit.arms
    assert sum(a.proposals for a in arms.values()) == sum(
        store.candidate(e.candidate_id).agent in arms for e in evs)
    assert any("beat the default design twice" in (e.detail or "") or "first verified design" in e.detail
               for e in evs)


def test_an_interrupted_tune_resumes_with_its_budget_its_designs_and_its_bandit(tmp_path):
    class Interrupted(ReplayRunner):
        def start(self, config, serve_anyway=False):
            if len(self.started) == 5:
                raise KeyboardInterrupt  # Ctrl-C while the fifth design starts
            return super().start(config, serve_anyway)

    store = Store(str(tmp_path / "e.db"))
    cfg = dataclasses.replace(CFG, budget=8)
    first = Tuner(cfg, store, runner=Interrupted(machine()))
    with pytest.raises(KeyboardInterrupt):
        first.run()
    assert store.run(first.run_id).status == "interrupted"
    before = searched(store, first)
    assert 0 < len(before) < 8
    again = Tuner(None, store, resume=first.run_id, runner=ReplayRunner(machine()))
    again.run()
    evs = searched(store, again)
    assert len(evs) == 8 and len({e.candidate_id for e in evs}) == 8  # the budget counts the whole run
    assert {e.id for e in before} <= {e.id for e in evs}
    arms = again.proposer.bandit.arms  # the first session's verdicts replayed onto the agents' arms
    assert sum(a.proposals for a in arms.values()) == sum(store.candidate(e.candidate_id).agent in arms
                                                          for e in evs)


# -- one declaration per knob -------------------------------------------------------------------------
class WithSpecDecode(EngineConfig):
    """EngineConfig with one knob more, declared on its field and nowhere else."""

    spec_decode: Annotated[str, Knob(("off", "ngram"), "speculative decoding: ngram drafts tokens from the "
                                     "prompt and verifies them in one step", "algorithm")] = "off"


def test_a_knob_declared_on_its_field_reaches_the_design_space_the_llm_prompt_and_the_set_help():
    base = WithSpecDecode(max_seq_len=2048)
    space = EngineSpace(Path("model.gguf"), "0" * 64, CFG, base, {}, {"kernels": "builtin", "matvec": "builtin"})
    # the design space: its values, default and aspect; a design sets the field
    assert space.knobs["spec_decode"] == ("off", "ngram") and space.knob_defaults["spec_decode"] == "off"
    assert space.knob_aspects["spec_decode"] == "algorithm"
    invariant = {"native_decode": 0, "dense": "none", "attention": "exact"}
    ngram = space.render({**invariant, "spec_decode": "ngram"})
    assert ngram.config.spec_decode == "ngram" and "spec_decode=ngram" in ngram.describe()
    # a field added with a default re-keys no design: the same design without it has the same key
    plain = D.build(invariant, EngineConfig(max_seq_len=2048))
    assert space.render(invariant).key == plain.key != ngram.key

    # the LLM prompt, as the tuner's proposals ask for it
    class Asked:
        name = "llm-design:test"

        def ready(self):
            return []

        def submit(self, *args, **kw):
            self.args, self.kw = args, kw

    llm = Asked()
    Proposer(space, random.Random(0), None, llm).next([], None, None, set())
    prompt = design_prompt(*llm.args, "", **llm.kw)[1]["content"]
    assert '- `spec_decode`: "off", "ngram". speculative decoding: ngram drafts tokens' in prompt

    # the --set help of engine tune
    assert "spec_decode=off|ngram" in D.set_help(WithSpecDecode) and "spec_decode" not in D.set_help()
    import swarmfactory.tune_cli as cli

    assert inspect.signature(cli.tune_cmd).parameters["set_"].default.help == D.set_help()


# -- keys --------------------------------------------------------------------------------------------
def test_designs_recorded_under_the_old_keys_are_still_recognised(tmp_path):
    """Before keys hashed only non-default fields they hashed every field (but two added later): a
    store's recorded designs keep those ids, and a tune still knows them by their YAML."""
    store = Store(str(tmp_path / "e.db"))
    tuner = Tuner(CFG, store, runner=ReplayRunner(machine()))
    design = tuner.problem.build({"native_decode": 0, "dense": "none", "attention": "exact", "max_batch": 64})
    dump = design.config.model_dump()
    old = {k: v for k, v in dump.items() if not (k == "native_matvec" and v is None)}
    old_key = hashlib.sha256(("engine-design\n" + json.dumps(old, sort_keys=True)).encode()).hexdigest()[:20]
    assert old_key != design.key
    store.record_problem(tuner.problem)
    run = store.create_run({"kind": "engine-tune", **CFG.to_dict()})
    cand = candidate_record(tuner.problem, design.config.to_yaml(), "knobs", "mutate", backend="engine",
                            knobs=design.knobs, run_id=run)
    cand["id"] = old_key
    verdict = Verdict(Outcome.FASTER, "1.25x", "measure", speedup=1.25, evidence={"fitness": 125.0})
    eid = store.record_verdict(tuner.problem, cand, verdict, run, records.VALIDATION_VERSION)
    store.set_champion(tuner.problem, old_key, eid, 1.25, run, "test")
    tuner._prior()
    assert {old_key, design.key} <= tuner.seen  # never evaluated again, by either key
    assert tuner.prior_champion is not None and tuner.prior_champion.design.key == design.key
    assert tuner.prior_champion.ratio == 1.25
