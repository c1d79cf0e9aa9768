"""GGUF weight types: our dequantiser against gguf-py's bit for bit, our quantiser's bytes, K-quant
error, and every tensor type of the real Gemma 3 270M file read through ``QuantTensor``."""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES

from swarmfactory.engine import quants
from swarmfactory.engine.gguf_loader import QuantTensor

TYPES = sorted(quants.SUPPORTED, key=lambda t: t.value)
FLOAT_TYPES = [QT.F32, QT.F16, QT.BF16]
BLOCK_TYPES = [t for t in TYPES if t not in FLOAT_TYPES]
K_TYPES = [QT.Q4_K, QT.Q5_K, QT.Q6_K]
# byte offsets of each block's fp16 fields (scales, mins)
FP16_FIELDS = {QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q8_0: [0],
               QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208]}


def _bits(a) -> np.ndarray:
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_bit_equal(ours: torch.Tensor, ref: np.ndarray, shape: tuple[int, int]) -> None:
    assert ours.dtype == torch.float32 and tuple(ours.shape) == shape
    ref = np.asarray(ref).reshape(shape)
    assert ref.dtype == np.float32
    diff = np.nonzero(_bits(ours) != _bits(ref))
    assert diff[0].size == 0, (f"{diff[0].size} elements differ, first at {diff[0][0]},{diff[1][0]}: "
                               f"{ours[diff[0][0], diff[1][0]].item()!r} vs {ref[diff[0][0], diff[1][0]]!r}")


def gaussian(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Gaussian rows at several scales, plus the awkward cases: zeros, a constant, one sign, sparse."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)) * np.geomspace(1e-3, 10, rows)[:, None]
    w[0] = 0
    w[1] = 0.375
    w[2] = np.abs(w[2])
    w[3] = -np.abs(w[3])
    w[4] *= rng.random(cols) < 0.05
    return w.astype(np.float32)


def finite_random_bytes(qtype: QT, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random stored bytes whose fp16/bf16/f32 fields are finite (no inf, no NaN)."""
    raw = np.random.default_rng(seed).integers(0, 256, (rows, quants.row_bytes(qtype, cols)), dtype=np.uint8)
    if qtype == QT.F32:
        u = raw.view(np.uint32)
        u[(u & 0x7F800000) == 0x7F800000] ^= 0x40000000
    elif qtype in (QT.F16, QT.BF16):
        u = raw.view(np.uint16)
        mask = 0x7C00 if qtype == QT.F16 else 0x7F80
        u[(u & mask) == mask] ^= 0x4000
    else:
        blocks = raw.reshape(-1, GGML_QUANT_SIZES[qtype][1])
        for at in FP16_FIELDS[qtype]:
            u = np.ascontiguousarray(blocks[:, at:at + 2]).view(np.uint16)
            u[(u & 0x7C00) == 0x7C00] ^= 0x4000
            blocks[:, at:at + 2] = u.view(np.uint8)
    return raw.view(np.float16) if qtype == QT.F16 else raw.view(np.float32) if qtype == QT.F32 else raw


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_is_bit_exact_on_quantised_weights(qtype):
    w = gaussian(24, 512, seed=qtype.value)
    raw = quants.quantize(w, qtype)
    assert_bit_equal(quants.dequantize(qtype, raw, 24, 512), gguf_quants.dequantize(raw, qtype), (24, 512))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_is_bit_exact_on_random_bytes(qtype):
    raw = finite_random_bytes(qtype, 40, 1024, seed=100 + qtype.value)
    ref = gguf_quants.dequantize(raw, qtype)
    assert np.isfinite(ref).all()
    assert_bit_equal(quants.dequantize(qtype, raw, 40, 1024), ref, (40, 1024))


def test_dequantize_reads_a_read_only_map_in_chunks_without_warning(tmp_path):
    raw = finite_random_bytes(QT.Q8_0, 3000, 256, seed=1)  # several chunks of rows
    path = tmp_path / "blocks.bin"
    raw.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=raw.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = quants.dequantize(QT.Q8_0, mapped, 3000, 256)
    assert_bit_equal(ours, gguf_quants.dequantize(raw, QT.Q8_0), (3000, 256))


def test_dequantize_rejects_a_size_that_does_not_match_the_shape():
    raw = quants.quantize(gaussian(8, 256)[:4], QT.Q4_K)
    with pytest.raises(ValueError, match="expected 5 rows x 144 bytes of Q4_K"):
        quants.dequantize(QT.Q4_K, raw, 5, 256, name="w")


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.BF16, QT.F16, QT.F32],
                         ids=lambda t: t.name)
def test_quantize_gives_gguf_bytes(qtype):
    w = gaussian(20, 256, seed=7)
    ours = quants.quantize(torch.from_numpy(w), qtype)
    ref = gguf_quants.quantize(w, qtype)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert ours.tobytes() == ref.tobytes()
    if qtype in BLOCK_TYPES or qtype == QT.BF16:
        assert ours.dtype == np.uint8 and ours.shape == (20, quants.row_bytes(qtype, 256))


def _hashed_weights(rows: int, cols: int) -> np.ndarray:
    """Near-Gaussian weights from integer hashing and exact float ops: the same on every machine."""
    z = (np.arange(rows * cols * 4, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    u = ((z ^ (z >> np.uint64(31))) >> np.uint64(40)).astype(np.float64) / 2**24
    x = (u.reshape(rows, cols, 4).sum(axis=2) - 2.0) * np.sqrt(3.0)
    return (x * (0.01 * (1 + np.arange(rows) % 4))[:, None]).astype(np.float32)


# sha256 of llama.cpp's quantize_row_q{4,5,6}_K_ref output for _hashed_weights(16, 512), computed
# with the reference C code built without floating-point contraction
LLAMA_CPP_BYTES = {
    QT.Q4_K: "39cc6624e04317b2c200b338ccd93938f4eaccc36417db036b00039eedf2fd87",
    QT.Q5_K: "4fec83d7d0047c99dc9c4695f6e9554d0b52cb7e9c580b2402132aceacfa41f6",
    QT.Q6_K: "4bc14c8a922ae275fa38c0368e912160e50353db3bc2af3e1e5b69b93f14b419",
}


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quantiser_reproduces_llama_cpp_reference_bytes(qtype):
    raw = quants.quantize(_hashed_weights(16, 512), qtype)
    assert raw.dtype == np.uint8 and raw.shape == (16, quants.row_bytes(qtype, 512))
    assert hashlib.sha256(raw.tobytes()).hexdigest() == LLAMA_CPP_BYTES[qtype]


# relative RMSE on unit Gaussian weights: llama.cpp's reference quantisers reach 0.0715 (Q4_K),
# 0.0362 (Q5_K) and 0.0178 (Q6_K); a 6-bit grid over 16-element blocks cannot go much below that
K_RMSE = {QT.Q4_K: (0.060, 0.075), QT.Q5_K: (0.030, 0.038), QT.Q6_K: (0.015, 0.019)}
# the legacy type of the same width that each K-quant must beat
K_VERSUS = {QT.Q4_K: QT.Q4_1, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q5_1}


def _rel_rmse(w: np.ndarray, qtype: QT) -> float:
    back = quants.dequantize(qtype, quants.quantize(w, qtype), *w.shape).numpy()
    return float(np.sqrt(((back - w) ** 2).mean() / (w ** 2).mean()))


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quant_round_trip_error_is_bounded(qtype):
    w = np.random.default_rng(3).standard_normal((64, 1024)).astype(np.float32)
    lo, hi = K_RMSE[qtype]
    err = _rel_rmse(w, qtype)
    assert lo < err < hi
    assert err < _rel_rmse(w, K_VERSUS[qtype])


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quant_round_trip_of_awkward_rows(qtype):
    w = gaussian(8, 512, seed=11)
    w[5] *= 1e-14  # block scales fall below the reference's 1e-15 "all zero" threshold
    raw = quants.quantize(w, qtype)
    back = quants.dequantize(qtype, raw, 8, 512).numpy()
    assert not back[0].any() and not back[5].any()  # zeros stay zeros
    if qtype == QT.Q6_K:
        assert not raw[5].any()  # the reference stores such a block as all-zero bytes
    blocks = np.abs(w).reshape(8, -1, 256).max(axis=2, keepdims=True)
    step = {QT.Q4_K: 15, QT.Q5_K: 31, QT.Q6_K: 32}[qtype]
    # within about one quantisation step of each super-block's range (scales are 6-bit themselves)
    assert (np.abs(back - w).reshape(8, -1, 256) <= 2.5 * blocks / step + 1e-6).all()


def test_unsupported_type_is_named_with_the_tensor_and_the_alternatives():
    with pytest.raises(quants.UnsupportedTensorType) as e:
        quants.dequantize(QT.IQ2_XS, np.zeros((2, 66), np.uint8), 2, 256, name="blk.3.ffn_up.weight")
    msg = str(e.value)
    assert isinstance(e.value, ValueError) and "\n" not in msg
    assert msg.startswith("blk.3.ffn_up.weight: GGUF tensor type IQ2_XS is not supported")
    assert all(t.name in msg for t in quants.SUPPORTED)
    t = QuantTensor("output.weight", QT.Q2_K, 2, 256, np.zeros((2, 84), np.uint8))
    with pytest.raises(quants.UnsupportedTensorType, match="^output.weight: GGUF tensor type Q2_K "):
        t.dequantize()
    with pytest.raises(quants.UnsupportedTensorType, match="type #99 "):
        quants.require_supported(99)
    with pytest.raises(quants.UnsupportedTensorType, match="Q3_K"):
        quants.quantize(np.zeros((1, 256), np.float32), QT.Q3_K)


def test_geometry_helpers():
    assert quants.block_geometry(QT.Q6_K) == (256, 210)
    assert quants.row_bytes(QT.Q4_K, 1024) == 4 * 144
    assert quants.row_bytes(QT.BF16, 640) == 1280
    with pytest.raises(ValueError, match="multiple of 32"):
        quants.row_bytes(QT.Q5_0, 640 + 16)


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=lambda t: t.name)
def test_blocks_refuses_float_types(qtype):
    t = QuantTensor("norm.weight", qtype, 8, 64, quants.quantize(gaussian(8, 64), qtype))
    with pytest.raises(TypeError, match="not block-quantised"):
        t.blocks()


def test_quant_tensor_unpermutes_rows_and_agrees_with_its_q4_1_and_q8_0_views():
    w = gaussian(16, 256, seed=5)
    perm = np.random.default_rng(0).permutation(16)
    for qtype in (QT.Q4_1, QT.Q8_0):
        raw = quants.quantize(w, qtype)
        t = QuantTensor("blk.0.attn_q.weight", qtype, 16, 256, raw, perm)
        dense = t.dequantize()
        assert_bit_equal(dense, gguf_quants.dequantize(raw, qtype)[perm], (16, 256))
        if qtype == QT.Q4_1:
            q, d, m = t.q4_1()
            view = q.view(16, 8, 32).float() * d.view(16, 8, 1) + m.view(16, 8, 1)
        else:
            q, d = t.q8_0()
            view = q.view(16, 8, 32).float() * d.view(16, 8, 1)
        assert torch.equal(view.view(16, 256), dense)
        assert torch.equal(t.blocks(), torch.from_numpy(raw[perm]))


def test_every_tensor_type_of_the_gemma_file_reads_exactly(gemma_path):
    from swarmfactory.engine.gguf_loader import load_gguf

    tensors = load_gguf(gemma_path).tensors
    assert len(tensors) == 236 and {t.qtype for t in tensors.values()} <= quants.SUPPORTED
    seen = set()
    for name, t in tensors.items():
        qtype, rows, cols = t.qtype, t.rows, t.cols
        if qtype in seen or (qtype == QT.Q8_0 and name != "token_embd.weight") or t.row_perm is not None:
            continue
        seen.add(qtype)
        if name == "token_embd.weight":  # 262144 rows: a spread of them keeps this fast
            assert (rows, cols) == (262144, 640)
            t = t.take(np.arange(5, rows, 257))
        want = gguf_quants.dequantize(np.asarray(t.raw), qtype)
        assert_bit_equal(t.dequantize(), want, (t.rows, t.cols))
    assert seen == {QT.Q4_K, QT.Q5_0, QT.Q6_K, QT.Q8_0, QT.F32}
