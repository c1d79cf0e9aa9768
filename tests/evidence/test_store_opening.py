"""Opening a store: create=False never creates anything; a new store's folder is never created
for a path the user gave; every failure is a one-line StoreError."""

import sqlite3

import pytest

from swarmfactory.evidence.store import Store, StoreError


def test_opening_for_reading_never_creates_a_file(tmp_path):
    for path in (tmp_path / "e.db", tmp_path / "sub" / "e.db"):
        with pytest.raises(StoreError, match="no evidence store at"):
            Store(str(path), create=False)
    assert list(tmp_path.iterdir()) == []


def test_a_new_store_is_created_in_an_existing_folder_only(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        Store(str(tmp_path / "sub" / "e.db"))
    assert list(tmp_path.iterdir()) == []
    store = Store(str(tmp_path / "e.db"))
    assert store.created and not Store(str(tmp_path / "e.db")).created
    assert Store(str(tmp_path / "e.db"), create=False).run() is None


def test_the_default_store_folder_is_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SWARMFACTORY_STORE", raising=False)
    with pytest.raises(StoreError):
        Store(create=False)
    assert list(tmp_path.iterdir()) == []
    assert Store().created and (tmp_path / ".swarmfactory" / "evidence.db").is_file()


def test_a_file_that_is_not_a_store_is_refused_and_left_alone(tmp_path):
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    for create in (False, True):
        with pytest.raises(StoreError, match="not a swarmfactory evidence store"):
            Store(str(other), create=create)
        with pytest.raises(StoreError) as info:
            Store(str(text), create=create)
        assert "\n" not in str(info.value)
    assert sqlite3.connect(other).execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]
    assert text.read_text() == "hello\n"


@pytest.mark.parametrize("target,message", [("foo://bar", "unknown store URL scheme"),
                                            ("mysql://u@h/db", "unknown store URL scheme")])
def test_unknown_urls_are_one_line_errors(target, message):
    with pytest.raises(StoreError, match=message) as info:
        Store(target)
    assert "\n" not in str(info.value)


def test_a_run_that_cannot_start_can_discard_the_store_it_created(tmp_path):
    store = Store(str(tmp_path / "e.db"))
    store.discard_if_created()
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept.db"
    Store(str(kept)).close()
    Store(str(kept)).discard_if_created()  # not created by this call: left alone
    assert kept.is_file()
