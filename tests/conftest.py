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


# Session harnesses: their baseline workers (150-450 MB each) are closed at the end of every test
# file, so the suite holds those of one file at a time; the next file that asks starts its own.
SESSION_HARNESSES: list = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or nextitem.path != item.path:  # a test file's fixtures are gone: trim once
        import gc

        for h in SESSION_HARNESSES:
            h.baselines.close()
        engines = sys.modules.get("engine_support")  # the engine tests' shared engines
        if engines is not None:
            engines.forget_engines()
        verify = sys.modules.get("swarmfactory.harness.verify")  # cases another file may never draw again
        if verify is not None:
            verify.CASES.clear()
        gc.collect()
        _return_freed_memory()



# A slow test runs when SWARMFACTORY_SLOW=1, or when the code it names (``@pytest.mark.slow(covers=
# (path prefixes...))``) changed in the landing under test: the commits within LANDING_HOURS of
# HEAD's, and what is not committed yet (a clean clone in CI has nothing uncommitted). A slow test
# without ``covers`` runs only with SWARMFACTORY_SLOW=1.
LANDING_HOURS = 12
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def changed_paths() -> set[str] | None:
    """Files the landing under test changed (relative to the repository), or None where git cannot
    say (then every slow test with ``covers`` runs)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True,
                              timeout=30).stdout

    try:
        head = int(git("log", "-1", "--format=%ct").strip())
        committed = git("log", f"--since={head - LANDING_HOURS * 3600}", "--name-only", "--format=")
        pending = git("status", "--porcelain", "--untracked-files=all")
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    paths = {line.strip() for line in committed.splitlines() if line.strip()}
    paths |= {line[3:].split(" -> ")[-1].strip() for line in pending.splitlines() if len(line) > 3}
    return paths


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SWARMFACTORY_SLOW") == "1":
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    changed = changed_paths() if any(item.get_closest_marker("slow").kwargs.get("covers") for item in slow) else set()
    for item in slow:
        covers = tuple(item.get_closest_marker("slow").kwargs.get("covers", ()))
        if covers and (changed is None or any(p.startswith(covers) for p in changed)):
            continue  # its code changed in this landing: it runs
        why = (f"its code ({', '.join(covers)}) did not change in this landing" if covers else "slow")
        item.add_marker(pytest.mark.skip(reason=f"{why}; SWARMFACTORY_SLOW=1 runs it"))


@pytest.fixture(scope="session")
def harness():
    """A harness tuned for tests: fewer rounds, eager baselines only (speed is not asserted)."""
    from swarmfactory.harness.evaluate import Harness, HarnessConfig

    h = Harness(HarnessConfig(rounds=8, compile_baselines=False, case_timeout_s=5.0))
    SESSION_HARNESSES.append(h)
    yield h
    SESSION_HARNESSES.remove(h)
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
    """A new SQLite store, closed after the test."""
    from swarmfactory.evidence.store import Store

    with Store(str(tmp_path / "evidence.db")) as st:
        yield st


# -- PostgreSQL: one server for the session, a fresh database per test ---------------------------
def _pg_bin(tool: str) -> str | None:
    """A PostgreSQL server tool: on PATH, else the newest of Debian's versioned folders."""
    import glob
    import shutil

    found = shutil.which(tool)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{tool}"),
                      key=lambda p: int(p.split("/")[-3]) if p.split("/")[-3].isdigit() else 0)
    return versions[-1] if versions else None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_pg():
    """A throwaway PostgreSQL server in a temporary folder: (URL, stop). Trust authentication,
    127.0.0.1 only, no fsync. The server refuses to run as root: as root it runs as the
    ``postgres`` user (else ``nobody``). Skips where no server can be started."""
    import pwd
    import shutil
    import tempfile

    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("no PostgreSQL server: set SWARMFACTORY_PG_URL or install PostgreSQL (initdb, pg_ctl)")
    user = None
    if os.geteuid() == 0:
        for name in ("postgres", "nobody"):
            try:
                user = pwd.getpwnam(name)
                break
            except KeyError:
                continue
        if user is None:
            pytest.skip("running as root and no user to run PostgreSQL as: set SWARMFACTORY_PG_URL")
    folder = tempfile.mkdtemp(prefix="sf-pg-")
    data = os.path.join(folder, "data")

    def as_user():
        if user is not None:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)

    def run(*cmd):
        return subprocess.run(cmd, preexec_fn=as_user, capture_output=True, text=True, timeout=120,
                              cwd=folder, env={**os.environ, "LC_ALL": "C"})

    if user is not None:
        os.chown(folder, user.pw_uid, user.pw_gid)
    port = _free_port()
    started = run(initdb, "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
    if started.returncode == 0:
        opts = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        started = run(pg_ctl, "-D", data, "-o", opts, "-l", os.path.join(folder, "log"), "-w", "-t", "60", "start")

    from swarmfactory import lifecycle

    postmaster = None
    if started.returncode == 0:
        # pg_ctl leaves the server running on its own: adopted, it dies with this process
        # however that ends (SIGTERM, SIGKILL, the OOM killer), not only at the session's end
        try:
            with open(os.path.join(data, "postmaster.pid")) as f:
                postmaster = int(f.readline())
            lifecycle.adopt(postmaster, "PostgreSQL test server", ledger_too=False)
        except (OSError, ValueError):
            postmaster = None

    def stop():
        run(pg_ctl, "-D", data, "-m", "immediate", "-w", "stop")
        if postmaster is not None:
            lifecycle.release(postmaster)
        shutil.rmtree(folder, ignore_errors=True)

    if started.returncode != 0:
        stop()
        why = (started.stderr or started.stdout).strip().splitlines()
        pytest.skip(f"PostgreSQL could not be started here ({why[-1] if why else 'no message'}): "
                    "set SWARMFACTORY_PG_URL")
    return f"postgresql://postgres@127.0.0.1:{port}/postgres", stop


@pytest.fixture(scope="session")
def pg_server():
    """The PostgreSQL server every PostgreSQL test uses: SWARMFACTORY_PG_URL's (CI starts one),
    else one started here for the session and stopped at its end; the tests that need it skip
    where neither is possible."""
    server = os.environ.get("SWARMFACTORY_PG_URL")
    if server:
        yield server
        return
    server, stop = _start_pg()
    try:
        yield server
    finally:
        stop()


@contextmanager
def _pg_database(server: str):
    import uuid

    from sqlalchemy import create_engine, text

    name = "sf_" + uuid.uuid4().hex[:10]
    admin = create_engine(server.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f"CREATE DATABASE {name}"))
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_database(pg_server):
    """``with pg_database() as url:`` a fresh database on the tests' PostgreSQL server, dropped
    (its connections ended) at the end of the block: for fixtures that outlive one test."""
    return lambda: _pg_database(pg_server)


@pytest.fixture
def pg_url(pg_database):
    """A fresh database on the tests' PostgreSQL server, dropped after the test."""
    with pg_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def any_url(request, tmp_path):
    """A new store's location on each backend: a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "e.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def any_store(any_url):
    """A new store on each backend, closed after the test."""
    from swarmfactory.evidence.store import Store

    with Store(any_url) as store:
        yield store


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
