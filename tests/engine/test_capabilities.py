"""Capability probes, the masked mode and the fallbacks they drive."""

import logging

import pytest

from engine_support import THREADS, get_engine
from swarmfactory import hardware
from swarmfactory.engine import Engine, EngineConfig, capabilities
from swarmfactory.engine.capabilities import Probe, check
from swarmfactory.engine.native import runnable_paths

HOST = hardware.cpu_features(mask=None)
AVX512_HOST = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= HOST


@pytest.fixture
def fresh_probes():
    capabilities.reset()
    yield
    capabilities.reset()


def test_mask_levels_remove_the_simd_flags_above_them(monkeypatch):
    monkeypatch.setenv(hardware.MASK_ENV, "avx2")
    masked = hardware.cpu_features()
    assert not any(f.startswith(("avx512", "amx")) or f == "avx_vnni" for f in masked)
    assert masked <= HOST
    assert {"fpu", "lm", "cx8", "aes"} & HOST <= masked  # non-SIMD flags stay
    if "avx2" in HOST:
        assert {"avx2", "fma"} <= masked
    monkeypatch.setenv(hardware.MASK_ENV, "portable")
    assert "avx" not in hardware.cpu_features() and "avx2" not in hardware.cpu_features()
    assert [p.name for p in runnable_paths()] == ["portable"]
    monkeypatch.setenv(hardware.MASK_ENV, "avx3")
    with pytest.raises(hardware.MaskError, match="avx2"):
        hardware.cpu_features()


def test_masked_avx2_takes_no_avx512_or_bf16_path(monkeypatch, fresh_probes):
    monkeypatch.setenv(hardware.MASK_ENV, "avx2")
    bf16 = check("bf16_prepack")
    assert not bf16.ok and "masked to avx2" in bf16.reason
    assert all(not p.needs & {"avx512f", "avx_vnni"} for p in runnable_paths())
    assert check("int4pack").ok  # torch's int4 kernel has an AVX2 path


def test_probes_report_what_this_machine_runs(fresh_probes):
    assert check("int4pack").ok
    if hardware.cpu_mask() is None:
        # torch has the prepacked bf16 path exactly where the CPU has AVX-512 BW/VL/DQ or avx_ne_convert
        assert check("bf16_prepack").ok == (AVX512_HOST or "avx_ne_convert" in HOST)


def test_default_engine_reports_its_paths():
    eng = get_engine("q4_1")
    p = eng.paths.as_dict()
    assert p["native"] == runnable_paths()[0].name
    assert p["mask"] == hardware.cpu_mask()
    assert p["q4_kernel"] == "torch int4pack"
    expect_bf16 = check("bf16_prepack").ok
    assert ("oneDNN" in p["dense"]) == expect_bf16 and ("fp32 sgemm" in p["dense"]) != expect_bf16
    if hardware.cpu_mask():  # the masked CI run: nothing above the mask
        assert "avx512" not in p["native"] and "oneDNN" not in p["dense"]
    assert p["native"] in eng.paths.summary()


def test_a_failing_bf16_probe_falls_back_to_sgemm_and_says_so(monkeypatch, fresh_probes, caplog):
    monkeypatch.setitem(capabilities.PROBES, "bf16_prepack", lambda: Probe(False, "simulated: the probe raised"))
    with caplog.at_level(logging.WARNING, logger="swarmfactory.engine"):
        eng = Engine(EngineConfig(weights="bf16", max_batch=1, max_seq_len=64, threads=THREADS))
    assert ("bf16 oneDNN prepacked matmul unavailable (simulated: the probe raised); "
            "using fp32 sgemm on bf16-rounded weights") in caplog.text
    assert eng.paths.dense == "fp32 sgemm on bf16-rounded weights"
    assert eng.model.layers[0].qkv.kernel.upcast and eng.model.layers[0].qkv.kernel.packed is None
    assert "Paris" in eng.generate("The capital of France is", max_tokens=6)[0].text


def test_a_failing_int4_probe_runs_q4_1_in_its_blocks_natively_else_on_dense_weights(monkeypatch, fresh_probes,
                                                                                      caplog):
    from swarmfactory.engine.native import qlinear

    monkeypatch.setitem(capabilities.PROBES, "int4pack", lambda: Probe(False, "simulated"))
    with caplog.at_level(logging.WARNING, logger="swarmfactory.engine"):
        eng = Engine(EngineConfig(weights="q4_1", max_batch=1, max_seq_len=64, threads=THREADS, native_decode=0,
                                  dense_above={}))
    assert "torch int4 kernel unavailable (simulated); using the native block kernels" in caplog.text
    assert eng.model.layers[0].down.kernel.name == "qnative" and eng.paths.q4_kernel.startswith("qnative")
    assert "Paris" in eng.generate("The capital of France is", max_tokens=6)[0].text
    del eng
    # and where no native build passes its probe either (no compiler): dense copies
    monkeypatch.setattr(qlinear, "loaded", lambda: qlinear.Loaded(reason="simulated"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="swarmfactory.engine"):
        eng = Engine(EngineConfig(weights="q4_1", max_batch=1, max_seq_len=64, threads=THREADS, native_decode=0,
                                  dense_above={}))
    assert "torch int4 kernel unavailable (simulated); using dense copies" in caplog.text
    assert eng.model.layers[0].down.kernel.name == "dense"
    assert "Paris" in eng.generate("The capital of France is", max_tokens=6)[0].text


def test_compiler_targets_follow_the_mask(monkeypatch):
    monkeypatch.delenv(hardware.MASK_ENV, raising=False)
    assert hardware.march_flags() == ("-march=native",)
    monkeypatch.setenv(hardware.MASK_ENV, "avx2")
    if hardware.platform.machine().lower() in ("x86_64", "amd64"):
        assert hardware.march_flags() == ("-march=x86-64-v3",)
