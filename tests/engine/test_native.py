"""The native decoder (engine/native): numerics of every ISA path, bounds, batch invariance."""

import math
import platform

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from engine_support import THREADS, get_engine
from swarmfactory.engine import Engine, EngineConfig
from swarmfactory.engine.config import ConfigError
from swarmfactory.engine.gguf_loader import QuantTensor
from swarmfactory.engine.kernels import Weight
from swarmfactory.engine.native import NativeUnavailable, linear, load_library

from test_quantized_bounds import BOUNDS, ppl


def _cpu_flags() -> set[str]:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _builds():
    """(flags, expected ISA or None) for every path this machine can run."""
    base = ("-O3", "-fopenmp", "-std=gnu11")
    out = [(("-march=native", *base), None)]
    if platform.machine() in ("x86_64", "AMD64"):
        if {"avx2", "fma", "f16c"} <= _cpu_flags():
            out.append((("-march=x86-64-v3", *base), "avx2"))
        out.append((("-march=x86-64", *base), "portable"))
    return out


def _random_tensor(qtype: QT, rows: int, cols: int, seed: int) -> QuantTensor:
    rng = np.random.default_rng(seed)
    nb = cols // 32
    if qtype == QT.Q4_1:
        blocks = np.zeros((rows, nb, 20), np.uint8)
        blocks[..., 0:2] = rng.uniform(0.001, 0.05, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
        blocks[..., 2:4] = rng.uniform(-0.4, 0.0, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
        blocks[..., 4:] = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    else:
        blocks = np.zeros((rows, nb, 34), np.uint8)
        blocks[..., 0:2] = rng.uniform(0.001, 0.01, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
        blocks[..., 2:] = rng.integers(-128, 128, (rows, nb, 32), dtype=np.int8).view(np.uint8)
    return QuantTensor("w", qtype, rows, cols, blocks.reshape(rows, -1))


def _reference(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x quantised to int8 per block of 32 as the decoder does, then an fp64 matmul."""
    xb = x.view(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    q = torch.where(amax > 0, torch.round(xb * (127.0 / amax)), torch.zeros_like(xb)).clamp(-127, 127)
    xq = (q.double() * (amax.double() / 127.0)).view_as(x)
    return xq @ w.double().T


@pytest.mark.parametrize("flags,isa", _builds(), ids=lambda v: v[0] if isinstance(v, tuple) else str(v))
def test_every_isa_path_computes_the_quantised_product(flags, isa):
    lib = load_library(flags)
    if isa is not None:
        assert lib.sf_isa().decode() == isa
    for qtype in (QT.Q4_1, QT.Q8_0):
        t = _random_tensor(qtype, rows=10, cols=96, seed=int(qtype))  # 10 rows: a padded group
        w = Weight([t])
        for B in (1, 3, 17):  # 17: more sequences than one pass holds
            x = torch.randn(B, 96, generator=torch.Generator().manual_seed(B)) * 3
            x[0, :32] = 0  # an all-zero block
            ref = _reference(t.dequantize(), x)
            got = linear(lib, w, x, threads=2).double()
            scale = (t.dequantize().abs().double() @ x.abs().double().T).T + 1e-3
            assert ((got - ref).abs() / scale).max().item() < 1e-5, (qtype.name, B)


@pytest.fixture(scope="module")
def q4_engine():
    return get_engine("q4_1")


def test_default_q4_1_engine_decodes_natively(q4_engine):
    assert q4_engine.native is not None
    assert q4_engine.native.max_batch == min(32, q4_engine.config.max_batch)


def _teacher_forced(native, kv, seqs: dict[int, list[int]], starts: dict[int, int]):
    """Feed each slot's tokens one decode step at a time, slot k joining at step starts[k];
    returns slot -> logits [len, vocab]."""
    out = {k: [] for k in seqs}
    steps = max(starts[k] + len(v) for k, v in seqs.items())
    for t in range(steps):
        live = [k for k in seqs if starts[k] <= t < starts[k] + len(seqs[k])]
        logits = native(torch.tensor([seqs[k][t - starts[k]] for k in live]), torch.tensor(live),
                        torch.tensor([t - starts[k] for k in live]))
        for k, row in zip(live, logits):
            out[k].append(row)
    return {k: torch.stack(v) for k, v in out.items()}


def test_batching_never_changes_a_sequences_logits(q4_engine):
    tok = q4_engine.tokenizer
    seqs = {0: tok.encode("The capital of France is Paris, and the capital of Spain is")[:12],
            1: tok.encode("def fibonacci(n): return n if n < 2 else")[:12],
            2: tok.encode("Write a haiku about the sea and the sky.")[:12]}
    alone = {k: _teacher_forced(q4_engine.native, q4_engine.kv, {k: v}, {k: 0})[k] for k, v in seqs.items()}
    together = _teacher_forced(q4_engine.native, q4_engine.kv, seqs, {0: 0, 1: 3, 2: 5})
    for k in seqs:
        assert torch.equal(alone[k], together[k]), f"slot {k} changed when batched"


def test_native_decode_is_within_the_q4_1_bound(q4_engine, fp32_engine, ppl_ids):
    ref = fp32_engine.score(ppl_ids)
    logits = _teacher_forced(q4_engine.native, q4_engine.kv, {0: ppl_ids}, {0: 0})[0]
    err = (logits - ref).abs()
    max_err, mean_err, rel_ppl = BOUNDS["q4_1"]
    p_ref, p = ppl(ref, ppl_ids), ppl(logits, ppl_ids)
    assert err.max().item() <= max_err, f"max logit error {err.max().item():.3f}"
    assert err.mean().item() <= mean_err, f"mean logit error {err.mean().item():.3f}"
    assert abs(p / p_ref - 1) <= rel_ppl, f"perplexity {p:.3f} vs fp32 {p_ref:.3f}"
    assert (logits.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9
    assert math.isfinite(p)


def test_thread_count_never_changes_the_logits(q4_engine):
    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.native import NativeDecoder

    ids = q4_engine.tokenizer.encode("List three colours: red, green and")[:10]
    other = NativeDecoder(load_gguf(q4_engine.model_path), q4_engine.kv, 2, threads=2)
    a = _teacher_forced(q4_engine.native, q4_engine.kv, {0: ids}, {0: 0})[0]
    b = _teacher_forced(other, q4_engine.kv, {1: ids}, {1: 0})[1]
    assert torch.equal(a, b)


def test_engine_serves_through_the_native_path(q4_engine):
    out = q4_engine.generate(["The capital of France is", "List three colours: red,"], max_tokens=12,
                             ignore_eos=True)
    assert [len(c.token_ids) for c in out] == [12, 12]
    assert "Paris" in out[0].text


def test_config_rules():
    with pytest.raises(ConfigError, match="native_decode needs weights q4_1"):
        EngineConfig.from_dict({"weights": "bf16", "native_decode": 4})
    with pytest.raises(ConfigError, match="cannot be combined with kernels"):
        EngineConfig.from_dict({"native_decode": 4, "kernels": {"o": "int4pack"}})
    assert EngineConfig(kernels={"o": "int4pack"}).resolved_native_decode() == 0
    assert EngineConfig(weights="fp32").resolved_native_decode() == 0
    assert EngineConfig(max_batch=4).resolved_native_decode() == 4


def test_without_a_compiler_the_default_falls_back_and_an_explicit_request_fails(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "cache"))
    opts = {"max_batch": 2, "max_seq_len": 64, "threads": THREADS}
    with pytest.warns(RuntimeWarning, match="decoding with torch instead"):
        eng = Engine(EngineConfig(**opts))
    assert eng.native is None
    assert eng.generate("The capital of France is", max_tokens=4)[0].token_ids
    with pytest.raises(NativeUnavailable, match="not found"):
        Engine(EngineConfig(native_decode=2, **opts))
