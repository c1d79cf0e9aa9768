import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest


def _return_freed_memory() -> None:
    """Give what finished tests freed back to the system: glibc keeps freed blocks in its heaps
    (after the first large free it raises the size above which it maps blocks on their own), so
    without a trim the test process grows by gigabytes over the suite."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or nextitem.path != item.path:  # a test file's fixtures are gone: trim once
        import gc

        gc.collect()
        _return_freed_memory()



def pytest_collection_modifyitems(config, items):
    if os.environ.get("SWARMFACTORY_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set SWARMFACTORY_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def harness():
    """A harness tuned for tests: fewer rounds, eager baselines only (speed is not asserted)."""
    from swarmfactory.harness.evaluate import Harness, HarnessConfig

    h = Harness(HarnessConfig(rounds=8, compile_baselines=False, case_timeout_s=5.0))
    yield h
    h.close()


@contextmanager
def _hogs(cpu: int, n: int):
    from swarmfactory.lifecycle import kill_tree

    procs = [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"],
                              start_new_session=True) for _ in range(n)]
    try:
        time.sleep(1.0)  # at full speed before anything is measured
        yield
    finally:
        for p in procs:
            kill_tree(p.pid)  # its process group, and it
            p.wait()


@pytest.fixture
def cpu_hogs():
    """``with cpu_hogs(cpu, n):`` ``n`` busy loops pinned to ``cpu``, killed with their session
    however the test ends."""
    return _hogs


@pytest.fixture
def store(tmp_path):
    from swarmfactory.evidence.store import Store

    return Store(str(tmp_path / "evidence.db"))


@pytest.fixture
def pg_url():
    """A fresh database on the PostgreSQL server of SWARMFACTORY_PG_URL (CI starts one), dropped
    afterwards; skips where none is set."""
    import uuid

    from sqlalchemy import create_engine, text

    server = os.environ.get("SWARMFACTORY_PG_URL")
    if not server:
        pytest.skip("SWARMFACTORY_PG_URL not set (CI starts a PostgreSQL server)")
    name = "sf_" + uuid.uuid4().hex[:10]
    admin = create_engine(server.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as c:
            c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
            c.execute(text(f"DROP DATABASE {name}"))
        admin.dispose()


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process on the machine."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                table[int(entry)] = (int(fields[1]), fields[0])
            except (OSError, IndexError, ValueError):
                pass
    return table


def descendants(pid: int) -> set[int]:
    """Every live process under ``pid`` (children, their children, ...), zombies excluded."""
    table = _proc_table()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, (pp, st) in table.items() if pp in frontier and p not in found}
        found |= frontier
    return {p for p in found if table[p][1] not in ("Z", "X")}


def still_alive(pids, within: float = 10.0) -> set[int]:
    """Those of ``pids`` still alive (not zombies) after waiting up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        table = _proc_table()
        left = {p for p in pids if p in table and table[p][1] not in ("Z", "X")}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.fixture
def process_tree():
    """``descendants(pid)`` and ``still_alive(pids, within)``: a process tree checked by pid, never
    by name."""
    class _Tree:
        pass

    t = _Tree()
    t.descendants, t.still_alive = descendants, still_alive
    return t


def _rss_mib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    """SWARMFACTORY_MEMTRACE=FILE: the test process's resident MiB after each test, one line per
    test (what holds memory across a suite)."""
    path = os.environ.get("SWARMFACTORY_MEMTRACE")
    if path:
        with open(path, "a") as f:
            f.write(f"{_rss_mib()}\t{nodeid}\n")
