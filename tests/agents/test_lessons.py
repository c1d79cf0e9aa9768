"""Lessons: the analyst writes them from evidence recorded through the store's API (a real SQLite
store, real verdict records), retires them when later evidence contradicts them, the agents'
proposals shift towards them, the coordinator keeps them current during a run, and
``swarmfactory lessons`` lists them."""

import dataclasses
import json
import random
import sys
from concurrent.futures import Future
from pathlib import Path

import pytest

from swarmfactory.agents.base import Board, Entry
from swarmfactory.agents.crossover import CrossoverAgent
from swarmfactory.agents.knobs import KnobAgent, RandomRestartAgent
from swarmfactory.agents.base import candidate_record
from swarmfactory.swarm.executors import Executor
from swarmfactory.evidence.store import Store
from swarmfactory.outcome import Outcome, ShapeTiming, Verdict
from swarmfactory.knowledge.analyst import MIN_PAIRS, Analyst
from swarmfactory.knowledge.priors import knowledge_for, relevance
from swarmfactory.problems import load_problem

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from cli_support import sf  # noqa: E402

BASE = {"vw": 8, "acc": 2, "unroll": 1, "scale": "mul_inv", "threads": "none"}


@pytest.fixture(scope="module")
def rmsnorm():
    return load_problem("rmsnorm")


@pytest.fixture(scope="module")
def quick(rmsnorm):
    """rmsnorm with a stand-in template that renders in microseconds: what the agents choose is
    under test here, not the kernel, and a thousand real renders would take seconds."""
    return dataclasses.replace(rmsnorm, template=" ".join(f"{{{{ {k} }}}}" for k in rmsnorm.knobs))


def verdict_for(problem, speedup: float, per_shape: list[float] | None = None) -> Verdict:
    per_shape = per_shape or [speedup] * len(problem.workload)
    shapes = [ShapeTiming(dict(sh), 10.0 / s, 10.0, 12.0, s, s * 0.98, s * 1.02, s * 1.2, 0.5)
              for sh, s in zip(problem.workload, per_shape)]
    outcome = Outcome.FASTER if speedup > 1.05 else Outcome.NOT_FASTER
    return Verdict(outcome, f"{speedup:.2f}x", "measure", speedup=speedup, ci_low=speedup * 0.98,
                   ci_high=speedup * 1.02, vs_reference=speedup * 1.2, roofline_fraction=0.5,
                   baseline="F.rms_norm", shapes=shapes)


def plant(store, problem, knobs: dict, speedup: float, run=None, purpose="search", per_shape=None) -> int:
    """One evaluation of the configuration ``knobs``, recorded as the coordinator records it."""
    cand = candidate_record(problem, problem.render(knobs), "knob-threading", "test", knobs=dict(knobs), run_id=run)
    return store.record_verdict(problem, cand, verdict_for(problem, speedup, per_shape), run, "vv", purpose)


def others(n: int, skip: int = 0):
    """``n`` settings of the knobs other than threads, all different (acc x unroll x vw)."""
    combos = [{"acc": a, "unroll": u, "vw": v} for v in (8, 4, 16, 1) for a in (1, 2, 4) for u in (1, 2, 4)]
    return combos[skip:skip + n]


def plant_threads(store, problem, pairs: int, none_over_omp: float, skip: int = 0, seed: int = 0) -> list[int]:
    """``pairs`` matched pairs differing only in threads, none faster than omp by the given ratio
    (a few percent of noise)."""
    rng, ids = random.Random(seed), []
    for rest in others(pairs, skip):
        base = 1.5 * (1 + rng.uniform(-0.03, 0.03))  # the other knobs: noise only
        ids.append(plant(store, problem, {**BASE, **rest, "threads": "none"}, base * none_over_omp ** 0.5))
        ids.append(plant(store, problem, {**BASE, **rest, "threads": "omp"}, base / none_over_omp ** 0.5
                         * (1 + rng.uniform(-0.02, 0.02))))
    return ids


def lessons_about(store, problem, knob, include_retired=False):
    return [r for r in store.current_lessons(problem, include_retired) if r.data["knob"] == knob]


def test_a_lesson_is_written_from_planted_evidence(tmp_path, rmsnorm):
    store = Store(str(tmp_path / "e.db"))
    ids = plant_threads(store, rmsnorm, pairs=6, none_over_omp=1.4)
    written = Analyst(store).update(["rmsnorm"], run_id="r1")
    (lesson,) = [r for r in lessons_about(store, "rmsnorm", "threads") if r.data["scope"] is None]
    d = lesson.data
    assert (d["better"], d["worse"], d["status"], d["method"], d["pairs"]) == ("none", "omp", "active", "matched", 6)
    assert 1.3 < d["effect"] < 1.5 and 1.0 < d["ci_low"] <= d["effect"] <= d["ci_high"]
    assert sorted(d["support"]) == sorted(ids) and d["evaluations"] == 12
    assert d["features"]["dims"] == {"rows": [1, 128], "cols": [576, 576]} and d["features"]["coverage"] == 1.0
    assert d["hardware"]["id"] == store.hardware["id"] and lesson.run_id == "r1" and lesson.agent == "analyst"
    assert lesson.text.startswith("on rmsnorm (rows 1-128, cols 576), threads=none beats threads=omp by 1.4")
    assert "12 evaluations, 6 matched pairs" in lesson.text and d["hardware"]["isa"] in lesson.text
    assert any(w["key"] == lesson.key for w in written)
    # no new evidence: nothing new to say, nothing written
    assert Analyst(store).update(["rmsnorm"], run_id="r2") == []


def test_too_little_or_too_weak_evidence_makes_no_lesson(tmp_path, rmsnorm):
    few = Store(str(tmp_path / "few.db"))
    plant_threads(few, rmsnorm, pairs=MIN_PAIRS - 1, none_over_omp=1.6)  # strong, but too few pairs
    weak = Store(str(tmp_path / "weak.db"))
    plant_threads(weak, rmsnorm, pairs=8, none_over_omp=1.02)            # enough pairs, too small an effect
    for store in (few, weak):
        assert Analyst(store).update(["rmsnorm"]) == []
        assert store.current_lessons(include_retired=True) == []


def test_a_wrong_candidate_teaches_nothing(tmp_path, rmsnorm):
    store = Store(str(tmp_path / "e.db"))
    plant_threads(store, rmsnorm, pairs=4, none_over_omp=1.4)
    # one of the pairs' candidates is later found wrong: three pairs left, below the rule
    cand = candidate_record(rmsnorm, rmsnorm.render({**BASE, **others(1)[0], "threads": "omp"}), "x", "y")
    store.record_verdict(rmsnorm, cand, Verdict(Outcome.WRONG, "found wrong", "verify"), None, "vv2", "reverify")
    Analyst(store).update(["rmsnorm"])
    assert lessons_about(store, "rmsnorm", "threads") == []


def test_contradicting_evidence_retires_the_lesson_and_keeps_its_history(tmp_path, rmsnorm):
    store = Store(str(tmp_path / "e.db"))
    plant_threads(store, rmsnorm, pairs=6, none_over_omp=1.4)
    Analyst(store).update(["rmsnorm"], run_id="r1")
    (old,) = [r for r in lessons_about(store, "rmsnorm", "threads") if r.data["scope"] is None]
    rows_before = len(store.lessons("rmsnorm", limit=1000))
    # later evidence: on 24 other configurations omp is 1.5x faster
    plant_threads(store, rmsnorm, pairs=24, none_over_omp=1 / 1.5, skip=6, seed=1)
    written = Analyst(store).update(["rmsnorm"], run_id="r2")
    assert any(w["key"] == old.key and w["status"] == "retired" for w in written)
    now = {r.key: r for r in lessons_about(store, "rmsnorm", "threads", include_retired=True)}
    retired = now[old.key]
    assert retired.status == "retired" and retired.run_id == "r2"
    assert retired.data["why"].startswith("contradicted: threads=none vs threads=omp is now 0.")
    assert retired.data["recheck"]["ci_high"] < 1.0 and retired.text == old.text
    assert [h.data["status"] for h in retired.history] == ["active"]   # append-only: the old row stays
    assert len(store.lessons("rmsnorm", limit=1000)) > rows_before
    assert old.key not in {r.key for r in lessons_about(store, "rmsnorm", "threads")}  # not active
    (new,) = [r for r in lessons_about(store, "rmsnorm", "threads") if r.data["scope"] is None]
    assert (new.data["better"], new.data["worse"]) == ("omp", "none")


def test_a_lesson_that_loses_its_support_is_retired_and_may_come_back(tmp_path, rmsnorm):
    store = Store(str(tmp_path / "e.db"))
    plant_threads(store, rmsnorm, pairs=5, none_over_omp=1.3)
    Analyst(store).update(["rmsnorm"])
    (key,) = [r.key for r in lessons_about(store, "rmsnorm", "threads") if r.data["scope"] is None]
    plant_threads(store, rmsnorm, pairs=5, none_over_omp=1 / 1.3, skip=5, seed=2)   # now it is a wash
    Analyst(store).update(["rmsnorm"])
    r = {x.key: x for x in store.current_lessons("rmsnorm", include_retired=True)}[key]
    assert r.status == "retired" and r.data["why"].startswith("no longer supported")
    plant_threads(store, rmsnorm, pairs=14, none_over_omp=1.5, skip=10, seed=3)
    Analyst(store).update(["rmsnorm"])
    r = {x.key: x for x in store.current_lessons("rmsnorm", include_retired=True)}[key]
    assert r.status == "active" and r.data["why"].startswith("re-established")
    assert [h.data["status"] for h in r.history] == ["active", "retired"]


def test_an_effect_on_some_shapes_only_is_scoped_to_them(tmp_path, rmsnorm):
    store = Store(str(tmp_path / "e.db"))
    for i, rest in enumerate(others(6)):
        plant(store, rmsnorm, {**BASE, **rest, "threads": "none"}, 1.4, per_shape=[2.0, 1.9, 0.7 + 0.01 * i])
        plant(store, rmsnorm, {**BASE, **rest, "threads": "omp"}, 1.4, per_shape=[1.0, 1.0, 1.4 + 0.01 * i])
    Analyst(store).update(["rmsnorm"])
    by = {(r.data["better"], json.dumps(r.data["scope"])): r for r in lessons_about(store, "rmsnorm", "threads")}
    small = next(r for (b, _), r in by.items() if b == "none")
    big = next(r for (b, _), r in by.items() if b == "omp")
    assert [s["rows"] for s in small.data["features"]["shapes"]] == [1, 8] and small.data["effect"] > 1.8
    assert [s["rows"] for s in big.data["features"]["shapes"]] == [128]
    assert "rows x cols 1x576, 8x576" in small.text and "rows x cols 128x576" in big.text
    assert all(r.data["scope"] is not None for r in by.values())  # the whole workload is a wash


# -- the agents -----------------------------------------------------------------------------------------
def vw_lessons(tmp_path, problem):
    """A store where vw=1 is half as fast as vw=8 (4 matched pairs), analysed."""
    store = Store(str(tmp_path / "e.db"))
    for acc in (1, 2):
        for unroll in (1, 2):
            for vw, s in ((8, 2.0), (1, 1.0)):
                plant(store, problem, {**BASE, "acc": acc, "unroll": unroll, "vw": vw}, s * (1 + 0.01 * acc))
    Analyst(store).update([problem.name])
    return store


def test_lessons_shift_what_a_knob_agent_proposes(tmp_path, rmsnorm, quick):
    store = vw_lessons(tmp_path, rmsnorm)
    know = knowledge_for(quick, store.current_lessons(), store.hardware)
    assert know.priors["vw"][8] > 1 > know.priors["vw"][1]
    parent = Entry("p", dict(BASE), "faster", 2.0, "seed", 0)

    def share_of_vw1(priors, n=600):
        picks = []
        for seed in range(n):
            board = Board(quick, [parent], parent, [], random.Random(seed), priors=priors)
            (prop,) = KnobAgent("vectorisation").propose(board, 1)
            picks.append(prop.knobs["vw"])
        return picks.count(1) / n

    uniform, shaped = share_of_vw1({}), share_of_vw1(know.priors)
    assert 0.28 < uniform < 0.39          # one of three alternatives to vw=8
    assert shaped < 0.25 and uniform - shaped > 0.1
    # random restart stays uniform: a wrong lesson cannot narrow the search
    board = Board(quick, [parent], parent, [], random.Random(0), priors=know.priors)
    restart = [p.knobs["vw"] for p in RandomRestartAgent().propose(board, 40)]
    assert restart.count(1) >= 5


def test_lessons_shift_what_crossover_takes(tmp_path, rmsnorm, quick):
    store = Store(str(tmp_path / "e.db"))
    plant_threads(store, rmsnorm, pairs=6, none_over_omp=1.4)
    Analyst(store).update(["rmsnorm"])
    know = knowledge_for(rmsnorm, store.current_lessons(), store.hardware)
    a = Entry("a", {**BASE, "vw": 8, "threads": "none"}, "faster", 2.0, "x", 0)
    b = Entry("b", {**BASE, "vw": 4, "threads": "omp"}, "faster", 1.9, "x", 0)

    def share_none(priors, n=400):
        got = []
        for seed in range(n):
            (prop,) = CrossoverAgent().propose(Board(quick, [a, b], a, [], random.Random(seed), priors=priors), 1)
            got.append(prop.knobs["threads"])
        return got.count("none") / n

    uniform, shaped = share_none({}), share_none(know.priors)
    assert 0.42 < uniform < 0.58 and shaped > uniform + 0.1


def test_lessons_of_other_problems_count_for_less(tmp_path, rmsnorm):
    store = vw_lessons(tmp_path, rmsnorm)
    softmax = load_problem("softmax")
    (lesson,) = [r for r in store.current_lessons("rmsnorm") if r.data["scope"] is None
                 and r.data["knob"] == "vw"]
    here, there = relevance(lesson, rmsnorm, store.hardware), relevance(lesson, softmax, store.hardware)
    assert here == 1.0 and 0 < there < 0.3 * here + 1e-9
    other_cpu = {**store.hardware, "id": "elsewhere"}
    assert relevance(lesson, rmsnorm, other_cpu) == pytest.approx(0.5)
    know = knowledge_for(softmax, store.current_lessons(), store.hardware)
    assert set(know.priors) == {"vw"} and know.priors["vw"][8] > know.priors["vw"][1]
    assert know.priors["vw"][8] < knowledge_for(rmsnorm, store.current_lessons(), store.hardware).priors["vw"][8]
    # a threads lesson says nothing about softmax, whose threads values are none/rows/split
    other = Store(str(tmp_path / "threads.db"))
    plant_threads(other, rmsnorm, pairs=6, none_over_omp=1.4)
    Analyst(other).update(["rmsnorm"])
    threads = [r for r in other.current_lessons("rmsnorm") if r.data["knob"] == "threads"]
    assert threads and all(relevance(r, softmax, other.hardware) == 0 for r in threads)
    assert knowledge_for(softmax, other.current_lessons(), other.hardware).priors == {}


def test_the_llm_prompt_carries_lessons_and_timings(tmp_path, rmsnorm):
    from swarmfactory.agents.llm import LLMAgent
    from swarmfactory.llm.client import ChatClient, Endpoint

    store = vw_lessons(tmp_path, rmsnorm)
    cand = candidate_record(rmsnorm, rmsnorm.render(BASE), "seed", "defaults", knobs=dict(BASE))
    store.record_verdict(rmsnorm, cand, verdict_for(rmsnorm, 2.5), None, "vv")
    champ = Entry(cand["id"], dict(BASE), "faster", 2.5, "seed", 0)
    know = knowledge_for(rmsnorm, store.current_lessons(), store.hardware)
    agent = LLMAgent(ChatClient(Endpoint("t", "http://127.0.0.1:9/v1", "m")))
    agent.bind(store, None)
    try:
        messages = agent._next_request(Board(rmsnorm, [champ], champ, know.lines, random.Random(0),
                                             priors=know.priors))[0]
    finally:
        agent.close()
    user = messages[-1]["content"]
    assert "Lessons learnt so far:" in user and "vw=8 beats vw=1" in user
    assert "the champion takes 4 us; the baseline 10 us" in user  # 10 us / 2.5x


# -- the coordinator --------------------------------------------------------------------------------------
class ModelExecutor(Executor):
    """Verdicts from a speed model of the configuration a source renders (the ``Executor`` seam):
    the coordinator's loop, dedupe, records and analyst run for real, without building kernels."""

    def __init__(self, problem, speed):
        import itertools

        self.speed = speed
        self.by_source = {}
        for combo in itertools.product(*problem.knobs.values()):
            knobs = dict(zip(problem.knobs, combo))
            if problem.valid_knobs(knobs):
                self.by_source[problem.render(knobs)] = knobs

    def submit(self, problem, source, cases):
        fut = Future()
        knobs = self.by_source[source]
        fut.set_result(verdict_for(problem, self.speed(knobs)))
        return fut

    def shutdown(self, wait=True):
        pass


def test_the_coordinator_writes_lessons_during_the_run_and_the_board_carries_them(tmp_path, quick, monkeypatch):
    from swarmfactory.config import RunConfig
    from swarmfactory.swarm import coordinator as C

    monkeypatch.setattr(C, "resolve_problems", lambda spec: [quick])  # rmsnorm, quick to render

    def speed(k):  # threads=omp costs 1.6x, wider vectors help, acc/unroll a little noise
        noise = 1 + 0.01 * ((k["acc"] * 7 + k["unroll"] * 3 + (k["scale"] == "div")) % 5)
        return (2.0 if k["threads"] == "none" else 1.25) * (1 + k["vw"] / 16) * noise

    store = Store(str(tmp_path / "e.db"))
    cfg = RunConfig.build(problems="rmsnorm", budget=60, parallel=1, rounds=3, compile_baselines=False,
                          remeasure_champions=False, agents="seed,knob-threading,knob-vectorisation,crossover,random-restart")
    coord = C.Coordinator(cfg, store, executor=ModelExecutor(quick, speed))
    run_id = coord.run()
    rows = [r for r in store.lessons("rmsnorm", limit=1000) if r.run_id == run_id]
    assert rows and all(r.agent == "analyst" for r in rows)
    current = store.current_lessons("rmsnorm")
    threads = [r for r in current if r.data["knob"] == "threads" and r.data["scope"] is None]
    assert [(r.data["better"], r.data["worse"]) for r in threads] == [("none", "omp")]
    st = coord.states["rmsnorm"]
    assert st.knowledge.lines and st.knowledge.priors["threads"]["none"] > st.knowledge.priors["threads"]["omp"]
    # a new run on the same store starts with the lessons on its boards
    coord2 = C.Coordinator(cfg.model_copy(update={"budget": 1}), store, executor=ModelExecutor(quick, speed))
    coord2.run()
    assert coord2.states["rmsnorm"].knowledge.priors.get("threads")


# -- the command line -------------------------------------------------------------------------------------
def test_swarmfactory_lessons_lists_them(tmp_path, rmsnorm):
    db = tmp_path / "e.db"
    store = Store(str(db))
    plant_threads(store, rmsnorm, pairs=6, none_over_omp=1.4)
    Analyst(store).update(["rmsnorm"], run_id="r1")
    plant_threads(store, rmsnorm, pairs=24, none_over_omp=1 / 1.5, skip=6, seed=1)
    Analyst(store).update(["rmsnorm"], run_id="r2")
    store.close()

    proc = sf("lessons", "--store", db, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(ln.rstrip()) for ln in lines) <= 80, proc.stdout
    assert "rmsnorm on" in proc.stdout and "1 active" in proc.stdout
    row = next(ln for ln in lines if ln.split()[:3] == ["threads", "omp", "none"])
    assert "x [" in row and "retired" not in proc.stdout

    every = sf("lessons", "--all", "--wide", "--problem", "rmsnorm", "--store", db, env={"COLUMNS": "80"})
    assert every.returncode == 0 and "1 active, 1 retired" in every.stdout
    assert "retired threads=none > omp (all): contradicted:" in " ".join(every.stdout.split())
    assert "matched" in every.stdout and " r2 " in every.stdout   # --wide: method, pairs, since, run

    data = json.loads(sf("lessons", "--all", "--json", "--store", db).stdout)
    by_status = {r["status"]: r for r in data["lessons"]}
    assert by_status["retired"]["why"].startswith("contradicted") and by_status["retired"]["history"]
    assert by_status["active"]["better"] == "omp" and by_status["active"]["support"]

    none = sf("lessons", "--problem", "softmax", "--store", db)
    assert none.returncode == 0 and "no active lessons for softmax" in none.stdout and "rmsnorm" in none.stdout


def test_lessons_help_and_a_missing_store(tmp_path):
    import subprocess

    help_text = " ".join(sf("lessons", "--help", env={"COLUMNS": "200"}).stdout.split())
    for opt in ("--problem", "--all", "--json", "--wide", "--store", "--debug"):
        assert opt in help_text, opt
    probe = ("import sys\nfrom swarmfactory.cli import main\nsys.argv = ['swarmfactory', 'lessons', '--help']\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'sqlalchemy')), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.stderr.strip().splitlines()[-1] == "[]"   # --help loads nothing heavy
    missing = sf("lessons", "--store", tmp_path / "nope.db")
    assert missing.returncode == 2 and "no evidence store" in missing.stderr
    assert not (tmp_path / "nope.db").exists()   # a reading command creates no store
