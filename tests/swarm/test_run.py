"""End-to-end runs of the swarm: real gcc, real worker processes, a real SQLite file."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmfactory import contention
from swarmfactory.config import RunConfig
from swarmfactory.evidence.store import Store
from swarmfactory.harness.evaluate import HarnessConfig
from swarmfactory.problems import load_problem
from swarmfactory.swarm.coordinator import Coordinator
from swarmfactory.swarm.summary import summarize

FAST = dict(rounds=3, compile_baselines=False, parallel=2, remeasure_champions=False)
DATA = Path(__file__).parent / "data"


def search_evals(store, run_id=None):
    return [e for e in store.evaluations(run_id=run_id) if e.purpose == "search"]


def test_run_on_two_problems_finds_valid_champions_within_budget(tmp_path):
    store = Store(str(tmp_path / "e.db"))
    # two problems whose default kernels beat their yardsticks by a wide margin (every element op's
    # yardstick includes the engine's own C, which a template may not beat: rmsnorm against torch only)
    cfg = RunConfig.build(problems=f"layernorm,{DATA / 'rmsnorm_torch_yardstick.py'}", budget=6,
                          **{**FAST, "remeasure_champions": True})
    run_id = Coordinator(cfg, store).run()
    evs = search_evals(store, run_id)
    assert len(evs) == 6
    s = summarize(store, run_id)
    assert s["status"] == "finished"
    for p in s["problems"]:
        assert p["evaluations"] == 3  # round robin shares the budget
        champ = p["champion"]
        assert champ is not None, p
        assert champ["speedup"] > 1.0 and champ["shapes"]
        # the champion's own recorded evaluations are all correct (its re-measure may have found
        # the machine too busy to time it: correct, no figure)
        assert all(e.outcome in ("faster", "not_faster", "inconclusive")
                   for e in store.evaluations(candidate_id=champ["candidate_id"]))
    assert any(e.purpose == "remeasure" for e in store.evaluations(run_id=run_id))


@pytest.mark.slow
def test_candidates_measured_before_are_not_measured_again(tmp_path):
    store = Store(str(tmp_path / "e.db"))
    cfg = RunConfig.build(problems="rmsnorm", budget=4, **FAST)
    first = Coordinator(cfg, store).run()
    champ = store.champion(load_problem("rmsnorm"))
    second = Coordinator(cfg, store).run()
    ids_first = {e.candidate_id for e in search_evals(store, first)}
    ids_second = [e.candidate_id for e in search_evals(store, second)]
    assert len(ids_second) == 4 and len(set(ids_second)) == 4
    assert not ids_first & set(ids_second)
    # the second run started from the first run's champion (none where the machine was too busy
    # for the first run to time anything faster)
    started = summarize(store, second)["problems"][0]["started_from"]
    assert (started and started["candidate_id"]) == (champ and champ.candidate_id)


def test_a_template_that_only_breaks_leaves_the_run_healthy(tmp_path):
    store = Store(str(tmp_path / "e.db"))
    # 12 knob combinations render 6 distinct sources (the failing modes ignore `value`)
    cfg = RunConfig.build(problems=str(DATA / "broken_problem.py"), budget=10, agents="seed,random-restart", **FAST)
    run_id = Coordinator(cfg, store).run()
    evs = search_evals(store, run_id)
    assert len(evs) == 6
    outcomes = {e.outcome for e in evs}
    assert outcomes <= {"build_failed", "crashed", "wrong"} and len(outcomes) >= 2
    assert all(e.detail for e in evs)
    s = summarize(store, run_id)
    assert s["status"] == "finished" and s["problems"][0]["champion"] is None


# slow (~150 s of real runs): the kill itself is covered by tests/harness/test_lifecycle.py (the
# parent's workers, eval mid-measurement, leftovers ended from the store) and resuming by
# tests/test_cli_failures.py; this one shows them together on a whole run
@pytest.mark.slow
def test_kill_9_then_resume_loses_no_recorded_evaluation(tmp_path, process_tree):
    db = tmp_path / "e.db"
    cmd = [sys.executable, "-m", "swarmfactory.cli", "run", "--problems", "rmsnorm", "--budget", "8",
           "--store", str(db), "--rounds", "3", "--no-compile-baselines", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if db.exists():
            store = store or Store(str(db))
            if len(search_evals(store)) >= 3:
                break
        assert proc.poll() is None, "the run ended before it could be killed"
    tree = process_tree.descendants(proc.pid)  # its baseline workers (some frozen), drivers, guard
    assert tree
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert process_tree.still_alive(tree, within=10) == set(), "a process of the killed run lives on"
    run_id = store.run().id
    before = {e.id: e.candidate_id for e in search_evals(store, run_id)}
    assert 3 <= len(before) < 8
    assert store.run(run_id).status == "running"  # it never got to say otherwise
    resumed = subprocess.run([sys.executable, "-m", "swarmfactory.cli", "run", "--resume", run_id,
                              "--store", str(db), "--json"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    after = search_evals(store, run_id)
    assert {e.id: e.candidate_id for e in after if e.id in before} == before
    assert len(after) == 8
    assert len({e.candidate_id for e in after}) == 8
    assert store.run(run_id).status == "finished"


@pytest.mark.parametrize("args, message", [
    (["run", "--problems", "nope", "--budget", "2"], "unknown problem"),
    (["run", "--problems", "rmsnorm"], "give a budget"),
    (["run", "--problems", "rmsnorm", "--time", "ten minutes"], "bad duration"),
    (["run", "--problems", "rmsnorm", "--budget", "2", "--agents", "wizard"], "unknown agent"),
    (["run", "--problems", "rmsnorm", "--budget", "0"], "budget"),
    (["run", "--problems", "rmsnorm", "--budget", "2", "--objective", "fastest"], "'objective'"),
    (["run", "--resume", "deadbeef"], "no run"),
    (["show", "deadbeef"], "no run"),
])
def test_bad_cli_input_gives_a_one_line_error(tmp_path, args, message):
    Store(str(tmp_path / "e.db"))  # the store exists: a missing one is its own error
    proc = subprocess.run([sys.executable, "-m", "swarmfactory.cli", *args, "--store", str(tmp_path / "e.db")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_bad_config_file_gives_a_one_line_error(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("problems: rmsnorm\nbudget: 2\nbudgte: 3\n")
    proc = subprocess.run([sys.executable, "-m", "swarmfactory.cli", "run", "--config", str(cfg),
                           "--store", str(tmp_path / "e.db")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown config key 'budgte'" in proc.stderr.strip()


def test_a_drawn_model_shape_that_breaks_a_kernel_becomes_a_permanent_case(tmp_path):
    """The validation set improves itself: a full-size model shape drawn for one evaluation that
    breaks the candidate is kept as a found case, so every later evaluation runs it."""
    store = Store(str(tmp_path / "e.db"))
    cfg = RunConfig.build(problems=str(DATA / "wide_rows_problem.py"), budget=1, agents="seed", **FAST)
    run_id = Coordinator(cfg, store).run()
    [ev] = search_evals(store, run_id)
    assert ev.outcome == "wrong" and "5120" in ev.detail, ev.detail
    assert ev.evidence["model_draw"]["draw"] == 0
    found = store.found_cases("rmsnorm")
    assert [(r.found_by, r.shape) for r in found] == [("model-draw", {"rows": 1, "cols": 5120})]


needs_psi = pytest.mark.skipif(not contention.pressure_available(),
                               reason="no CPU pressure information (PSI) on this kernel")


@needs_psi
def test_a_run_on_a_busy_machine_crowns_nothing_and_measures_inconclusive_candidates_again(tmp_path, monkeypatch,
                                                                                          cpu_hogs):
    """Busy loops on the measurement CPU for the whole run: every timing is disturbed, so each
    candidate's verdict is `inconclusive` (with the contention it was taken under), none is
    crowned, and each is measured again later (up to RETRIES times), never learnt from."""
    from swarmfactory.harness import rounds
    from swarmfactory.swarm import coordinator

    monkeypatch.setattr(coordinator, "RETRY_AFTER_S", 0.0)
    monkeypatch.setattr(rounds, "WAIT_TOTAL_S", 2.0)  # the hogs never stop: do not wait for them long
    store = Store(str(tmp_path / "e.db"))
    cfg = RunConfig.build(problems="rmsnorm", budget=3, agents="seed", **{**FAST, "parallel": 2})
    measure_cpu = sorted(os.sched_getaffinity(0))[-1]  # the coordinator measures on the last CPU
    with cpu_hogs(measure_cpu, 2):
        run_id = Coordinator(cfg, store).run()
    evs = search_evals(store, run_id)
    assert len(evs) == 3
    assert all(e.outcome == "inconclusive" for e in evs), [(e.outcome, e.detail) for e in evs]
    assert all(e.evidence["contention"]["busy"] and e.speedup is None for e in evs)
    # the seed agent's one candidate, then its retries
    assert len({e.candidate_id for e in evs}) == 1
    assert [e.evidence.get("retry") is not None for e in evs] == [False, True, True]
    assert store.champion(load_problem("rmsnorm")) is None
    s = summarize(store, run_id)
    assert s["problems"][0]["contention"]["inconclusive"] == 3
    assert any("inconclusive" in w for w in s["warnings"])


@pytest.mark.slow
def test_an_evaluated_faster_kernel_competes_and_a_run_re_measures_it(tmp_path):
    """`eval` of a faster kernel takes the title (when measured on a quiet machine); the next run
    does not evaluate it again as a duplicate, re-measures the champion at its end, and either
    confirms it or says it could not (never keeps a figure the re-measure contradicts)."""
    from swarmfactory.api import evaluate
    from swarmfactory.evidence.quality import busy

    store = Store(str(tmp_path / "e.db"))
    p = load_problem("rmsnorm")
    res = evaluate(p, p.render(), store, HarnessConfig(rounds=3, compile_baselines=False))
    claims = res["outcome"] == "faster" and not busy(res["evidence"])
    champ = store.champion(p)
    crowned = champ is not None and champ.candidate_id == res["candidate_id"]
    assert (res["champion_change"] is not None) == claims  # crowned, or why not
    # a claim is confirmed by a fresh re-measure before the title is given, at the re-measure's figure
    again = [e for e in store.evaluations(candidate_id=res["candidate_id"]) if e.purpose == "remeasure"]
    assert len(again) == (1 if claims else 0)
    assert crowned == (claims and again[0].outcome == "faster" and not busy(again[0].evidence))
    if crowned:
        assert champ.evaluation_id == again[0].id and "confirmed by a fresh re-measure" in res["champion_change"]
    else:
        pytest.skip(f"the kernel measured {res['outcome']} on this machine now"
                    f"{', then ' + again[0].outcome if again else ''}: nothing to re-measure")
    cfg = RunConfig.build(problems="rmsnorm", budget=1, agents="seed", **{**FAST, "remeasure_champions": True})
    run_id = Coordinator(cfg, store).run()
    assert res["candidate_id"] not in {e.candidate_id for e in search_evals(store, run_id)}
    [re] = [e for e in store.evaluations(run_id=run_id) if e.purpose == "remeasure"
            and e.candidate_id == res["candidate_id"]]
    last = store.champion_history(p.name)[-1]
    if re.outcome == "faster" and not busy(re.evidence):
        assert last.candidate_id == res["candidate_id"] and "confirmed" in last.reason
    elif re.outcome == "inconclusive" or busy(re.evidence):
        assert last.candidate_id == res["candidate_id"] and "not confirmed" in last.reason
    else:  # slower now: demoted at once
        assert store.champion(p) is None or store.champion(p).candidate_id != res["candidate_id"]
