"""The engine's linear layer on the 32-element GGUF block types in the layout it runs them in where
the CPU has vpdpbusd: one problem per type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0),
``<type>_engine_packed_matmul``.

On such a CPU the engine multiplies a copy of each weight packed at load (qlinear.c
``sf_qlinear_pack``: 8 rows interleaved, so one vpdpbusd gives 8 rows' partial dots), and that
packed kernel is the ``<type>_engine_matmul`` problems' yardstick. A candidate there gets the
stored blocks and pays for their layout in every call, so none can win (the template's best
measured 0.51x of it on a Zen 4). These problems hand a candidate what the engine's packed kernel
gets: the packed copy (made outside the timed calls, as the engine makes it at load) and the same
quantised activations, with the numerics of qengine.py (the same reference, tolerance, shapes and
activations). A champion plugs into the engine for every weight part of its type that the engine
packs (``EngineConfig.native_matmul``, engine/native/qext.py), called on the part's packed copy.

ABI (the function named after the problem)::

    void q8_0_engine_packed_matmul(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs,
                                   float *y, int64_t n, int64_t k, int64_t batch);

``w``: ceil(n / 8) groups of 8 rows (the last padded with zero rows), each group its k/32 blocks
in order, each block the 8 rows' stored blocks rearranged (``pack``; qlinear.c's comment on
``sf_qlinear_pack``): the 8 fp16 scales d; (Q4_1, Q5_1) the 8 fp16 mins; (Q5_0, Q5_1) the fifth
bits, 4 bytes a row, bit c of byte e being element 4c + e's; then for c = 0..3 the 8 rows' nibble
bytes 4c..4c+3 (32 bytes: low nibbles elements 4c + e, high 16 + 4c + e), or for Q8_0 for c =
0..7 the 8 rows' quants 4c..4c+3, each q + 128 (as an unsigned byte). ``xq``, ``xd``, ``xs``,
``y``, n, k, batch and the value of y as in qengine.py; only the n real rows of y are written.
The engine calls the kernel on pieces of whole groups of a part's packed copy (``w`` at the
piece's first group, ``n`` its rows: a piece may end inside a group).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT

from swarmfactory.problems.spec import Arg, Problem, Roofline
from swarmfactory.problems.suites.cpu import qengine
from swarmfactory.problems.suites.cpu.qengine import BLOCK_BYTES, QK, TYPES, EngineQ32, _numpy

ROWS = 8  # rows per packed group
TEMPLATE = Path(__file__).with_name("qengine_packed_matmul.c.j2")


def problem_name(qtype: QT) -> str:
    return f"{QT(qtype).name.lower()}_engine_packed_matmul"


def _parts(qtype: QT) -> tuple[int, int]:
    """(has a stored min, has fifth bits)"""
    return int(qtype in (QT.Q4_1, QT.Q5_1)), int(qtype in (QT.Q5_0, QT.Q5_1))


def pack(blocks: np.ndarray, qtype: QT, n: int, k: int) -> np.ndarray:
    """The packed copy (flat uint8, ceil(n / 8) * k / 32 blocks of 8 * block bytes) of n rows of
    ``qtype`` stored blocks: the layout of qlinear.c's ``sf_qlinear_pack``, written here
    independently of it (a test holds the two to the same bytes)."""
    qtype = QT(qtype)
    bs, nb = BLOCK_BYTES[qtype], k // QK
    groups = -(-n // ROWS)
    b = np.asarray(blocks, dtype=np.uint8).reshape(n, nb, bs)
    if groups * ROWS != n:
        b = np.concatenate([b, np.zeros((groups * ROWS - n, nb, bs), np.uint8)])
    b = b.reshape(groups, ROWS, nb, bs).transpose(0, 2, 1, 3)  # [g, nb, row, byte]
    out = [b[..., 0:2].reshape(groups, nb, 2 * ROWS)]
    if qtype == QT.Q8_0:
        q = b[..., 2:34] ^ np.uint8(0x80)  # [g, nb, row, 32]: q + 128
        out.append(q.reshape(groups, nb, ROWS, 8, 4).transpose(0, 1, 3, 2, 4).reshape(groups, nb, 256))
    else:
        m1, f5 = _parts(qtype)
        if m1:
            out.append(b[..., 2:4].reshape(groups, nb, 2 * ROWS))
        if f5:
            qh = b[..., 2 + 2 * m1:6 + 2 * m1].copy().view("<u4")[..., 0].astype(np.uint32)  # [g, nb, row]
            bits = (qh[..., None] >> np.arange(QK, dtype=np.uint32)) & 1  # [g, nb, row, element]
            bits = bits.reshape(groups, nb, ROWS, 8, 4)  # element 4c + e -> [c, e]
            byte = (bits << np.arange(8, dtype=np.uint32)[:, None]).sum(axis=3)  # [g, nb, row, e]: bit c
            out.append(byte.astype(np.uint8).reshape(groups, nb, 4 * ROWS))
        qs = b[..., 2 + 2 * m1 + 4 * f5:]  # [g, nb, row, 16]
        out.append(qs.reshape(groups, nb, ROWS, 4, 4).transpose(0, 1, 3, 2, 4).reshape(groups, nb, 128))
    return np.ascontiguousarray(np.concatenate(out, -1)).reshape(-1)


def unpack(packed: np.ndarray, qtype: QT, n: int, k: int) -> np.ndarray:
    """The n rows' stored blocks (flat uint8) back from their packed copy: ``pack`` inverted."""
    qtype = QT(qtype)
    bs, nb = BLOCK_BYTES[qtype], k // QK
    groups = -(-n // ROWS)
    p = np.asarray(packed, dtype=np.uint8).reshape(groups, nb, ROWS * bs)
    b = np.empty((groups, nb, ROWS, bs), np.uint8)
    b[..., 0:2] = p[..., 0:16].reshape(groups, nb, ROWS, 2)
    if qtype == QT.Q8_0:
        q = p[..., 16:272].reshape(groups, nb, 8, ROWS, 4).transpose(0, 1, 3, 2, 4)
        b[..., 2:34] = q.reshape(groups, nb, ROWS, 32) ^ np.uint8(0x80)
    else:
        m1, f5 = _parts(qtype)
        off = 16
        if m1:
            b[..., 2:4] = p[..., 16:32].reshape(groups, nb, ROWS, 2)
            off = 32
        if f5:
            byte = p[..., off:off + 32].reshape(groups, nb, ROWS, 4).astype(np.uint32)  # [.., row, e]
            bits = (byte[..., None, :] >> np.arange(8, dtype=np.uint32)[:, None]) & 1  # [.., row, c, e]
            qh = (bits.reshape(groups, nb, ROWS, QK) << np.arange(QK, dtype=np.uint32)).sum(-1).astype("<u4")
            b[..., 2 + 2 * m1:6 + 2 * m1] = qh.view(np.uint8).reshape(groups, nb, ROWS, 4)
            off += 32
        qs = p[..., off:off + 128].reshape(groups, nb, 4, ROWS, 4).transpose(0, 1, 3, 2, 4)
        b[..., 2 + 2 * m1 + 4 * f5:] = qs.reshape(groups, nb, ROWS, 16)
    return np.ascontiguousarray(b.transpose(0, 2, 1, 3).reshape(groups * ROWS, nb, bs)[:n]).reshape(-1)


class _PackedOps(qengine._Ops):
    """qengine.py's op with the weights given packed: the reference, torch's bound and the
    baselines read the stored blocks back from the packed copy (``unpack``)."""

    def stored(self, t) -> np.ndarray:
        return unpack(_numpy(t["w"]), self.qtype, int(t["n"]), int(t["k"]))

    def make_inputs(self, shape, rng, dist):
        t = super().make_inputs(shape, rng, dist)
        t["w"] = pack(t["w"], self.qtype, t["n"], t["k"])
        return t

    def baseline_engine_qnative(self, t):
        """The engine's packed kernel (qlinear.c ``sf_qlinear_q32_packed``) on the same packed copy,
        in the library the engine runs, single-threaded as the engine calls it, timed in a C loop
        as a candidate is. RuntimeError where this CPU's build has no packed kernel (no vpdpbusd:
        the engine keeps the stored layout there and ``<type>_engine_matmul`` is its problem)."""
        return EngineQ32(self.qtype, t, symbol="sf_qlinear_q32_packed")

    def roofline(self, shape):
        n, k, b = shape["n"], shape["k"], shape["batch"]
        nb = k // QK
        return Roofline(bytes=-(-n // ROWS) * ROWS * nb * self.bs + b * (k + 8.0 * nb) + 4.0 * b * n,
                        flops=2.0 * n * k * b)


def make_problem(qtype: QT) -> Problem:
    """The ``<type>_engine_packed_matmul`` problem of one of qengine's ``TYPES``."""
    qtype = QT(qtype)
    if qtype not in TYPES:
        raise ValueError(f"no packed engine-matmul problem for {qtype.name} "
                         f"(types: {', '.join(t.name for t in TYPES)})")
    base = qengine.make_problem(qtype)
    ops = _PackedOps(qtype)
    # the stored problem's numerics, shapes and cases; the packed weights and this template
    return dataclasses.replace(
        base,
        name=problem_name(qtype),
        description=base.description.replace("The engine's linear layer on W (n x k) in GGUF",
                                             "The engine's linear layer on W (n x k), GGUF")
        .replace("; the activations come", " blocks in the engine's packed layout (groups of 8 rows interleaved "
                 "per block, qengine_packed.py; only the n real rows of y written); the activations come"),
        args=(Arg("w", "in", "uint8", block=ROWS * ops.bs), *base.args[1:]),
        make_inputs=ops.make_inputs,
        reference=ops.reference,
        baselines={"engine_qnative": ops.baseline_engine_qnative,
                   "dequant_F.linear": ops.baseline_dequant_linear},
        eager=ops.eager,
        fp32_torch=ops.fp32_torch,
        roofline=ops.roofline,
        template=f'{{% set qtype = "{qtype.name.lower()}" %}}\n' + TEMPLATE.read_text(),
        # activation rows per pass (auto: the engine's, 8 with 32 vector registers, else 4); weight
        # rows per slice; integer accumulators per block dot; two groups a 512-bit vector
        knobs={"mt": ["auto", 1, 2, 4, 8], "slice": [8, 16, 32, 64], "chains": [1, 2], "vec": ["256", "512"]},
        knob_defaults={"mt": "auto", "slice": 16, "chains": 1, "vec": "256"},
        knob_aspects={"mt": "blocking", "slice": "blocking", "chains": "unrolling", "vec": "vectorisation"},
        knob_constraint=None,  # every combination is valid (plain C takes any)
    )
