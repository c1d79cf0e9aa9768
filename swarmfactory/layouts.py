"""The native decoder's data layout and activation quantisation, in numpy.

One definition shared by the engine (``native.library.pack`` packs every weight with
``pack_records``) and by the kernel factory's ``q4_1_packed_matvec`` problem (its inputs are
packed and quantised here), so the problem's kernels and the engine cannot drift apart. Numpy
only: a problem module imports this without the engine's torch/GGUF machinery.

Layout (see the Mat comment in native/decode.c): rows in groups of ``ROWS`` (the last group
padded with zero rows, d = m = 0), each group one contiguous run of records, one record per
block of 32 columns. Inside a record the 8 rows are interleaved by quads of 4 elements.

- Q4_1 record (``REC_Q4_1`` = 160 bytes): 4 vectors of 32 bytes, byte 4r+i of vector k being
  byte 4k+i of row r's GGUF block (low nibble: element 4k+i, high nibble: element 16+4k+i);
  then 8 fp16 d and 8 fp16 m, one per row.
- Q8_0 record (``REC_Q8_0`` = 272 bytes): 8 vectors of 32 bytes, byte 4r+i of vector k being
  element 4k+i of row r stored as w + 128; then 8 fp16 d.
"""

from __future__ import annotations

import numpy as np

ROWS = 8  # rows per group
QK = 32  # elements per block
REC_Q4_1, REC_Q8_0 = 160, 272
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}  # GGUF block sizes


def pack_records(blocks: np.ndarray, qtype: str) -> np.ndarray:
    """GGUF blocks uint8 [rows, cols / 32, block bytes] of a Q4_1 or Q8_0 matrix in the
    decoder's layout: uint8 [ceil(rows / 8), cols / 32, record bytes]."""
    rows, nb, bb = blocks.shape
    if qtype not in BLOCK_BYTES or bb != BLOCK_BYTES[qtype]:
        raise ValueError(f"pack_records: {bb}-byte blocks are not {qtype}")
    groups = -(-rows // ROWS)
    b = np.asarray(blocks, dtype=np.uint8)
    if groups * ROWS != rows:  # zero rows (d = m = 0) fill the last group
        b = np.concatenate([b, np.zeros((groups * ROWS - rows, nb, bb), np.uint8)])
    b = b.reshape(groups, ROWS, nb, bb).transpose(0, 2, 1, 3)  # [groups, nb, rows, block bytes]

    def interleave(q: np.ndarray) -> np.ndarray:  # [g, nb, rows, 4k] -> [g, nb, k, rows, 4]
        return q.reshape(groups, nb, ROWS, -1, 4).transpose(0, 1, 3, 2, 4).reshape(groups, nb, -1)

    d = b[..., 0:2].reshape(groups, nb, 2 * ROWS)
    if qtype == "q4_1":
        parts = [interleave(b[..., 4:20]), d, b[..., 2:4].reshape(groups, nb, 2 * ROWS)]
    else:
        q = (b[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        parts = [interleave(q), d]
    return np.ascontiguousarray(np.concatenate(parts, -1))


def unpack_q4_1(records: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q int64 [rows, cols] in 0..15, d and m float64 [rows, cols / 32]) from Q4_1 records:
    the layout read back element by element, independently of ``pack_records``."""
    nb, groups = cols // QK, -(-rows // ROWS)
    rec = np.asarray(records, dtype=np.uint8).reshape(groups, nb, REC_Q4_1)
    qs = rec[..., :128].reshape(groups, nb, 4, ROWS, 4)  # [g, j, k, r, i]: byte 4k+i of row r
    lo = (qs & 15).transpose(0, 3, 1, 2, 4).reshape(groups * ROWS, nb, 16)  # element 4k+i
    hi = (qs >> 4).transpose(0, 3, 1, 2, 4).reshape(groups * ROWS, nb, 16)  # element 16+4k+i
    q = np.concatenate([lo, hi], -1).reshape(groups * ROWS, cols)[:rows].astype(np.int64)

    def half(lo_byte: int) -> np.ndarray:  # 8 fp16 per record -> [rows, nb]
        h = rec[..., lo_byte:lo_byte + 16].copy().view("<f2").astype(np.float64)  # [g, j, r]
        return h.transpose(0, 2, 1).reshape(groups * ROWS, nb)[:rows]

    return q, half(128), half(144)


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """decode.c's quantize_row for every row of x fp32 [B, K] (K a multiple of 32), with the
    same fp32 operations: per block of 32, d = amax / 127, q = nearbyint(clamp(x * (127 / amax),
    -127, 127)) (round half to even; fmax/fmin ignore NaN as in C), s = d * sum(q) and c =
    128 * sum(q). Returns (q int8 [B, K], d fp32 [B, K/32], s fp32 [B, K/32], c int32 [B, K/32])."""
    x = np.asarray(x, dtype=np.float32)
    B, K = x.shape
    xb = x.reshape(B, K // QK, QK)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.fmax.reduce(np.abs(xb), axis=-1, initial=np.float32(0.0))
        d = (amax / np.float32(127.0)).astype(np.float32)
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        v = np.rint(np.fmin(np.fmax(xb * inv[..., None], np.float32(-127.0)), np.float32(127.0)))
    q = v.astype(np.int8)
    isum = q.astype(np.int32).sum(-1, dtype=np.int32)
    s = (d * isum.astype(np.float32)).astype(np.float32)
    return q.reshape(B, K), d, s, (128 * isum).astype(np.int32)
