"""A model file's identity: its content digest, cached on disk per file version, and its served id."""

from __future__ import annotations

import hashlib
import json
import os

from swarmfactory.engine import model_file


def _digests(tmp_path) -> dict:
    return json.loads((tmp_path / "model-digests.json").read_text())["files"]


def test_the_digest_is_the_contents_sha256_hashed_once_per_file_version(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path))
    monkeypatch.setattr(model_file, "_memo", {})
    monkeypatch.setattr(model_file, "CHUNK", 1000)  # several chunks
    f = tmp_path / "m.gguf"
    data = os.urandom(4567)
    f.write_bytes(data)
    assert model_file.sha256(f) == hashlib.sha256(data).hexdigest()
    entry = _digests(tmp_path)[str(f.resolve())]
    assert entry == {"bytes": 4567, "mtime_ns": f.stat().st_mtime_ns, "sha256": hashlib.sha256(data).hexdigest()}

    hashed = []
    monkeypatch.setattr(model_file, "_memo", {})  # a new process: the file on disk answers
    real = model_file._hash
    monkeypatch.setattr(model_file, "_hash", lambda p: hashed.append(p) or real(p))
    assert model_file.sha256(f) == entry["sha256"] and hashed == []

    copy = tmp_path / "copy.gguf"  # another path, the same content: the same digest
    copy.write_bytes(data)
    assert model_file.sha256(copy) == entry["sha256"] and hashed == [copy.resolve()]

    f.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # rewritten: hashed again
    os.utime(f, ns=(entry["mtime_ns"] + 1, entry["mtime_ns"] + 1))
    assert model_file.sha256(f) != entry["sha256"] and len(hashed) == 2


def test_an_unreadable_digest_cache_is_rebuilt_and_a_read_only_one_only_costs_a_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_file, "_memo", {})
    f = tmp_path / "m.gguf"
    f.write_bytes(b"gguf")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "model-digests.json").write_text("{not json")
    assert model_file.sha256(f) == hashlib.sha256(b"gguf").hexdigest()
    assert str(f.resolve()) in _digests(tmp_path / "cache")

    monkeypatch.setenv("SWARMFACTORY_CACHE", str(f / "not-a-dir"))  # cannot be written
    monkeypatch.setattr(model_file, "_memo", {})
    assert model_file.sha256(f) == hashlib.sha256(b"gguf").hexdigest()


def test_the_digest_cache_keeps_the_most_recent_files(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path))
    monkeypatch.setattr(model_file, "KEEP", 3)
    for i in range(5):
        (tmp_path / f"{i}.gguf").write_bytes(bytes([i]))
        model_file.sha256(tmp_path / f"{i}.gguf")
    assert [os.path.basename(p) for p in _digests(tmp_path)] == ["2.gguf", "3.gguf", "4.gguf"]


def test_a_model_is_served_under_its_file_name():
    assert model_file.model_id("/models/gemma-3-270m-q4_k_m.gguf") == "gemma-3-270m-q4_k_m"
