"""Ctrl-C on `swarmfactory run`: exit code 130, the resume command printed, and the run resumes
under the same id (then a second Ctrl-C behaves the same)."""

import re
import signal
import subprocess
import time

import pytest
from cli_support import clean_env, entry_point

from swarmfactory.evidence.store import Store

RESUME = re.compile(r"swarmfactory run --resume (\w+) --store (\S+)")


def _search_evaluations(db, run_id=None) -> int:
    with Store(str(db), create=False) as store:
        return sum(1 for e in store.evaluations(run_id=run_id) if e.purpose == "search")


def _default_sigint():
    # A shell's background job inherits SIGINT ignored, and so would the run; a terminal's
    # foreground process has it at its default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_after(args, db, cwd, more_than: int, deadline_s: float = 420):
    """Start `swarmfactory ARGS`, wait until the store holds more than ``more_than`` search
    evaluations (the run loop is busy), send SIGINT as a terminal's Ctrl-C would."""
    proc = subprocess.Popen([entry_point(), *args], cwd=cwd, env=clean_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < deadline_s:
            assert proc.poll() is None, f"run ended before it was interrupted: {proc.communicate()}"
            if db.exists() and _search_evaluations(db) > more_than:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("no evaluation recorded in time")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.slow
def test_ctrl_c_exits_130_prints_the_resume_command_and_the_run_resumes(tmp_path):
    db = tmp_path / "e.db"
    args = ["run", "--problems", "rmsnorm", "--agents", "seed,random-restart", "--time", "30m",
            "--rounds", "3", "--no-compile-baselines", "--parallel", "1", "--store", str(db)]
    rc, _, err = _interrupt_after(args, db, tmp_path, more_than=0)
    assert rc == 130, err
    m = RESUME.search(err)
    assert m and m.group(2) == str(db), err
    run_id = m.group(1)
    assert "Traceback" not in err
    store = Store(str(db), create=False)
    assert store.run(run_id).status == "interrupted"
    first = _search_evaluations(db, run_id)
    store.close()

    rc, _, err = _interrupt_after(["run", "--resume", run_id, "--store", str(db)], db, tmp_path, more_than=first)
    assert rc == 130, err
    assert RESUME.search(err).group(1) == run_id  # the same run, still resumable
    store = Store(str(db), create=False)
    assert [r.id for r in [store.run()]] == [run_id] and store.run(run_id).status == "interrupted"
    assert _search_evaluations(db, run_id) > first  # it went on where it stopped

    show = subprocess.run([entry_point(), "show", run_id, "--store", str(db)], capture_output=True, text=True,
                          env=clean_env(), timeout=300)
    assert show.returncode == 0 and f"swarmfactory run --resume {run_id}" in show.stdout, show.stderr
