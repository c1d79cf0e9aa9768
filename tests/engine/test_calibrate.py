"""Per-machine thresholds: measured, cached per machine and model, redone on demand."""

import json
import subprocess
import sys
import time

import pytest
import torch

from engine_support import THREADS
from swarmfactory.engine import calibrate as cal
from swarmfactory.engine import EngineConfig
from swarmfactory.engine.config import OPS
from swarmfactory.engine.gguf_loader import load_gguf
from swarmfactory.engine.models.llama import Llama
from swarmfactory.engine.native import load_checked


def test_best_pair_alternates_and_respects_its_deadline():
    calls = []
    a, b = (lambda: calls.append("a")), (lambda: calls.append("b"))
    ta, tb = cal._best_pair(a, b, time.perf_counter() + 60, reps=4, min_s=0)
    assert ta >= 0 and tb >= 0
    assert calls[:2] == ["a", "b"] and calls[2:] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    with pytest.raises(cal.OutOfTime):
        cal._best_pair(a, b, time.perf_counter() - 1)


def test_last_winning_point():
    assert cal._last_winning([1, 8, 16, 32], [True, True, False, True]) == 8
    assert cal._last_winning([1, 8], [False, True]) is None
    assert cal._last_winning([1, 8], [True, True]) == 8


def test_a_short_calibration_measures_stores_and_is_found_again(model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path))
    gg = load_gguf(model_path)
    cfg = EngineConfig(max_batch=1, max_seq_len=64, threads=THREADS)
    model = Llama(gg, cfg, {op: 0 for op in OPS})
    lib = load_checked()[0]
    key = cal.cache_key(model_path, THREADS, lib.sf_isa().decode())
    assert cal.load_cached(key) is None
    c = cal.calibrate(gg, model, lib, THREADS, key, budget_s=4.0)
    assert set(c.dense_above) <= set(OPS) and all(v >= 0 for v in c.dense_above.values())
    assert c.native_decode >= 1 and c.native_prefill >= 0
    assert c.timings and len(c.loadavg) == 2
    measured = {k.split("@")[0] for k in c.timings}
    for op in OPS:  # every op is either measured or named as left at its default
        assert op in measured or f"dense_above.{op}" in c.incomplete
    path = cal.save(c)
    assert path.parent == tmp_path / "calibration"
    again = cal.load_cached(key)
    assert again.cached and again.dense_above == c.dense_above and again.native_decode == c.native_decode
    assert cal.load_cached({**key, "threads": THREADS + 1}) is None  # another key, another machine state
    cal.forget(key)
    assert cal.load_cached(key) is None


def test_thresholds_apply_and_losing_dense_copies_are_dropped(model_path):
    gg = load_gguf(model_path)
    model = Llama(gg, EngineConfig(max_batch=1, max_seq_len=64, threads=THREADS), {op: 0 for op in OPS})
    cal.apply_dense_above(model, {"o": 7}, drop=False)
    assert model.layers[0].o.dense_above == 7 and model.layers[0].qkv.dense is not None
    x = torch.randn(3, 576).bfloat16()
    assert torch.equal(model.layers[0].qkv(x), model.layers[0].qkv.kernel(x))  # never above 2**62 rows
    cal.apply_dense_above(model, {"o": 7})
    assert model.layers[0].qkv.dense is None and model.lm_head.dense is None and model.layers[3].o.dense is not None


def test_engine_calibrate_command_replaces_the_cached_thresholds(tmp_path):
    env_cache = str(tmp_path)
    r = subprocess.run([sys.executable, "-m", "swarmfactory.engine_cli", "calibrate", "--threads", str(THREADS),
                        "--budget-s", "3", "--json"], capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "SWARMFACTORY_CACHE": env_cache})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["key"]["threads"] == THREADS and out["native_decode"] >= 1
    stored = list((tmp_path / "calibration").glob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["timings"] == out["timings"]


def test_thresholds_follow_the_model_files_content_and_old_records_are_adopted(tmp_path, monkeypatch):
    """No measurement: a record is keyed by the file's sha256, so a renamed copy finds it and
    another file does not; one stored under the old key shape (name, size, mtime) is found for
    that very file and stored again under the new key."""
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "a.gguf"
    model.write_bytes(b"weights")
    key = cal.cache_key(model, THREADS, None)
    assert key["model"] == {"sha256": __import__("hashlib").sha256(b"weights").hexdigest()}
    rec = cal.Calibration({"o": 8}, 4, 16, 1.0, key)
    cal.save(rec)
    copy = tmp_path / "b.gguf"
    copy.write_bytes(b"weights")
    assert cal.load_cached(cal.cache_key(copy, THREADS, None)).dense_above == {"o": 8}
    other = tmp_path / "c.gguf"
    other.write_bytes(b"weight5")
    assert cal.load_cached(cal.cache_key(other, THREADS, None), other) is None

    cal.save(cal.Calibration({"o": 32}, 8, 64, 1.0, cal._legacy_key(cal.cache_key(other, THREADS, None), other)))
    new_key = cal.cache_key(other, THREADS, None)
    assert cal.load_cached(new_key) is None  # only through the file it was recorded for
    adopted = cal.load_cached(new_key, other)
    assert adopted.dense_above == {"o": 32} and adopted.key == new_key
    assert cal.load_cached(new_key).native_prefill == 64  # stored under the new key


def test_a_change_to_the_native_code_invalidates_the_thresholds(tmp_path, monkeypatch):
    """The thresholds say where the native kernels beat torch: measured with other C, they are
    measured again, not reused."""
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "a.gguf"
    model.write_bytes(b"weights")
    key = cal.cache_key(model, THREADS, "blocks-avx2")
    assert key["native_code"] == cal.native_code() and len(key["native_code"]) == 16
    cal.save(cal.Calibration({"o": 8}, 4, 16, 1.0, key))
    assert cal.load_cached(cal.cache_key(model, THREADS, "blocks-avx2"), model).native_prefill == 16
    from swarmfactory.engine.native import qlinear

    real = qlinear.source
    monkeypatch.setattr(qlinear, "source", lambda: real() + "\n/* a faster kernel */\n")
    assert cal.load_cached(cal.cache_key(model, THREADS, "blocks-avx2"), model) is None
