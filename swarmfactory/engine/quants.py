"""GGUF weight types: exact dequantisation and quantisation of every type llama.cpp's usual files hold.

``dequantize`` is vectorised torch and gives, bit for bit, the float32 values of
``gguf.quants.dequantize``: each element is computed with the same float32 operations in the same
order (``d*q``, ``d*q + m``, ``(d*sc)*q - dmin*m``), none fused. ``quantize`` returns the stored
form; for the types gguf-py can quantise it returns gguf's own bytes, and for Q4_K, Q5_K and Q6_K
(which gguf-py cannot write) it ports llama.cpp's reference quantisers (``quantize_row_q{4,5,6}_K_ref``
with ``make_qkx2_quants``/``make_qx_quants``, no importance matrix) to vectorised numpy, float32
operation for operation, so its bytes are the reference's wherever that is built without fused
multiply-adds.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES

_ORDER = (QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q5_K, QT.Q6_K)
SUPPORTED: frozenset[QT] = frozenset(_ORDER)  # what llama.cpp's usual files (Q4_K_M ... Q8_0, F16, BF16) hold
_GGUF_QUANTISED = frozenset({QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1})
_CHUNK_ELEMS = 1 << 18  # elements dequantised per step: the temporaries stay in cache


class UnsupportedTensorType(ValueError):
    """A tensor whose GGUF type this engine cannot read."""


def require_supported(qtype: QT | int, name: str = "tensor") -> QT:
    """``qtype`` as a member of ``SUPPORTED``, or ``UnsupportedTensorType`` naming the tensor."""
    try:
        qt = QT(qtype)
    except ValueError:
        qt = None
    if qt not in SUPPORTED:
        label = qt.name if qt is not None else f"#{int(qtype)}"
        raise UnsupportedTensorType(
            f"{name}: GGUF tensor type {label} is not supported "
            f"(supported: {', '.join(t.name for t in _ORDER)}); re-quantise the file to one of these types")
    return qt


def block_geometry(qtype: QT | int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a supported type."""
    return GGML_QUANT_SIZES[require_supported(qtype)]


def row_bytes(qtype: QT | int, cols: int) -> int:
    """Bytes one stored row of ``cols`` elements takes."""
    elems, nbytes = block_geometry(qtype)
    if cols % elems:
        raise ValueError(f"{QT(qtype).name} rows must hold a multiple of {elems} elements, not {cols}")
    return cols // elems * nbytes


# ---------------------------------------------------------------- dequantisation (torch)

_SH4 = torch.tensor([0, 4], dtype=torch.uint8)
_SH8 = torch.arange(8, dtype=torch.uint8)
_SH2 = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 field at byte ``at`` of each block, as float32 [n, 1]."""
    return b[:, at:at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """Per run of ``group`` bytes: the low nibbles, then the high nibbles. uint8 [n, 2*bytes]."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, group) >> _SH4.view(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def _high_bits(qh: torch.Tensor) -> torch.Tensor:
    """Bit j of the little-endian bit string ``qh`` at position j: uint8 [n, 8*bytes]."""
    return ((qh.unsqueeze(-1) >> _SH8) & 1).reshape(qh.shape[0], -1)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit (scale, min) pairs packed in a Q4_K/Q5_K block's 12 scale bytes."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


# Each writes its blocks' values into ``out`` (float32 [n, elements per block]) with the operations
# gguf's numpy code performs, in its order; in place, so no fresh tensor is allocated per chunk.

def _dq_q8_0(b, out):
    out.copy_(b[:, 2:].contiguous().view(torch.int8)).mul_(_f16(b, 0))


def _dq_q4_0(b, out):
    out.copy_(_nibbles(b[:, 2:18], 16)).sub_(8).mul_(_f16(b, 0))


def _dq_q4_1(b, out):
    out.copy_(_nibbles(b[:, 4:20], 16)).mul_(_f16(b, 0)).add_(_f16(b, 2))


def _dq_q5_0(b, out):
    out.copy_(_nibbles(b[:, 6:22], 16) | (_high_bits(b[:, 2:6]) << 4)).sub_(16).mul_(_f16(b, 0))


def _dq_q5_1(b, out):
    out.copy_(_nibbles(b[:, 8:24], 16) | (_high_bits(b[:, 4:8]) << 4)).mul_(_f16(b, 0)).add_(_f16(b, 2))


def _k_affine(b, q, out):
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * sc.float()).unsqueeze(-1)
    m = (_f16(b, 2) * mn.float()).unsqueeze(-1)
    out.view(n, 8, 32).copy_(q.view(n, 8, 32)).mul_(d).sub_(m)


def _dq_q4_k(b, out):
    _k_affine(b, _nibbles(b[:, 16:144], 32), out)


def _dq_q5_k(b, out):
    n = b.shape[0]
    high = (b[:, 16:48].reshape(n, 1, 32) >> _SH8.view(1, 8, 1)) & 1
    _k_affine(b, _nibbles(b[:, 48:176], 32) | (high.reshape(n, 256) << 4), out)


def _dq_q6_k(b, out):
    n = b.shape[0]
    low = _nibbles(b[:, 0:128], 64)
    high = ((b[:, 128:192].reshape(n, 2, 1, 32) >> _SH2.view(1, 1, 4, 1)) & 3).reshape(n, 256)
    d = _f16(b, 208) * b[:, 192:208].contiguous().view(torch.int8).float()
    out.view(n, 16, 16).copy_((low | (high << 4)).view(n, 16, 16)).sub_(32).mul_(d.unsqueeze(-1))


def _dq_float(dtype):
    def fn(b, out):
        out.copy_(b.view(dtype))
    return fn


_DEQUANT = {
    QT.F32: _dq_float(torch.float32), QT.F16: _dq_float(torch.float16), QT.BF16: _dq_float(torch.bfloat16),
    QT.Q8_0: _dq_q8_0, QT.Q4_0: _dq_q4_0, QT.Q4_1: _dq_q4_1, QT.Q5_0: _dq_q5_0, QT.Q5_1: _dq_q5_1,
    QT.Q4_K: _dq_q4_k, QT.Q5_K: _dq_q5_k, QT.Q6_K: _dq_q6_k,
}


def dequantize(qtype: QT | int, raw: np.ndarray, rows: int, cols: int, *, name: str = "tensor") -> torch.Tensor:
    """float32 [rows, cols] from the stored form gguf's reader yields (``np.asarray(t.data)``:
    uint8 blocks [rows, row_bytes], float32/float16 [rows, cols], BF16 as uint8 [rows, 2*cols]),
    equal bit for bit to ``gguf.quants.dequantize``. ``raw`` is only read."""
    qt = require_supported(qtype, name)
    elems, nbytes = GGML_QUANT_SIZES[qt]
    rb = row_bytes(qt, cols)
    a = np.asarray(raw)
    if a.nbytes != rows * rb:
        raise ValueError(f"{name}: {a.nbytes} stored bytes, expected {rows} rows x {rb} bytes of {qt.name}")
    a = a.reshape(rows, rb // a.itemsize)
    fn = _DEQUANT[qt]
    out = torch.empty(rows, cols, dtype=torch.float32)
    step = max(1, _CHUNK_ELEMS // cols)
    for r0 in range(0, rows, step):
        chunk = np.array(a[r0:r0 + step]).view(np.uint8)  # own copy: torch must not alias a read-only map
        n = chunk.shape[0]
        b = torch.from_numpy(chunk).view(n * (cols // elems), nbytes)
        fn(b, out[r0:r0 + n].view(n * (cols // elems), elems))
    return out


# ---------------------------------------------------------------- quantisation (numpy)

def _nearest(x: np.ndarray) -> np.ndarray:
    # llama.cpp's nearest_int rounds half to even, as rint does
    return np.rint(x).astype(np.int32)


def _sum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis, left to right like the reference's loops (numpy's pairwise sum
    rounds differently and would flip near-tied choices)."""
    acc = a[..., 0].copy()
    for k in range(1, a.shape[-1]):
        acc += a[..., k]
    return acc


def _fp16_round(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x stored as fp16 bytes [n, 2], its float32 value [n])."""
    h = x.astype(np.float16)
    return h.view(np.uint8).reshape(-1, 2), h.astype(np.float32)


def _qkx2(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Vectorised ``make_qkx2_quants`` (weighted squared error) over sub-blocks x [n, k]:
    (scale [n], min [n] with w ~ scale*L - min, L [n, k])."""
    lo = np.minimum(x.min(axis=1), 0)
    hi = x.max(axis=1)
    flat = hi == lo
    sum_w = _sum(w)
    sum_x = _sum(w * x)
    iscale = nmax / np.where(flat, 1, hi - lo)
    scale = 1 / iscale
    L = np.clip(_nearest(iscale[:, None] * (x - lo[:, None])), 0, nmax).astype(np.float32)
    best = _sum(w * (scale[:, None] * L + lo[:, None] - x) ** 2)
    mn = lo
    f32 = np.float32
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for step in range(nstep + 1):
            # the reference searches from the best (scale, min) so far: each step's grid uses it
            span = hi - mn
            iscale = (f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)) / np.where(span > 0, span, 1)
            la = np.clip(_nearest(iscale[:, None] * (x - mn[:, None])), 0, nmax).astype(np.float32)
            sum_l = _sum(w * la)
            sum_l2 = _sum(w * la * la)
            sum_xl = _sum(w * la * x)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            pos = this_min > 0
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            this_min = np.where(pos, 0, this_min)
            err = _sum(w * (this_scale[:, None] * la + this_min[:, None] - x) ** 2)
            better = (det > 0) & (err < best) & ~flat & (span > 0)
            L = np.where(better[:, None], la, L)
            best = np.where(better, err, best)
            scale = np.where(better, this_scale, scale)
            mn = np.where(better, this_min, mn)
    scale = np.where(flat, 0, scale)
    L = np.where(flat[:, None], 0, L)
    return scale.astype(np.float32), (-mn).astype(np.float32), L


def _qx(x: np.ndarray, nmax: int):
    """Vectorised ``make_qx_quants`` with rmse_type 1 (weights x^2) over sub-blocks x [n, k]:
    (scale [n], L [n, k] in 0..2*nmax-1, w ~ scale*(L - nmax))."""
    n = x.shape[0]
    amax_i = np.abs(x).argmax(axis=1)
    mx = x[np.arange(n), amax_i]
    zero = np.abs(mx) < 1e-15
    mx = np.where(zero, 1, mx)
    w = x * x

    def fit(iscale):
        l = np.clip(_nearest(iscale[:, None] * x), -nmax, nmax - 1).astype(np.float32)
        return l, _sum(w * x * l), _sum(w * l * l)

    L, sumlx, suml2 = fit(-nmax / mx)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 > 0, sumlx / suml2, 0)
        best = scale * sumlx
        for step in (*range(-9, 0), *range(1, 10)):
            la, slx, sl2 = fit(-(nmax + np.float32(0.1) * step) / mx)
            better = (sl2 > 0) & (slx * slx > best * sl2)
            L = np.where(better[:, None], la, L)
            scale = np.where(better, slx / sl2, scale)
            best = np.where(better, scale * slx, best)
    scale = np.where(zero, 0, scale)
    L = np.where(zero[:, None], 0, L + nmax)
    return scale.astype(np.float32), L.astype(np.int32)


def _pack_k_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins [n, 8] -> the 12 scale bytes of a Q4_K/Q5_K block."""
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    return np.concatenate([
        ls[:, :4] | ((ls[:, 4:] >> 4) << 6),
        lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
        (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4),
    ], axis=1)


def _quant_k_affine(x: np.ndarray, nmax: int, rmin: float, nstep: int):
    """Shared Q4_K/Q5_K encoding of super-blocks x [n, 256]: (d, dmin, scale bytes, L [n, 256])."""
    n = x.shape[0]
    sub = x.reshape(n * 8, 32)
    av = np.sqrt(_sum(sub * sub)[:, None] / 32)
    scales, mins, L = _qkx2(sub, av + np.abs(sub), nmax, rmin, 0.1, nstep)
    scales, mins, L = scales.reshape(n, 8), mins.reshape(n, 8), L.reshape(n, 8, 32)
    max_scale = np.maximum(scales.max(axis=1), 0)
    max_min = np.maximum(mins.max(axis=1), 0)
    with np.errstate(divide="ignore"):
        inv_s = np.where(max_scale > 0, 63 / max_scale, 0).astype(np.float32)
        inv_m = np.where(max_min > 0, 63 / max_min, 0).astype(np.float32)
    ls = np.clip(_nearest(inv_s[:, None] * scales), 0, 63)
    lm = np.clip(_nearest(inv_m[:, None] * mins), 0, 63)
    d_bytes, d = _fp16_round(max_scale / 63)
    m_bytes, dmin = _fp16_round(max_min / 63)
    # requantise against the scales as stored, as the reference does
    dd = (d[:, None] * ls.astype(np.float32))[:, :, None]
    dm = (dmin[:, None] * lm.astype(np.float32))[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        req = np.clip(_nearest((x.reshape(n, 8, 32) + dm) / dd), 0, nmax)
    L = np.where(dd != 0, req, L).reshape(n, 256).astype(np.uint8)
    return d_bytes, m_bytes, _pack_k_scales(ls, lm), L


def _low_nibbles_k(L: np.ndarray) -> np.ndarray:
    """qs of Q4_K/Q5_K: per 64 elements, byte l = L[l] & 15 | (L[l+32] & 15) << 4."""
    q = (L & 0x0F).reshape(L.shape[0], 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(L.shape[0], 128)


def _q_q4_k(x):
    d, dmin, sc, L = _quant_k_affine(x, 15, -1.0, 20)
    return np.concatenate([d, dmin, sc, _low_nibbles_k(L)], axis=1)


def _q_q5_k(x):
    d, dmin, sc, L = _quant_k_affine(x, 31, -0.5, 15)
    bits = (L >> 4).reshape(L.shape[0], 8, 32) << np.arange(8, dtype=np.uint8)[None, :, None]
    qh = np.bitwise_or.reduce(bits, axis=1)
    return np.concatenate([d, dmin, sc, qh, _low_nibbles_k(L)], axis=1)


def _q_q6_k(x):
    n = x.shape[0]
    scales, L = _qx(x.reshape(n * 16, 16), 32)
    scales, L = scales.reshape(n, 16), L.reshape(n, 16, 16)
    top = np.abs(scales).argmax(axis=1)
    max_scale = scales[np.arange(n), top]
    empty = np.abs(max_scale) < 1e-15
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(empty, 0, -128 / np.where(empty, 1, max_scale)).astype(np.float32)
        d_bytes, d = _fp16_round(np.where(empty, 0, 1 / iscale))
    sc = np.minimum(127, _nearest(iscale[:, None] * scales)).astype(np.int8)
    dd = (d[:, None] * sc.astype(np.float32))[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        req = np.clip(_nearest(x.reshape(n, 16, 16) / dd), -32, 31) + 32
    L = np.where(dd != 0, req, L).reshape(n, 2, 4, 32).astype(np.uint8)
    # per 128 elements (quarters a, b, c, d of 32): ql = [a | c << 4, b | d << 4], qh = a | b << 2 | ...
    ql = np.concatenate([(L[:, :, 0] & 0x0F) | ((L[:, :, 2] & 0x0F) << 4),
                         (L[:, :, 1] & 0x0F) | ((L[:, :, 3] & 0x0F) << 4)], axis=2).reshape(n, 128)
    qh = (L >> 4) << np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    qh = np.bitwise_or.reduce(qh, axis=2).reshape(n, 64)
    block = np.concatenate([ql, qh, sc.view(np.uint8), d_bytes], axis=1)
    block[empty] = 0  # the reference zeroes a block whose scales are all (near) zero
    return block


_K_QUANT = {QT.Q4_K: _q_q4_k, QT.Q5_K: _q_q5_k, QT.Q6_K: _q_q6_k}
_K_CHUNK_BLOCKS = 2048  # super-blocks encoded per step: bounds the [n, 8, 32] temporaries


def quantize(w: np.ndarray | torch.Tensor, qtype: QT | int, *, name: str = "tensor") -> np.ndarray:
    """float32 [rows, cols] -> the stored form: uint8 [rows, row_bytes] for block types and BF16,
    float16 for F16, float32 for F32. Legacy block types and BF16 give gguf-py's exact bytes; K-quants
    follow llama.cpp's reference quantisers (no importance matrix)."""
    qt = require_supported(qtype, name)
    if isinstance(w, torch.Tensor):
        w = w.detach().cpu().numpy()
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"{name}: expected a [rows, cols] matrix, got shape {w.shape}")
    rows, cols = w.shape
    rb = row_bytes(qt, cols)
    if qt in _GGUF_QUANTISED:
        return gguf_quants.quantize(w, qt)
    flat = w.reshape(-1, 256)
    out = np.empty((flat.shape[0], GGML_QUANT_SIZES[qt][1]), dtype=np.uint8)
    for b0 in range(0, flat.shape[0], _K_CHUNK_BLOCKS):
        out[b0:b0 + _K_CHUNK_BLOCKS] = _K_QUANT[qt](flat[b0:b0 + _K_CHUNK_BLOCKS])
    return out.reshape(rows, rb)
