"""Problems derived from a model (``problems/derive.py``): the ops and shapes of tiny random models
of every architecture, the derived problems by name and in a worker, and the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
import tiny_models as tm  # noqa: E402

from swarmfactory.problems import ProblemError, load_problem, problem_from_source  # noqa: E402
from swarmfactory.problems.derive import DeriveError, Scenario, derive, register  # noqa: E402

SCENARIO = Scenario(prompt=32, output=16, concurrency=(1, 4))


def q8_family() -> str:
    """The Q8_0 problem with the engine's numerics here: on its packed copies where this CPU's build
    packs Q8_0 (vpdpbusd), else on the stored blocks."""
    from swarmfactory.engine.native.qlinear import packs

    return "q8_0_engine_packed_matmul" if packs(QT.Q8_0) else "q8_0_engine_matmul"
_files: dict = {}


@pytest.fixture(autouse=True)
def _registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "cache"))
    from swarmfactory import problems

    problems._CACHE.clear()  # derived names resolve against this test's registry
    yield
    problems._CACHE.clear()


def _model(tmp_path_factory, arch: str, qtype: QT = QT.Q8_0, **overrides) -> Path:
    key = (arch, qtype, tuple(sorted(overrides.items())))
    if key not in _files:
        path = tmp_path_factory.mktemp(arch) / f"tiny-{arch}-{qtype.name}.gguf"
        _files[key] = tm.write_gguf(tm.hf_model(arch, **overrides), arch, path, qtype)
    return _files[key]


def _by_family(d) -> dict:
    return {p.family: p for p in d.problems}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_the_ops_and_shapes_are_the_engines(tmp_path_factory, arch):
    cfg = tm.CONFIGS[arch][1]
    hidden, ffn, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim", hidden // H)
    d = derive(_model(tmp_path_factory, arch), SCENARIO)
    fam = _by_family(d)
    assert d.architecture == arch and d.model == f"tiny-{arch}-q8_0"
    # every linear layer is Q8_0: q|k|v, o, gate|up and down, at the prefill chunk and each concurrency;
    # qlinear.c's kernels run them (decode.c does not compute these tiny models), so the problem
    # is the one with their numerics (8-bit activations), whose champion can replace them
    mm = fam[q8_family()]
    assert "q8_0_matmul" not in fam and len([f for f in fam if f.startswith("q8_0_")]) == 1
    for tokens in (32, 1, 4):
        for n, k in (((H + 2 * KV) * D, hidden), (hidden, H * D), (2 * ffn, hidden), (hidden, ffn)):
            assert {"n": n, "k": k, "batch": tokens} in mm.shapes, (n, k, tokens)
    # the output head runs on the sampled rows only: the prompt's last, every decode row
    assert {"n": tm.VOCAB, "k": hidden, "batch": 1} in mm.shapes and {"n": tm.VOCAB, "k": hidden, "batch": 4} in mm.shapes
    if (H + 2 * KV) * D != tm.VOCAB:  # (Gemma's q|k|v has the head's shape)
        assert {"n": tm.VOCAB, "k": hidden, "batch": 32} not in mm.shapes
    assert "output head" in mm.ops
    # the gate: GELU-tanh for Gemma, SiLU for the others
    act = "geglu" if arch == "gemma3" else "swiglu"
    assert {"n": 4 * ffn} in fam[act].shapes and ("swiglu" if arch == "gemma3" else "geglu") not in fam
    # q/k head norms (Qwen3, Gemma 3) and Gemma's sandwich norms are plain RMSNorms
    norm_ops = set(fam["rmsnorm"].ops)
    assert ("q/k head norm" in norm_ops) == (arch in ("qwen3", "gemma3"))
    assert ("post-FFN norm" in norm_ops) == (arch == "gemma3")
    if arch in ("qwen3", "gemma3"):
        assert {"rows": 4 * (H + KV), "cols": D} in fam["rmsnorm"].shapes
    assert {"rows": 4, "cols": hidden} in fam["add_rmsnorm"].shapes
    assert fam["rope"].shapes[0]["heads"] == H + KV and fam["rope"].shapes[0]["head_dim"] == D
    # decode attention over the average context (32 + 16 / 2), a sliding layer's window at most
    seqs = {s["seq"] for s in fam["attention_decode"].shapes}
    assert seqs == ({40, tm.GEMMA_WINDOW} if arch == "gemma3" else {40})
    assert all(s["heads"] == H and s["kv_heads"] == KV for s in fam["attention_decode"].shapes)
    if arch == "gemma3":  # sliding layers use RoPE base 10000, the global one the file's
        assert fam["rope"].params["theta"] == {10000.0, 1_000_000.0}
    # prefill attention has no family: said, with its share
    assert [u["op"] for u in d.uncovered] == ["prefill attention"]
    total = sum(p.share for p in d.problems) + sum(u["share"] for u in d.uncovered)
    assert total == pytest.approx(1.0)
    # counts: every layer's q|k|v at batch 1 is one call per decode step, 16 steps per request
    assert len(mm.weights) == len(mm.shapes) and all(w > 0 for w in mm.weights)
    del layers


def test_each_block_type_of_a_mixed_file_is_its_own_problem_and_dense_weights_are_uncovered(tmp_path_factory):
    d = derive(_model(tmp_path_factory, "qwen3", QT.Q4_K, hidden_size=256, intermediate_size=512), SCENARIO)
    fam = _by_family(d)
    assert "q4_k_engine_matmul" in fam and "q4_k_matmul" not in fam
    # the fp32-activation family (the engine's per-op seam) loads with its twin's shapes
    register(d)
    fp32 = load_problem(f"q4_k_matmul.{d.model}")
    assert [dict(x) for x in fp32.workload] == fam["q4_k_engine_matmul"].shapes and fp32.entry == "q4_k_matmul"
    f32 = derive(_model(tmp_path_factory, "llama", QT.F32), SCENARIO)
    assert not any(p.family.endswith("_matmul") for p in f32.problems)
    assert any(u["op"] == "q|k|v" and "F32" in u["why"] for u in f32.uncovered)


def test_a_model_decode_c_computes_keeps_the_fp32_activation_families():
    """SmolLM2 in Q4_1 (its output head Q8_0) runs on decode.c's own packed kernels, not qlinear.c's,
    so its matmuls are the fp32-activation families (and q4_1_packed_matvec its hot loop's)."""
    from swarmfactory.engine.gguf_loader import resolve_model_path

    fam = _by_family(derive(resolve_model_path(None), SCENARIO))
    assert {"q4_1_matmul", "q8_0_matmul"} <= set(fam)
    assert not any(f.endswith("_engine_matmul") for f in fam)


def test_a_derived_problem_is_its_family_with_the_models_workload(tmp_path_factory):
    d = derive(_model(tmp_path_factory, "llama"), SCENARIO)
    register(d)
    name = f"{q8_family()}.tiny-llama-q8_0"
    p = load_problem(name)
    fam = load_problem(q8_family())
    assert p.name == name and p.entry == q8_family() and p.c_signature == fam.c_signature
    assert p.spec_hash() != fam.spec_hash()
    assert [dict(s) for s in p.workload] == _by_family(d)[q8_family()].shapes
    # the type's other engine-numerics layout (stored or packed) loads with the same shapes
    other = {"q8_0_engine_matmul": "q8_0_engine_packed_matmul"}.get(q8_family(), "q8_0_engine_matmul")
    twin = load_problem(f"{other}.tiny-llama-q8_0")
    assert twin.entry == other and [dict(s) for s in twin.workload] == [dict(s) for s in p.workload]
    assert len(p.workload_weights) == len(p.workload)
    assert "derived from tiny-llama-q8_0" in p.note
    # a worker rebuilds it from its source line alone, with nothing registered
    again = problem_from_source(p.source_path)
    assert again.spec_hash() == p.spec_hash() and again.name == name
    # the model's eps is inside the family's case range
    norm = load_problem("add_rmsnorm.tiny-llama-q8_0")
    lo, hi = norm.param_ranges["eps"]
    assert lo <= 1e-5 <= hi


def test_unknown_derived_names_and_bad_files_fail_in_one_line(tmp_path):
    with pytest.raises(ProblemError, match="derive them first"):
        load_problem("q8_0_matmul.no-such-model")
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(DeriveError, match="x.gguf"):
        derive(bad)
    with pytest.raises(DeriveError, match="not found"):
        derive(tmp_path / "missing.gguf")
    with pytest.raises(DeriveError, match="mamba"):
        derive(tm.write_unknown_arch(tmp_path / "m.gguf"))


def test_a_derived_problem_judges_a_kernel_like_its_family(tmp_path_factory):
    """The family's own template source, built under the family's function name, is verified on
    the model's shapes."""
    from swarmfactory.harness.evaluate import Harness

    register(derive(_model(tmp_path_factory, "llama"), SCENARIO))
    p = load_problem("rmsnorm.tiny-llama-q8_0")
    h = Harness()
    try:
        prep = h.prepare(p, p.render({}))
        broken = h.prepare(p, p.render({}).replace("1.0f /", "1.001f /", 1))
    finally:
        h.close()
    assert prep.rejected is None and prep.cases_checked >= len(p.workload), prep.rejected
    assert broken.rejected is not None and broken.rejected.outcome == "wrong"


def _sf(*args, cache):
    import os
    import subprocess

    exe = Path(sys.executable).with_name("swarmfactory")
    env = {**os.environ, "SWARMFACTORY_CACHE": str(cache), "COLUMNS": "120"}
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def test_the_command_lists_and_registers(tmp_path_factory, tmp_path):
    import os

    cache = os.environ["SWARMFACTORY_CACHE"]
    path = _model(tmp_path_factory, "gemma3")
    r = _sf("problems", "--from-model", path, "--json", "--concurrency", "1,8", cache=cache)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["architecture"] == "gemma3" and data["scenario"]["concurrency"] == [1, 8]
    names = [p["name"] for p in data["problems"]]
    assert "geglu.tiny-gemma3-q8_0" in names
    assert load_problem("geglu.tiny-gemma3-q8_0").workload  # registered where this process looks
    r = _sf("problems", "--from-model", path, "--name", "My Gemma", cache=cache)
    assert r.returncode == 0, r.stderr
    assert "geglu.my-gemma" in r.stdout and "prefill attention" in r.stdout
    assert "swarmfactory run --problems " in r.stdout
    r = _sf("problems", "--from-model", path, "--concurrency", "0", cache=cache)
    assert r.returncode == 2 and "--concurrency" in r.stderr and "Traceback" not in r.stderr
    r = _sf("problems", "--from-model", tmp_path / "none.gguf", cache=cache)
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr
