"""Failures a user meets are one line with the right exit code, and lose nothing: a store that takes
no write (refused before any work; a write that fails later is kept in a journal and written in at
the next open), a report that cannot be written, passwords in store URLs, a dead LLM endpoint, a
busy port for the engine, new limits for a resumed run, unknown problems.

Everything is real: SQLite files, the installed entry point in its own process, a closed port on
127.0.0.1. A read-only file is read-only for root too: the command runs without CAP_DAC_OVERRIDE.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import clean_env, entry_point, recorded_run

ADV = Path(__file__).parents[1] / "adversarial" / "rmsnorm"
# A user problem whose every kernel fails to build at once: runs that need verdicts but no timing.
UNBUILDABLE = '''import dataclasses

from swarmfactory.problems import load_problem

PROBLEM = dataclasses.replace(load_problem("rmsnorm"), name="rmsnorm_unbuildable",
                              template="not C {{ vw }} {{ acc }} {{ unroll }} {{ scale }} {{ threads }}")
'''


def _no_dac_override():
    """In the child, before exec: root loses the right to write what its modes forbid."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_DAC_OVERRIDE
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _file_limit(limit: int):
    """In the child: files stop growing at ``limit`` bytes, as on a full disk (its own children may
    raise the soft limit back: the compiler is not starved)."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return apply


def sf(*args, cwd, preexec=None, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([entry_point(), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=clean_env(**(env or {})), timeout=timeout, preexec_fn=preexec)


def one_error_line(proc, *needles: str) -> str:
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def read_only(tmp_path):
    """``read_only(path)``: ``path`` (a file or a folder) made read-only for the commands of this
    test; skips where this user writes regardless."""
    probe = tmp_path / "probe"
    probe.write_text("")
    probe.chmod(0o444)
    wrote = subprocess.run(["/bin/sh", "-c", f"echo x >> {probe}"], capture_output=True,
                           preexec_fn=_no_dac_override).returncode == 0
    probe.unlink()
    if wrote:
        pytest.skip("this user writes to read-only files")

    made = []

    def make(path: Path) -> Path:
        path.chmod(0o555 if path.is_dir() else 0o444)
        made.append(path)
        return path

    yield make
    for path in made:
        path.chmod(0o755 if path.is_dir() else 0o644)


# -- 1. a store that takes no write ---------------------------------------------------------------

WRITERS = {
    "eval": ["eval", "--problem", "rmsnorm", ADV / "syntax_error.c"],
    "run": ["run", "--problems", "rmsnorm", "--budget", "1"],
    "verify": ["verify", "--problem", "rmsnorm"],
}


@pytest.mark.parametrize("args", WRITERS.values(), ids=WRITERS.keys())
def test_a_read_only_store_is_refused_in_one_line_before_any_work(args, tmp_path, read_only):
    db = tmp_path / "e.db"
    recorded_run(db)
    before = db.read_bytes()
    read_only(db)
    t0 = time.monotonic()
    proc = sf(*args, "--store", db, cwd=tmp_path, preexec=_no_dac_override)
    assert proc.returncode == 2, proc.stderr
    one_error_line(proc, f"the store sqlite:///{db} is not writable", "read-only")
    assert time.monotonic() - t0 < 30  # nothing was built, verified or measured
    assert db.read_bytes() == before and not list(tmp_path.glob("*.pending.jsonl"))


def test_a_store_in_a_read_only_folder_is_refused_in_one_line(tmp_path, read_only):
    folder = tmp_path / "archive"
    folder.mkdir()
    recorded_run(folder / "e.db")
    read_only(folder)
    for store in (folder / "e.db", folder / "new.db"):
        proc = sf("run", "--problems", "rmsnorm", "--budget", "1", "--store", store, cwd=tmp_path,
                  preexec=_no_dac_override)
        assert proc.returncode == 2, proc.stderr
        one_error_line(proc, "is not writable", f"folder {folder}")
    assert sorted(p.name for p in folder.iterdir()) == ["e.db"]


def test_a_verdict_the_store_cannot_take_is_kept_and_written_in_at_the_next_open(tmp_path):
    db = tmp_path / "e.db"
    recorded_run(db)
    big = tmp_path / "big.c"  # its candidate row alone outgrows what the store's files may grow by
    big.write_text("/* " + "padding " * 6000 + "*/\n" + (ADV / "syntax_error.c").read_text())
    proc = sf("eval", "--problem", "rmsnorm", big, "--store", db, cwd=tmp_path, preexec=_file_limit(64 * 1024))
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc, f"the store sqlite:///{db} is not writable", f"kept in {db}.pending.jsonl")
    assert "INSERT" not in proc.stderr and "[SQL" not in proc.stderr
    assert proc.stdout.startswith("build_failed") and "not recorded yet" in proc.stdout  # the verdict is shown
    assert (tmp_path / "e.db.pending.jsonl").is_file(), line

    again = sf("eval", "--problem", "rmsnorm", ADV / "syntax_error.c", "--store", db, "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "record(s) kept from an earlier failed write" in again.stderr
    assert not (tmp_path / "e.db.pending.jsonl").exists()
    from swarmfactory.evidence.store import Store

    st = Store(str(db), create=False)
    kept = [e for e in st.evaluations() if e.purpose == "eval"]
    assert len(kept) == 2 and st.candidate(kept[0].candidate_id).source == big.read_text()
    assert kept[0].outcome == "build_failed" and json.loads(again.stdout)["evaluation_id"] == kept[1].id


def test_a_report_that_cannot_be_written_is_one_line(tmp_path, read_only):
    db = tmp_path / "e.db"
    recorded_run(db)
    if Path("/dev/full").exists():  # a full disk
        proc = sf("report", "-o", "/dev/full", "--store", db, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        one_error_line(proc, "cannot write the report to /dev/full", "No space left on device")
    (tmp_path / "ro").mkdir()
    folder = read_only(tmp_path / "ro")
    proc = sf("report", "-o", folder / "r.html", "--store", db, cwd=tmp_path, preexec=_no_dac_override)
    assert proc.returncode == 2, proc.stderr
    one_error_line(proc, f"cannot write the report to {folder / 'r.html'}", "not writable")
    assert not (folder / "r.html").exists()


# -- 2. passwords ---------------------------------------------------------------------------------

def test_a_store_password_is_never_printed(tmp_path):
    url = f"postgresql://user:secret@127.0.0.1:{_closed_port()}/db"
    for args in (["show"], ["lessons"], ["run", "--problems", "rmsnorm", "--budget", "1"], ["show", "--debug"]):
        proc = sf(*args, "--store", url, cwd=tmp_path)
        assert proc.returncode != 0 and "secret" not in proc.stderr + proc.stdout, (args, proc.stderr)
        if "--debug" not in args:
            assert proc.returncode == 2
            one_error_line(proc, "postgresql")
            assert "user:***@127.0.0.1" in proc.stderr


def test_redact_hides_url_and_connection_string_passwords():
    from swarmfactory.redact import redact

    assert redact("postgresql://user:secret@host/db") == "postgresql://user:***@host/db"
    assert redact("x postgresql+psycopg://u:p/w:d@h:5432/db y") == "x postgresql+psycopg://u:***@h:5432/db y"
    assert redact("host=h password=hunter2 dbname=d") == "host=h password=*** dbname=d"
    assert redact("sqlite:////tmp/e.db and http://127.0.0.1:8000/v1") == "sqlite:////tmp/e.db and http://127.0.0.1:8000/v1"


# -- 3. a dead LLM endpoint -----------------------------------------------------------------------

def test_an_llm_only_run_with_a_dead_endpoint_stops_at_once_with_exit_2(tmp_path):
    url = f"http://user:pw@127.0.0.1:{_closed_port()}/v1"
    t0 = time.monotonic()
    proc = sf("run", "--problems", "rmsnorm", "--agents", "llm", "--llm", url, "--llm-model", "m", "--budget", "3",
              "--store", tmp_path / "e.db", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - t0 < 60  # no retries every ~30 s on a refused connection
    line = one_error_line(proc, "every agent stopped", "user:***@127.0.0.1", "Connection refused",
                          "3 failed calls in a row", "--resume")
    assert ":pw@" not in proc.stderr + proc.stdout, line
    show = sf("show", "--store", tmp_path / "e.db", "--json", cwd=tmp_path)
    summary = json.loads(show.stdout)
    assert summary["status"] == "interrupted" and summary["llm"][0]["stopped"].startswith("LLM agent")


def test_a_mixed_run_goes_on_without_a_dead_llm_and_its_summary_says_why(tmp_path):
    problem = tmp_path / "unbuildable.py"
    problem.write_text(UNBUILDABLE)
    proc = sf("run", "--problems", problem, "--agents", "default,llm", "--llm", f"http://127.0.0.1:{_closed_port()}/v1",
              "--llm-model", "m", "--budget", "6", "--parallel", "1", "--store", tmp_path / "e.db", "--json",
              cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "finished" and summary["evaluations"] == 6
    stopped = summary["llm"][0]["stopped"]
    assert "stopped after 3 failed calls in a row" in stopped and "Connection refused" in stopped
    assert any("LLM agent" in w and "stopped" in w for w in summary["warnings"])


# -- 4. the engine on a busy port -----------------------------------------------------------------

def test_engine_serve_on_a_busy_port_is_one_line_before_the_model_loads(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        proc = sf("engine", "serve", "--port", port, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - t0 < 15 and "loaded" not in proc.stderr
    one_error_line(proc, f"127.0.0.1:{port}", "Address already in use")


# -- 5. new limits for a resumed run --------------------------------------------------------------

def _interrupted_run(db: Path, problem: Path, done: int = 0, **config) -> str:
    """A run as a Ctrl-C leaves it: recorded with its config, ``done`` build failures, interrupted."""
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.config import RunConfig
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Outcome, Verdict
    from swarmfactory.problems import load_problem
    from swarmfactory.validation import validation_set

    st = Store(str(db))
    cfg = RunConfig.build(problems=str(problem), agents="default", parallel=1, **config)
    run = st.create_run(cfg.model_dump())
    p = load_problem(str(problem))
    for k in range(done):
        cand = candidate_record(p, f"/* {k} */ not C", "seed", "test", run_id=run)
        st.record_verdict(p, cand, Verdict(Outcome.BUILD_FAILED, "no", "build"), run, validation_set(p, st)[1])
    st.set_run_status(run, "interrupted")
    st.close()
    return run


def test_resume_takes_a_new_budget_or_time_and_keeps_the_recorded_ones_otherwise(tmp_path):
    problem = tmp_path / "unbuildable.py"
    problem.write_text(UNBUILDABLE)
    db = tmp_path / "e.db"
    more, same, timed, done = (_interrupted_run(db, problem, budget=2), _interrupted_run(db, problem, budget=2),
                               _interrupted_run(db, problem, budget=2, time_s=600),
                               _interrupted_run(db, problem, done=2, budget=2))
    proc = sf("run", "--resume", more, "--budget", "4", "--store", db, "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["evaluations"] == 4 and res["config"]["budget"] == 4 and res["status"] == "finished"
    proc = sf("run", "--resume", same, "--store", db, "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["evaluations"] == 2, proc.stderr
    proc = sf("run", "--resume", timed, "--time", "1h", "--store", db, "--json", cwd=tmp_path, timeout=120)
    res = json.loads(proc.stdout)
    assert res["config"]["time_s"] == 3600 and res["config"]["budget"] == 2 and res["evaluations"] == 2

    proc = sf("run", "--resume", done, "--budget", "2", "--store", db, cwd=tmp_path)
    assert proc.returncode == 2
    one_error_line(proc, f"run {done} already made 2 evaluations", "--budget 2")
    proc = sf("run", "--resume", done, "--agents", "seed", "--parallel", "2", "--store", db, cwd=tmp_path)
    assert proc.returncode == 2
    one_error_line(proc, "only --budget and --time may change", "--agents, --parallel")


# -- 6. unknown problems --------------------------------------------------------------------------

UNKNOWN = {
    "eval": ["eval", "--problem", "bogus", ADV / "syntax_error.c"],
    "run": ["run", "--problems", "rmsnorm,bogus", "--budget", "1"],
    "verify": ["verify", "--problem", "bogus"],
    "lessons": ["lessons", "--problem", "bogus"],
    "cases": ["cases", "bogus"],
}


@pytest.mark.parametrize("args", UNKNOWN.values(), ids=UNKNOWN.keys())
def test_an_unknown_problem_is_one_line_exit_2_naming_the_known_ones(args, tmp_path):
    db = tmp_path / "e.db"
    recorded_run(db)
    before = db.read_bytes()
    proc = sf(*args, "--store", db, cwd=tmp_path)
    assert proc.returncode == 2, (args, proc.stderr)
    one_error_line(proc, "unknown problem 'bogus'", "known: rmsnorm, softmax")
    assert db.read_bytes() == before


def test_lessons_takes_a_problem_the_store_knows_though_it_is_not_bundled(tmp_path):
    from swarmfactory.evidence.store import Store

    db = tmp_path / "e.db"
    Store(str(db)).add_lesson("my_op", "analyst", "vw=8 beats vw=4", {"key": "k1", "knob": "vw"}, None)
    proc = sf("lessons", "--problem", "my_op", "--store", db, cwd=tmp_path)
    assert proc.returncode == 0 and "my_op" in proc.stdout, proc.stderr
