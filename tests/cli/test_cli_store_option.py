"""--store: reading commands never create a store or a folder; every store error is one line,
exit 2; the default store's folder is the only one created for the user."""

import sqlite3

import pytest
from cli_support import recorded_run, sf

READING = {
    "show": ["show"],
    "show --json": ["show", "--json"],
    "report": ["report", "-o", "report.html"],
    "verify": ["verify", "--problem", "rmsnorm"],
}


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("args", READING.values(), ids=READING.keys())
def test_reading_commands_leave_no_file_or_folder_behind(args, tmp_path):
    for store in ("typo.db", "no/such/folder/e.db"):
        proc = sf(*args, "--store", store, cwd=tmp_path)
        assert proc.returncode == 2, (args, store, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "no evidence store at" in proc.stderr
        assert _tree(tmp_path) == [], (args, store, _tree(tmp_path))


def test_reading_commands_do_not_create_the_default_store(tmp_path):
    proc = sf("show", cwd=tmp_path)
    assert proc.returncode == 2 and ".swarmfactory/evidence.db" in proc.stderr, proc.stderr
    cases = sf("cases", "rmsnorm", "--json", cwd=tmp_path)  # no store yet: the seed cases
    assert cases.returncode == 0 and '"origin": "seed"' in cases.stdout, cases.stderr
    assert _tree(tmp_path) == []
    named = sf("cases", "rmsnorm", "--store", "typo.db", cwd=tmp_path)  # a named store must exist
    assert named.returncode == 2 and "typo.db" in named.stderr and _tree(tmp_path) == []


def test_reading_an_existing_store_works_and_writes_nothing_new(tmp_path):
    db = tmp_path / "e.db"
    run_id = recorded_run(db)
    before = db.read_bytes()
    proc = sf("show", run_id, "--store", db, cwd=tmp_path)
    assert proc.returncode == 0 and run_id in proc.stdout, proc.stderr
    assert db.read_bytes() == before


def test_store_errors_are_one_line_exit_2(tmp_path):
    (tmp_path / "notes.txt").write_text("not a database\n")
    sqlite3.connect(tmp_path / "other.db").execute("CREATE TABLE t (x)").connection.commit()
    cases = {
        "foo://bar": "unknown store URL scheme",
        str(tmp_path): "is a folder",
        str(tmp_path / "notes.txt"): "not a database",
        str(tmp_path / "notes.txt" / "e.db"): "notes.txt",
        str(tmp_path / "other.db"): "not a swarmfactory evidence store",
    }
    for store, expected in cases.items():
        for args in (["show"], ["run", "--budget", "1", "--problems", "rmsnorm"]):
            proc = sf(*args, "--store", store, cwd=tmp_path)
            assert proc.returncode == 2, (args, store, proc.stderr)
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error:"), (args, store, proc.stderr)
            assert expected in lines[0], (args, store, lines[0])
    assert (tmp_path / "notes.txt").read_text() == "not a database\n"
    tables = sqlite3.connect(tmp_path / "other.db").execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("t",)]  # another program's database is left as it was


def test_run_does_not_create_missing_folders(tmp_path):
    proc = sf("run", "--budget", "1", "--problems", "rmsnorm", "--store", "new/e.db", cwd=tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "folder" in proc.stderr
    assert _tree(tmp_path) == []


def test_run_that_cannot_start_leaves_no_empty_store(tmp_path):
    proc = sf("run", "--budget", "1", "--agents", "nope", "--store", "e.db", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown agent" in proc.stderr, proc.stderr
    assert _tree(tmp_path) == []
