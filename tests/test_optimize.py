"""``swarmfactory optimize``: the stages on a tiny model, a kill -9 in the kernel stage resumed where
it stopped, the time split, and one-line errors for what cannot run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, str(Path(__file__).resolve().parent / "engine"))
import tiny_models as tm  # noqa: E402

from swarmfactory.optimize import OptimizeConfig, OptimizeError, split  # noqa: E402

SF = str(Path(sys.executable).with_name("swarmfactory"))


def _env(tmp_path) -> dict:
    return {**os.environ, "SWARMFACTORY_CACHE": str(tmp_path / "cache"), "COLUMNS": "120"}


def _sf(tmp_path, *args, timeout=900):
    return subprocess.run([SF, *map(str, args)], capture_output=True, text=True, env=_env(tmp_path), timeout=timeout)


@pytest.fixture
def model(tmp_path) -> Path:
    # a context long enough for the tune's 128 x 128 requests
    return tm.write_gguf(tm.hf_model("llama", max_position_embeddings=4096), "llama", tmp_path / "tiny-llama.gguf",
                         QT.Q8_0)


def test_the_time_goes_by_share_and_no_slice_is_too_short_to_do_anything():
    assert split(200, {"a": 3, "b": 1}, floor=30) == {"a": 150, "b": 50}
    assert split(100, {"a": 3, "b": 1}, floor=30) == {"a": 100}  # b's 25 s go to a
    assert split(10, {"a": 3, "b": 1}, floor=30) == {}
    assert split(100, {"a": 1, "b": 0}, floor=1) == {"a": 100}
    # a problem whose evaluations take 300 s here does not get an 83 s slice: the others take it
    assert split(400, {"a": 3, "b": 1}, floor=30, floors={"b": 300}) == {"a": 400}
    assert split(400, {"a": 1, "b": 3}, floor=30, floors={"a": 300}) == {"b": 400}
    assert split(1200, {"a": 3, "b": 1}, floor=30, floors={"b": 300}) == {"a": 900, "b": 300}
    with pytest.raises(OptimizeError, match="kernel-share"):
        OptimizeConfig(model="m", kernel_share=1.5)


def test_a_kernel_stage_that_overran_leaves_the_engine_stage_its_time(tmp_path):
    """Planned kernel runs shrink to what the stage has left after the runs before them (which
    may each overrun their slice by an evaluation) and are skipped, saying so, below a run's
    minimum: the engine stage keeps its share (an optimize of Gemma spent 2577 s on 1440 s of
    kernel slices and left the tune its 120 s minimum)."""
    from swarmfactory.evidence.store import Store
    from swarmfactory.optimize import Optimizer

    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    lines: list[str] = []
    with Store(str(tmp_path / "e.db")) as st:
        opt = Optimizer(OptimizeConfig(model=str(m), time_s=1000, min_run_s=60), st, log=lines.append)
        opt.run_id = st.create_run(opt.state.to_dict())
        done = {"problem": "a", "pass": 1, "budget_s": 300, "run_id": "r1", "status": "finished", "seconds": 450}
        shrunk = {"problem": "b", "pass": 2, "budget_s": 200, "run_id": None, "status": "planned"}
        skipped = {"problem": "c", "pass": 2, "budget_s": 100, "run_id": None, "status": "planned"}
        opt.state.runs = [done, shrunk, skipped]
        assert opt._fits(shrunk, 600) and shrunk["budget_s"] == 150  # 600 s less the 450 s taken
        shrunk["seconds"] = 110
        assert not opt._fits(skipped, 600) and skipped["status"] == "skipped"
        assert "c skipped: 40 s of the kernel stage's 600 s are left" in lines[-1]
        saved = st.run(opt.run_id).config["runs"]
        assert [r["status"] for r in saved] == ["finished", "planned", "skipped"]


def test_what_cannot_run_is_one_line(tmp_path, model):
    r = _sf(tmp_path, "optimize", "--store", tmp_path / "e.db")
    assert r.returncode == 2 and "MODEL.gguf, or --resume" in r.stderr
    r = _sf(tmp_path, "optimize", tmp_path / "none.gguf", "--store", tmp_path / "e.db")
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr
    r = _sf(tmp_path, "optimize", model, "--kernel-share", "1", "--store", tmp_path / "e.db")
    assert r.returncode == 2 and "--kernel-share" in r.stderr
    r = _sf(tmp_path, "optimize", "--resume", "feedbeef", "--store", tmp_path / "e.db")
    assert r.returncode == 2 and "no run 'feedbeef'" in r.stderr and "Traceback" not in r.stderr


def _optimize_run(db: Path) -> dict | None:
    """The optimize run's recorded state, read as ``show`` would (None before it exists)."""
    from swarmfactory.evidence.store import Store

    if not db.exists():
        return None
    with Store(str(db), create=False) as st:
        run = next((r for r in st.runs() if r.config.get("kind") == "optimize"), None)
        return None if run is None else {"id": run.id, "status": run.status, **run.config}


@pytest.mark.slow(covers=("swarmfactory/optimize.py", "swarmfactory/problems/derive.py",
                          "swarmfactory/enginefactory/", "swarmfactory/swarm/coordinator.py"))
def test_every_stage_runs_and_a_kill_9_in_the_kernel_stage_resumes_where_it_stopped(tmp_path, model):
    db = tmp_path / "e.db"
    args = ["optimize", model, "--time", "150s", "--kernel-share", "0.3", "--min-kernel-run", "20s",
            "--concurrency", "1,4", "--store", db, "--json"]
    proc = subprocess.Popen([SF, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path), start_new_session=True)
    state, deadline = None, time.monotonic() + 300
    try:
        while time.monotonic() < deadline:  # until the first kernel run has started
            time.sleep(2)
            opt = _optimize_run(db)
            running = [r for r in (opt or {}).get("runs", []) if r["status"] == "running"]
            if running:
                time.sleep(8)  # into its evaluations
                state = _optimize_run(db)
                break
            assert proc.poll() is None, proc.communicate()
        assert state is not None, "the kernel stage never started"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert state["stage"] == "kernels" and state["status"] == "running"  # killed: never closed
    first = next(r for r in state["runs"] if r["status"] == "running")
    assert state["problems"][0]["name"].endswith(".tiny-llama") and state["derivation"]["architecture"] == "llama"

    r = _sf(tmp_path, "optimize", "--resume", state["id"], "--store", db, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["run_id"] == state["id"] and summary["stage"] == "done"
    assert f"resuming run {first['run_id']}" in r.stderr  # the killed kernel run continued, not restarted
    done = _optimize_run(db)
    assert done["status"] == "finished" and done["tune_status"] == "finished" and done["tune_run"]
    resumed = next(x for x in done["runs"] if x["problem"] == first["problem"] and x["pass"] == first["pass"])
    assert resumed["run_id"] == first["run_id"] and resumed["status"] == "finished"
    assert set(done["seconds"]) == {"derive", "kernels", "engine"}
    # each kernel run's own time beside its slice (the killed session's part is lost with it)
    assert all(r["seconds"] > 0 for r in done["runs"] if r["status"] == "finished")
    assert all(p["seconds"] >= 0 and p["budget_s"] > 0 for p in summary["problems"] if p["runs"])
    assert summary["engine"]["default_tok_s"] > 0
    from swarmfactory.evidence.store import Store

    with Store(str(db), create=False) as st:
        assert st.run(first["run_id"]).status == "finished"
        assert st.run(done["tune_run"]).status == "finished"
