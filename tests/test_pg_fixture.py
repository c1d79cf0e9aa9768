"""The tests' own PostgreSQL server (conftest ``_start_pg``) must not outlive the test process,
however it ends: a suite killed mid-way once left its server running."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# Starts a server as the session fixture does, says its postmaster's pid, then waits to be killed.
SCRIPT = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import conftest
from swarmfactory import lifecycle
try:
    url, stop = conftest._start_pg()
except BaseException as e:   # pytest.skip outside pytest
    print("SKIP", e, flush=True)
    sys.exit(0)
pids = [p for p, what in lifecycle.adopted().items() if what == "PostgreSQL test server"]
print(url.rsplit(":", 1)[1].split("/")[0], *pids, flush=True)
time.sleep(600)
"""


def _servers(port: str) -> list[int]:
    """The test servers (their postmasters) listening on ``port``, found by command line."""
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any("sf-pg-" in a for a in cmd) and "-p" in cmd and cmd[cmd.index("-p") + 1:][:1] == [port]:
            found.append(int(d))
    return found


def _folder(pid: int) -> Path | None:
    """The server's own temporary folder (the parent of its ``-D`` data folder, named sf-pg-*)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    data = Path(cmd[cmd.index("-D") + 1]) if "-D" in cmd[:-1] else None
    return data.parent if data is not None and data.parent.name.startswith("sf-pg-") else None


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_the_test_postgres_server_dies_with_a_killed_test_process():
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(HERE)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        if line and line[0] == "SKIP":
            pytest.skip("no PostgreSQL server could be started here: " + " ".join(line[1:]))
        assert line, "the helper said nothing"
        port, adopted = line[0], [int(p) for p in line[1:]]
        servers = _servers(port)
        folders = [_folder(pid) for pid in servers]
        assert servers, f"no server found on port {port}"
    finally:
        proc.send_signal(signal.SIGKILL)   # no atexit, no fixture teardown
        proc.wait()
    deadline = time.monotonic() + 20
    while any(map(_alive, servers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in servers if _alive(pid)]
    for pid in alive:   # clean up after a failure
        os.kill(pid, signal.SIGKILL)
    for folder in folders:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    assert adopted == servers, "the server was not adopted"
    assert not alive, "the PostgreSQL test server outlived the process that started it"
