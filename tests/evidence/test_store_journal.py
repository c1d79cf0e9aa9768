"""Writes a store does not take are kept, never lost and never written twice: a store opened for
writing is checked before any work; a write refused later (a full disk, a revoked privilege) is
kept in the journal with the rest of its record and written in, once, at the next open for
writing. Real SQLite files in a child process whose files cannot grow (a full disk), a real
PostgreSQL server where one is given."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

import pytest
from sqlalchemy import create_engine, text

from swarmfactory.evidence.store import Store, StoreError, StoreWriteError

# Records a run and one verdict, its files held at their size after the open: a full disk.
FULL_DISK = textwrap.dedent('''
    import os, resource, signal, sys
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.evidence.store import Store, StoreWriteError
    from swarmfactory.outcome import Outcome, Verdict
    from swarmfactory.problems import load_problem

    db = sys.argv[1]
    st = Store(db)
    p = load_problem("rmsnorm")
    run = st.create_run({"problems": ["rmsnorm"], "budget": 3})
    cand = candidate_record(p, "/* kept */\\n" + p.render(), "seed", "test", run_id=run)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    full = max(os.path.getsize(db), os.path.getsize(db + "-wal"))
    resource.setrlimit(resource.RLIMIT_FSIZE, (full, resource.RLIM_INFINITY))
    try:
        st.record_verdict(p, cand, Verdict(Outcome.BUILD_FAILED, "no", "build"), run, "vv")
    except StoreWriteError as exc:
        print("raised:", exc)
    try:
        st.set_run_status(run, "interrupted")
    except StoreWriteError as exc:
        print("raised:", exc)
    print("run:", run, cand["id"])
''')


def test_a_full_disk_keeps_the_whole_verdict_and_the_next_open_writes_it_in_once(tmp_path):
    db = tmp_path / "e.db"
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(db)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    raised = [ln for ln in lines if ln.startswith("raised:")]
    assert len(raised) == 2 and all(f"kept in {db}.pending.jsonl" in ln for ln in raised), proc.stdout
    assert "INSERT" not in proc.stdout
    run, cid = lines[-1].split()[1:]
    journal = tmp_path / "e.db.pending.jsonl"
    assert len(journal.read_text().splitlines()) >= 3  # candidate, evaluation, run status (+ problem)

    reader = Store(str(db), create=False)  # reading does not write the journal in
    assert reader.evaluations() == [] and journal.exists()
    st = Store(str(db))
    written, skipped = st.replayed
    assert written >= 3 and skipped == 0 and not journal.exists()
    assert [e.candidate_id for e in st.evaluations()] == [cid]
    assert st.run(run).status == "interrupted" and st.candidate(cid).source.startswith("/* kept */")
    assert Store(str(db)).replayed == (0, 0) and len(st.evaluations()) == 1


def test_a_journaled_row_the_store_got_meanwhile_is_skipped(tmp_path):
    db = tmp_path / "e.db"
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(db)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run, cid = proc.stdout.splitlines()[-1].split()[1:]
    kept = [json.loads(ln) for ln in (tmp_path / "e.db.pending.jsonl").read_text().splitlines()]
    cand = next(k["values"] for k in kept if k["table"] == "candidates")
    other = Store(str(db), write=False)  # another process recorded the same candidate meanwhile
    assert other.record_candidate(cand)
    st = Store(str(db))
    assert st.replayed[1] == 1 and st.replayed[0] == len(kept) - 1
    assert [e.candidate_id for e in st.evaluations()] == [cid]


@pytest.fixture
def pg_role(pg_url):
    """(admin engine of the store's database, a URL of the store as a role that owns nothing,
    with a password)."""
    admin = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    Store(pg_url).close()
    role = "sf_r_" + uuid.uuid4().hex[:8]
    with admin.connect() as c:
        c.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD 'secret-pw'"))
        c.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
    rest = pg_url.split("://", 1)[1].split("@", 1)[-1]
    try:
        yield admin, role, f"postgresql://{role}:secret-pw@{rest}"
    finally:
        with admin.connect() as c:
            c.execute(text(f"DROP OWNED BY {role}"))
            c.execute(text(f"DROP ROLE {role}"))
        admin.dispose()


def test_postgresql_a_read_only_role_is_refused_at_open_without_its_password(pg_role):
    _admin, _role, url = pg_role
    with pytest.raises(StoreError) as err:
        Store(url)
    msg = str(err.value)
    assert "is not writable" in msg and "permission denied" in msg and "secret-pw" not in msg and ":***@" in msg
    assert Store(url, create=False).run() is None


def test_postgresql_a_write_refused_mid_run_is_journaled_and_written_in_later(pg_role, tmp_path, monkeypatch):
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.outcome import Outcome, Verdict
    from swarmfactory.problems import load_problem

    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "cache"))
    admin, role, url = pg_role
    with admin.connect() as c:
        c.execute(text(f"GRANT INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {role}"))
        c.execute(text(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"))
    st = Store(url)
    p = load_problem("rmsnorm")
    run = st.create_run({"problems": ["rmsnorm"]})
    with admin.connect() as c:  # the privilege goes away while the run goes on
        c.execute(text(f"REVOKE INSERT ON evaluations FROM {role}"))
    cand = candidate_record(p, "/* pg */\n" + p.render(), "seed", "test", run_id=run)
    with pytest.raises(StoreWriteError) as err:
        st.record_verdict(p, cand, Verdict(Outcome.WRONG, "no", "verify"), run, "vv")
    msg = str(err.value)
    assert "permission denied" in msg and str(tmp_path / "cache" / "pending") in msg and "secret-pw" not in msg
    with pytest.raises(StoreWriteError):  # later writes go to the journal too, in order
        st.set_run_status(run, "interrupted")
    st.close()

    with admin.connect() as c:
        c.execute(text(f"GRANT INSERT ON evaluations TO {role}"))
    again = Store(url)
    assert again.replayed[0] >= 2 and not list((tmp_path / "cache" / "pending").iterdir())
    assert [e.candidate_id for e in again.evaluations()] == [cand["id"]]
    assert again.run(run).status == "interrupted"
