"""Exit codes through the installed entry point: 0 on success, 2 with one line for bad input
(engine commands included), never a traceback without --debug."""

import socket

import pytest
from cli_support import sf


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BAD_INPUT = {
    "unknown command": (["nosuchcmd"], "No such command"),
    "unknown option": (["run", "--bogus"], "No such option"),
    "bad integer": (["run", "--budget", "x"], "--budget"),
    "missing argument": (["eval"], "Missing argument"),
    "no budget": (["run", "--problems", "rmsnorm"], "give a budget"),
    "bad duration": (["run", "--time", "ten minutes"], "bad duration"),
    "unknown problem": (["cases", "nope"], "unknown problem"),
    "engine: bad concurrency": (["engine", "bench", "--concurrency", "abc"], "--concurrency"),
    "engine: unknown weights": (["engine", "serve", "--weights", "int3"], "weights"),
    "engine: unknown option": (["engine", "serve", "--bogus"], "No such option"),
}


@pytest.mark.parametrize("args,expected", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_exits_2_with_one_line(args, expected, tmp_path):
    proc = sf(*args, cwd=tmp_path)
    assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_engine_errors_exit_2_through_the_entry_point(tmp_path):
    port = _closed_port()
    proc = sf("engine", "bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1", cwd=tmp_path)
    assert proc.returncode == 2 and "cannot reach" in proc.stderr, proc.stderr
    proc = sf("engine", "generate", "hi", "--model", tmp_path / "missing.gguf", cwd=tmp_path)
    assert proc.returncode == 2 and "missing.gguf" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_help_exits_0_and_no_command_prints_help():
    for args in (["--help"], ["run", "--help"], ["engine", "--help"], ["engine", "bench", "--help"]):
        proc = sf(*args)
        assert proc.returncode == 0 and "Usage: swarmfactory" in proc.stdout, (args, proc.stderr)
    proc = sf()
    assert proc.returncode == 2 and "Usage: swarmfactory" in proc.stdout and not proc.stderr.strip()


def test_debug_shows_the_traceback_of_a_store_error(tmp_path):
    proc = sf("show", "--store", tmp_path / "missing.db", "--debug")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "StoreError" in proc.stderr
