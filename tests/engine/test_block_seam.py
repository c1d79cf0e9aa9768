"""Every block type's matmul crosses the seam: a kernel of ``q4_k_matmul`` (or of a problem derived
from a model, through the corridor) runs the parts of a weight stored in its type, the engine's own
kernel the others; a broken champion of a derived op is caught and reported against that op."""

from __future__ import annotations

import shutil

import pytest
import torch
from gguf import GGMLQuantizationType as QT

import tiny_models as tm
from engine_support import THREADS

from swarmfactory.champions import Corridor
from swarmfactory.engine.kernels import KernelError, Weight

OVERRIDES = dict(hidden_size=256, intermediate_size=512)  # rows of 256: K-quant super-blocks fit
SCENARIO_PROMPTS = ["The quick brown fox", "Once upon a time there", "1 2 3 4 5", "Paris is the capital"]


@pytest.fixture(scope="module")
def family():
    from swarmfactory.problems import load_problem

    return load_problem("q4_k_matmul")


def _build(source: str, symbol: str, proto: str, dest):
    from swarmfactory.backends.c import CBackend

    art = CBackend().build(source, symbol, prototype=proto)
    shutil.copyfile(art.path, dest)
    return dest


def _broken_at_4(good: str, symbol: str) -> str:
    """Right, except that calls of four rows come out 5% too large (the load check runs 1 and 5)."""
    return good.replace(f"void {symbol}(", f"static void right_{symbol}(") + (
        f"void {symbol}(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {{\n"
        f"    right_{symbol}(wq, x, y, n, k, batch);\n"
        "    if (batch == 4) for (int64_t i = 0; i < n * batch; i++) y[i] *= 1.05f;\n}\n")


def test_a_library_runs_the_parts_of_its_type_and_the_engine_the_others(family, tmp_path):
    from swarmfactory.engine.native.qlinear import random_part
    from swarmfactory.engine.native_seam import kernel_class

    so = _build(family.render(), family.entry, family.c_prototype, tmp_path / "q4k.so")
    w = Weight([random_part(QT.Q4_K, 24, 512, seed=1, name="a"), random_part(QT.Q6_K, 8, 512, seed=2, name="b"),
                random_part(QT.Q4_K, 16, 512, seed=3, name="c")])
    cls = kernel_class(so)
    assert cls.library.qtypes == {QT.Q4_K}
    op = cls(w, torch.float32)
    assert [(r.qtype, r.rows, r.fn is not None) for r in op.runs] == [(QT.Q4_K, 24, True), (QT.Q6_K, 8, False),
                                                                      (QT.Q4_K, 16, True)]
    assert op.library_rows == 40
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    ref = x.double() @ w.dequantize().double().T
    y = op(x).double()
    # the Q4_K rows in fp32 (the library), the Q6_K rows with 8-bit activations (the engine's own)
    assert torch.allclose(y[:, :24], ref[:, :24], rtol=1e-4, atol=1e-4)
    assert torch.allclose(y[:, 32:], ref[:, 32:], rtol=1e-4, atol=1e-4)
    from swarmfactory.engine.native_seam import _default

    assert torch.equal(op(x)[:, 24:32], _default(Weight([w.parts[1]]), torch.float32)(x))
    # a library for another type than any part's: said when the engine checks the op
    from swarmfactory.engine.native_seam import check_used

    only6 = Weight([random_part(QT.Q6_K, 8, 512, seed=4)])
    lin = type("L", (), {"kernel": cls(only6, torch.float32)})()
    with pytest.raises(KernelError, match=r"kernels\.down: .* takes Q4_K blocks, but no down weight has a part "
                                          r"stored so \(they are Q6_K\)"):
        check_used({"down": [lin]}, {"down": cls})


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny Qwen3 in Q4_K and its problems, derived and registered in a cache of its own."""
    root = tmp_path_factory.mktemp("block_seam")
    path = tm.write_gguf(tm.hf_model("qwen3", **OVERRIDES), "qwen3", root / "tiny-qwen3-q4_k.gguf", QT.Q4_K)
    return path, root / "cache"


@pytest.fixture
def derived(model, monkeypatch):
    from swarmfactory import problems
    from swarmfactory.problems.derive import derive, register

    path, cache = model
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(cache))
    problems._CACHE.clear()
    register(derive(path))
    yield problems.load_problem("q4_k_matmul.tiny-qwen3-q4_k")
    problems._CACHE.clear()


def _champion(store, problem, source: str) -> str:
    """``source`` recorded as a candidate of ``problem`` that passed the harness here, made its
    champion: what a kernel-factory run on the derived problem leaves in the store."""
    from swarmfactory.agents.base import candidate_record
    from swarmfactory.outcome import Outcome, Verdict

    cand = candidate_record(problem, source, agent="test", operator="template")
    eid = store.record_verdict(problem, cand, Verdict(Outcome.FASTER, "test", "measure", speedup=1.3), None, "test")
    store.set_champion(problem, cand["id"], eid, 1.3, None, "test champion")
    return cand["id"]


def _engine(path, kernels: dict, supply=None):
    from swarmfactory.engine import Engine, EngineConfig

    cfg = EngineConfig(model=str(path), weights="q4_1", threads=THREADS, max_batch=4, max_seq_len=128,
                       native_decode=0, native_prefill=0, dense_above={}, kernels=kernels)
    return Engine(cfg, supply=supply)


def test_a_derived_champion_runs_in_the_engine_and_a_broken_one_is_caught_and_reported(model, derived, tmp_path):
    from swarmfactory.evidence.store import Store

    path, _ = model
    name = derived.name
    assert derived.entry == "q4_k_matmul"
    db = tmp_path / "evidence.db"
    store = Store(str(db))
    good = _champion(store, derived, derived.render())
    store.close()
    base = _engine(path, {})
    want = [c.token_ids for c in base.generate(SCENARIO_PROMPTS, max_tokens=6, ignore_eos=True)]
    eng = _engine(path, {"down": f"champion:{name}", "gate_up": f"champion:{name}"}, Corridor(str(db)))
    nk = eng.paths.native_kernels
    assert nk["down"]["candidate"] == good and nk["down"]["types"] == ["Q4_K"]
    down = eng.model.layers[0].down.kernel
    assert down.library_rows == down.out_features  # every down weight of this file is Q4_K
    eng.generate(SCENARIO_PROMPTS, max_tokens=6, ignore_eos=True)
    # fp32 activations in the champion, 8-bit in the engine's own: logits within the quantised
    # engine's bound (docs/engine.md) of each other, not equal
    ids = eng.tokenizer.encode(SCENARIO_PROMPTS[1]) + want[1]
    err = (eng.score(ids) - base.score(ids)).abs()
    assert 0 < err.max().item() <= 0.3, err.max().item()
    st = type(down).audit_state
    assert st["calls"] > 0 and st["audited"] > 0 and st["dropped"] is None

    # a champion of the derived op that is wrong only in calls of four rows
    store = Store(str(db))
    bad = _champion(store, derived, _broken_at_4(derived.render(), "q4_k_matmul"))
    store.close()
    eng = _engine(path, {"down": f"champion:{name}"}, Corridor(str(db)))
    eng.generate(SCENARIO_PROMPTS, max_tokens=6, ignore_eos=True)
    st = type(eng.model.layers[0].down.kernel).audit_state
    assert st["dropped"] and f"{name} kernel {bad} gave a wrong output while serving" in st["dropped"]
    assert "batch=4" in st["dropped"]
    # dropped: every later call runs the engine's own kernel, the default engine's very numbers
    assert torch.equal(eng.score(ids), base.score(ids))
    store = Store(str(db), create=False)
    try:
        assert any(c.found_by == "engine-audit" for c in store.found_cases(name))
        champ = store.champion(derived)
        assert champ is None or champ.candidate_id != bad
    finally:
        store.close()


def test_a_kernel_wrong_only_at_a_row_past_the_harness_shapes_is_refused_at_load(tmp_path):
    """The harness verifies a derived output head cut to a few thousand rows; the engine calls it
    with every row. A kernel wrong at one row of a large weight only is caught by the load check,
    which compares every row (4096 at a time)."""
    from swarmfactory.engine.native.qlinear import random_part
    from swarmfactory.engine.native_seam import kernel_class
    from swarmfactory.problems import load_problem

    q8 = load_problem("q8_0_matmul")
    good = q8.render()
    bad = good.replace("void q8_0_matmul(", "static void right_q8_0_matmul(") + (
        "void q8_0_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch) {\n"
        "    right_q8_0_matmul(wq, x, y, n, k, batch);\n"
        "    if (n > 9000) for (int64_t b = 0; b < batch; b++) y[b * n + 8999] += 0.5f;\n}\n")
    so = _build(bad, q8.entry, q8.c_prototype, tmp_path / "row8999.so")
    small = Weight([random_part(QT.Q8_0, 64, 64, seed=5)])
    kernel_class(so)(small, torch.float32)  # right wherever the weight is small
    head = Weight([random_part(QT.Q8_0, 12000, 64, seed=6, name="output.weight")])
    with pytest.raises(KernelError, match=r"output\.weight \[12000 x 64\] \(Q8_0\).*first at output \[0, 8999\]"):
        kernel_class(so)(head, torch.float32)
