"""The engine's own linear layer on the 32-element GGUF block types, with the engine's numerics: one
problem per type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), ``<type>_engine_matmul``.

The ``<type>_matmul`` problems take fp32 activations and hold a kernel to an fp32 tolerance, which
the engine's kernel (8-bit activations) cannot meet, so none of their champions can replace it.
These problems take what the engine's kernel takes (``qlinear.c``'s ``sf_qlinear_q32``): the
stored blocks and the activations already quantised per block of 32 by its ``quantize_row``
(``layouts.quantize_rows`` gives the same bits), every block product exact in integers. So a
candidate competes with the engine's kernel on equal terms, and a champion plugs into the engine
for every weight part of its type (``EngineConfig.native_matmul``, engine/native/qext.py).

ABI (the function named after the problem)::

    void q8_0_engine_matmul(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs,
                            float *y, int64_t n, int64_t k, int64_t batch);

``w``: the n rows of W [n, k] as GGUF stores them, k/32 blocks a row (Q4_0 18 bytes, Q4_1 20,
Q5_0 22, Q5_1 24, Q8_0 34); ``xq`` int8 [batch, k] (|xq| <= 127); ``xd`` fp32 [batch, k/32] the
activation block scale; ``xs`` fp32 [batch, k/32] = xd * sum of the block's xq rounded to fp32, as
the engine computes it (a kernel uses it as given); ``y`` fp32 [batch, n], written. k is a
multiple of 32, n >= 1, batch >= 1. The value::

    y[b, r] = sum_j dw[r,j] xd[b,j] dot(u[r,j], xq[b,j]) + mw[r,j] xs[b,j]

Q8_0: u the signed quants, no min term; Q4_1, Q5_1: u the unsigned 4- or 5-bit quants, mw the
stored fp16 min; Q4_0: u the nibble (0..15), mw = -8 dw; Q5_0: u the 5-bit value, mw = -16 dw.
A non-finite activation gives its block xd = NaN (and xs = NaN, xq = 0): every output of its row is NaN.

Requirements beyond the harness's checks (the engine checks them before it runs a champion):
batch invariance (every y[b, r] computed by the same operations whatever ``batch`` and ``n`` are
and whatever other rows are in the call: the engine calls the kernel on pieces of rows, per
thread, with any batch) and no threads of its own (the engine owns them: one call per piece,
single-threaded). The template's default knobs are qlinear.c's own code for the type (the same
bits as ``sf_qlinear_q32``), so the seed is the engine's kernel and its first baseline the same
code as the engine builds it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, with_specials

TYPES = (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0)
QK = 32
BLOCK_BYTES = {QT.Q4_0: 18, QT.Q4_1: 20, QT.Q5_0: 22, QT.Q5_1: 24, QT.Q8_0: 34}
TEMPLATE = Path(__file__).with_name("qengine_matmul.c.j2")
MIN_BOUNDED_OUTPUTS = 4  # cases with fewer finite outputs have no bound from torch's error (_Ops.fp32_torch)

# Gemma 3 270M: hidden 640, intermediate 2048, q|k|v = 1024 + 256 + 256 rows; its output head
# (262144 x 640) cut to 4096 rows, the shape of its gate|up. SmolLM2-135M: hidden 576,
# intermediate 1536. At 1, 16 and 64 rows: the engine's decode at 1, 16 and 64 streams.
G_HIDDEN, G_INTER, G_QKV = 640, 2048, 1536
S_HIDDEN, S_INTER = 576, 1536
HEAD_CUT = 4096
MATRICES = ((G_QKV, G_HIDDEN), (HEAD_CUT, G_HIDDEN), (G_HIDDEN, G_INTER), (2 * S_INTER, S_HIDDEN),
            (S_HIDDEN, S_INTER))
BATCHES = (1, 16, 64)

LAYOUTS = {
    QT.Q4_0: "Q4_0 blocks (fp16 d, 16 bytes of nibbles, low nibbles elements 0..15: u = nibble, w = d*u - 8d)",
    QT.Q4_1: "Q4_1 blocks (fp16 d, fp16 m, 16 bytes of nibbles: u = nibble, w = d*u + m)",
    QT.Q5_0: "Q5_0 blocks (fp16 d, uint32 qh, 16 bytes of nibbles: u = nibble | bit i of qh << 4, "
             "w = d*u - 16d)",
    QT.Q5_1: "Q5_1 blocks (fp16 d, fp16 m, uint32 qh, 16 bytes of nibbles: u = nibble | bit i of qh << 4, "
             "w = d*u + m)",
    QT.Q8_0: "Q8_0 blocks (fp16 d, 32 int8 q: w = d*q)",
}


def problem_name(qtype: QT) -> str:
    return f"{QT(qtype).name.lower()}_engine_matmul"


# -- weights ---------------------------------------------------------------------------------------

def _patch_q5_1(rng, blocks: np.ndarray) -> None:
    """Q5_1's special blocks, in place on [n, nb, 24] (as qblock.patch_special does for Q5_0):
    zero, -0.0 and subnormal fp16 scales, zero mins, every quant 0 or 31, scattered extreme bytes."""
    from swarmfactory.problems.suites.cpu.qblock import _set_f16

    u = rng.random(blocks.shape[:2])
    sel = [(u >= lo) & (u < lo + 0.05) for lo in np.arange(0.0, 0.35, 0.05)]
    _set_f16(blocks, sel[0], 0, 0.0)
    _set_f16(blocks, sel[1], 0, -0.0)
    _set_f16(blocks, sel[2] | sel[3], 0, 3e-6)
    _set_f16(blocks, sel[4], 2, 0.0)  # no min
    blocks[sel[5], 4:] = 0x00  # u = 0: w = m
    blocks[sel[6], 4:] = 0xFF  # u = 31, the top of the range
    q = blocks[..., 4:]
    hit = rng.random(q.shape) < 0.02
    q[hit] = rng.choice(np.array([0x00, 0xFF, 0x0F, 0xF0], dtype=np.uint8), int(hit.sum()))


def make_weights(rng, qtype: QT, n: int, k: int, special: bool = False) -> np.ndarray:
    """n rows of k/32 blocks of ``qtype`` as GGUF stores them (flat uint8), from the makers of the
    fp32-activation problems: qblock's (the engine's quantiser; Q4_0, Q5_0 with its special
    blocks, and Q5_1), q4_1_matmul's and q8_0_matmul's."""
    if qtype == QT.Q8_0:
        from swarmfactory.problems.suites.cpu.q8_0_matmul import make_blocks

        return make_blocks(rng, n, k, special=special)
    if qtype == QT.Q4_1:
        from swarmfactory.problems.suites.cpu.q4_1_matmul import make_blocks

        return make_blocks(rng, n, k, special=special)
    from swarmfactory.problems.suites.cpu.qblock import make_blocks

    if qtype == QT.Q5_1:
        raw = make_blocks(rng, qtype, n, k)
        if special:
            _patch_q5_1(rng, raw.reshape(n, k // QK, BLOCK_BYTES[qtype]))
        return raw
    return make_blocks(rng, qtype, n, k, special=special)


def decode(qtype: QT, w, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(u int64 [n, k], dw float64 [n, k/32], mw float64 [n, k/32]) of the stored blocks: the
    quants the engine's block dot takes (signed for Q8_0, else unsigned) and the scale and min
    it applies (mw = 0 for Q8_0, -8 dw for Q4_0, -16 dw for Q5_0)."""
    bs = BLOCK_BYTES[qtype]
    blocks = np.asarray(w, dtype=np.uint8).reshape(n, k // QK, bs)
    d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float64)
    if qtype == QT.Q8_0:
        return blocks[..., 2:].copy().view(np.int8).reshape(n, k).astype(np.int64), d, np.zeros_like(d)
    stored_min = qtype in (QT.Q4_1, QT.Q5_1)
    five = qtype in (QT.Q5_0, QT.Q5_1)
    qs = blocks[..., 2 + 2 * stored_min + 4 * five:]
    u = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int64)  # [n, nb, 32]
    if five:
        qh = blocks[..., 2 + 2 * stored_min:6 + 2 * stored_min].copy().view("<u4")[..., 0].astype(np.int64)
        u |= ((qh[..., None] >> np.arange(QK)) & 1) << 4
    if stored_min:
        m = blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float64)
    else:
        m = (-8.0 if qtype == QT.Q4_0 else -16.0) * d
    return u.reshape(n, k), d, m


# -- activations -----------------------------------------------------------------------------------

def make_activations(rng, batch: int, k: int, dist: str) -> tuple[np.ndarray, ...]:
    """(xq, xd, xs): fp32 activations drawn from ``dist``, quantised as the engine does
    (``layouts.quantize_rows``). ``special``: -0.0 and denormals (they quantise to 0), all-zero
    blocks (xd = xs = 0) and one block as a non-finite activation leaves it in the engine (xq = 0,
    xd = xs = NaN: its row of y is NaN), in the last row where batch > 1 (the other rows still
    check the special weights), at batch 1 in half the draws."""
    from swarmfactory.layouts import quantize_rows

    special = dist == "special"
    x = gen_values(rng, (batch, k), "normal" if special else dist)
    nb = k // QK
    if special:
        x = with_specials(rng, x, kinds=("negzero", "denormal"), fraction=0.01)
        xb = x.reshape(batch, nb, QK)
        xb[rng.random((batch, nb)) < 0.1] = 0.0
        xb[0, 0] = 0.0
    xq, xd, xs, _ = quantize_rows(x)
    if special:
        j = int(rng.integers(0, nb))
        if batch > 1 or rng.random() < 0.5:
            xq[batch - 1, QK * j:QK * (j + 1)] = 0
            xd[batch - 1, j] = np.float32(np.nan)
            xs[batch - 1, j] = np.float32(np.nan)
    return xq, xd, xs


# -- the op ----------------------------------------------------------------------------------------

class _Ops:
    """The callables of one type's problem (the K-quants' subclass, qengine_k.py, changes the
    activation block and what differs with it)."""

    block = QK  # weights (and activations) per block
    block_bytes = BLOCK_BYTES

    def __init__(self, qtype: QT):
        self.qtype = QT(qtype)
        self.bs = self.block_bytes[self.qtype]

    def stored(self, t) -> np.ndarray:
        """The case's weights as GGUF stores them (flat uint8): here the input itself."""
        return _numpy(t["w"])

    def make_inputs(self, shape, rng, dist):
        n, k, batch = shape["n"], shape["k"], shape["batch"]
        w = make_weights(rng, self.qtype, n, k, special=dist == "special")
        xq, xd, xs = make_activations(rng, batch, k, dist)
        return {"w": w, "xq": xq, "xd": xd, "xs": xs, "n": n, "k": k, "batch": batch}

    def formula(self, t, dtype):
        """y in ``dtype`` from the inputs as the problem states it: the exact block dots (every
        partial sum an integer below 2^24, so exact in fp32 too), times dw and xd, summed over
        the blocks, plus the min terms mw xs summed (but for Q8_0); where any xd (or xs, but for
        Q8_0) is NaN its row is NaN."""
        import torch

        n, k, batch = t["n"], t["k"], t["batch"]
        nb = k // QK
        u, d, m = decode(self.qtype, self.stored(t), n, k)
        qw = torch.from_numpy(u).to(dtype).view(n, nb, QK).transpose(0, 1)  # [nb, n, 32]
        qx = t["xq"].to(dtype).view(batch, nb, QK).permute(1, 2, 0)  # [nb, 32, batch]
        dots = torch.bmm(qw, qx)  # [nb, n, batch], exact
        d, m = torch.from_numpy(d).to(dtype), torch.from_numpy(m).to(dtype)  # [n, nb]
        y = torch.einsum("jib,ij,bj->bi", dots, d, t["xd"].to(dtype))  # xd [batch, nb]
        # Q8_0 has no min term: its xs is not read (where timing mixes inputs of several draws,
        # a NaN xs may sit beside a finite xd)
        return y if self.qtype == QT.Q8_0 else y + t["xs"].to(dtype) @ m.T

    def reference(self, t):
        """In float64 from the same inputs: the block dots are exact integers (float64 holds any
        sum of 32 products of 8-bit numbers), then dw xd dot + mw xs per block, summed."""
        import torch

        return {"y": self.formula(t, torch.float64)}

    def fp32_torch(self, t):
        """Torch's own fp32 answer to this op, the bound on a candidate's error (harness/
        accuracy.py), in the op's own form: the unsigned part of the weights dequantised (dw * u,
        exact in fp32) and the activations (xq * xd), F.linear, plus the min terms xs @ mw.T. So
        its error meets both cancellations any kernel of the op meets: among a block's products
        and between the block terms and the min terms, which cancel the unsigned quants' offset.
        Neither the dequantised F.linear (centred weights: no min terms; the engine's kernel was
        22x its error on a seed case, Q5_0 n = 1, k = 53248, one output of 0.011 from block terms
        of 78 in absolute sum) nor the formula with exact integer block dots (no cancellation
        within a block: the engine's kernel, whose 8 lanes of a block's dot cancel, was up to
        700x its error on 1% of Q8_0 1 x 32 cases) bounds it.
        No bound (ValueError: the harness then judges the case by the tolerance alone) on a case of
        fewer than ``MIN_BOUNDED_OUTPUTS`` finite outputs: the error of one output against torch's
        is the ratio of two roundings, and torch's is at times ~0 by chance (the engine's kernel
        was 17-140x it on 2 in 1000 Q5_1 1 x 32 cases, never above 16x on 3600 cases of 2 and 4
        outputs; at most 1.5x on every seed case and model shape of every type)."""
        import torch
        import torch.nn.functional as F

        n, k, batch = t["n"], t["k"], t["batch"]
        finite = torch.isfinite(t["xd"]) & (torch.isfinite(t["xs"]) | (self.qtype == QT.Q8_0))
        finite_rows = int(finite.all(-1).sum())
        if n * finite_rows < MIN_BOUNDED_OUTPUTS:
            raise ValueError(f"{n * finite_rows} finite outputs: too few for a bound from torch's own error")
        u, d, m = decode(self.qtype, self.stored(t), n, k)
        wu = _f32((u.reshape(n, -1, QK) * d[..., None]).reshape(n, k))
        mw = _f32(m)
        x = (t["xq"].float().view(batch, k // QK, QK) * t["xd"].float()[..., None]).view(batch, k).contiguous()
        xs = t["xs"].float()
        if self.qtype == QT.Q8_0:
            return lambda: F.linear(x, wu)
        return lambda: F.linear(x, wu) + xs @ mw.T

    def dequantised(self, t):
        """(W fp32 [n, k] by the engine's dequantiser, bit for bit gguf's; x = xq * xd in fp32)."""
        from swarmfactory.problems.suites.cpu.qblock import dequantise

        n, k, batch = t["n"], t["k"], t["batch"]
        w = dequantise(self.qtype, self.stored(t), n, k)
        x = (t["xq"].float().view(batch, k // self.block, self.block) * t["xd"].float()[..., None]).view(batch, k)
        return w, x.contiguous()

    def baseline_engine_qnative(self, t):
        """The engine's own kernel for this type (qlinear.c's ``sf_qlinear_q32``, or where this
        CPU's build packs the type ``sf_qlinear_q32_packed`` on the copy packed at setup: the
        kernel its ``qnative`` ops and block step run on each thread's piece of rows), in the
        library the engine runs (``qlinear.loaded``: the best ISA path of this CPU that passed its check),
        single-threaded as the engine calls it, timed in a C loop as a candidate is. The same
        numerics as the reference (not a lower-precision competitor). RuntimeError, with the
        reason, where no build of it passes its check here (the harness skips it loudly)."""
        return EngineQ32(self.qtype, t)

    def baseline_dequant_linear(self, t):
        """Weights dequantised once and the activations xq * xd in fp32 (both outside the timed
        region), then F.linear (oneDNN/MKL sgemm): torch has no kernel for GGUF's block types."""
        import torch.nn.functional as F

        w, x = self.dequantised(t)
        return lambda: F.linear(x, w)

    def eager(self, t):
        """The stored blocks kept; every call dequantises them (engine.quants, vectorised torch)
        and the activations, and multiplies."""
        from swarmfactory.problems.suites.cpu.qblock import dequantise

        n, k, batch, raw = t["n"], t["k"], t["batch"], self.stored(t).copy()
        xq, xd, qtype, block = t["xq"], t["xd"], self.qtype, self.block
        return lambda: (xq.float().view(batch, -1, block) * xd[..., None]).view(batch, k) @ dequantise(qtype, raw, n, k).T

    def roofline(self, shape):
        n, k, b = shape["n"], shape["k"], shape["batch"]
        nb = k // QK
        return Roofline(bytes=n * nb * self.bs + b * (k + 8.0 * nb) + 4.0 * b * n, flops=2.0 * n * k * b)


def _f32(a: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def _numpy(a) -> np.ndarray:
    return a.numpy() if hasattr(a, "numpy") else np.asarray(a)


# The loop that times the engine's kernel: calls through a pointer to sf_qlinear_q32, in C, as
# the harness's driver calls a candidate (no Python between calls).
LOOP_SOURCE = r"""#include <stdint.h>
typedef int (*q32_fn)(int64_t, const void *, const void *, const void *, const void *, void *, int64_t, int64_t,
                      int64_t);
int sf_q32_loop(void *fn, int64_t t, const void *w, const void *xq, const void *xd, const void *xs, void *y,
                int64_t n, int64_t k, int64_t batch, int64_t iters) {
    int rc = 0;
    for (int64_t i = 0; i < iters && !rc; i++) rc = ((q32_fn)fn)(t, w, xq, xd, xs, y, n, k, batch);
    return rc;
}
"""


@cache
def _loop():
    import ctypes

    from swarmfactory.backends.c import CBackend

    lib = ctypes.CDLL(CBackend().build(LOOP_SOURCE, "sf_q32_loop").path, mode=ctypes.RTLD_LOCAL)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.sf_q32_loop.argtypes = [p, i64, p, p, p, p, p, i64, i64, i64, i64]
    lib.sf_q32_loop.restype = ctypes.c_int
    return lib.sf_q32_loop


class EngineQ32:
    """``sf_qlinear_q32`` (or, by ``symbol``, another engine entry point of the same form:
    ``sf_qlinear_q256`` for the K-quants, whose fourth array is bsums) bound to one case's tensors
    (``element_ops.NativeCall``'s protocol: calling it runs the kernel once and returns y;
    ``loop(n)`` runs it n times inside C)."""

    native = True  # no torch.compile form; timed through ``loop``

    def __init__(self, qtype: QT, t, symbol: str = "sf_qlinear_q32", arrays: tuple = ("w", "xq", "xd", "xs")):
        import ctypes

        import torch

        from swarmfactory.engine.native import qlinear

        loaded = qlinear.loaded()
        if loaded.lib is None:
            raise RuntimeError(f"engine_qnative: the native linear kernel is unavailable here: {loaded.reason}")
        fn = getattr(loaded.lib, symbol, None)
        if fn is None:
            raise RuntimeError(f"engine_qnative: the engine's native library has no {symbol}")
        if fn.argtypes is None:  # the same form as sf_qlinear_q32 (load_library declares those it knows)
            i64, p = ctypes.c_int64, ctypes.c_void_p
            fn.restype, fn.argtypes = ctypes.c_int, [i64, p, p, p, p, p, i64, i64, i64]
        n, k, batch = int(t["n"]), int(t["k"]), int(t["batch"])
        self._keep = [torch.as_tensor(t[a]).contiguous() for a in arrays]
        packs = loaded.lib.sf_qlinear_pack_bytes(int(qtype), n, k) > 0
        if symbol in ("sf_qlinear_q32", "sf_qlinear_q256") and packs:
            # this build runs the type on its packed copy (qlinear.c sf_qlinear_pack): so does the
            # yardstick, the copy made here, outside the timed calls, as the engine makes it at load
            pack = torch.empty(loaded.lib.sf_qlinear_pack_bytes(int(qtype), n, k), dtype=torch.uint8)
            w = self._keep[0]
            if loaded.lib.sf_qlinear_pack(int(qtype), w.data_ptr(), n, w.numel() // max(n, 1), k, pack.data_ptr()):
                raise RuntimeError(f"engine_qnative: sf_qlinear_pack refused a {n} x {k} weight")
            symbol = symbol + "_packed"
            fn = getattr(loaded.lib, symbol)
            self._keep[0] = pack
        self.symbol = symbol
        self.y = torch.empty(batch, n, dtype=torch.float32)
        self._args = [int(qtype), *(a.data_ptr() for a in self._keep), self.y.data_ptr(), n, k, batch]
        self._fn, self._loop = fn, _loop()
        self._ptr = ctypes.cast(fn, ctypes.c_void_p).value

    def __call__(self):
        rc = self._fn(*self._args)
        if rc:
            raise RuntimeError(f"{self.symbol} rejected its arguments ({rc})")
        return self.y

    def loop(self, iters: int) -> None:
        rc = self._loop(self._ptr, *self._args, int(iters))
        if rc:
            raise RuntimeError(f"{self.symbol} rejected its arguments ({rc})")


def _shapes() -> dict:
    return dict(
        workload=tuple({"n": n, "k": k, "batch": b} for b in BATCHES for n, k in MATRICES),
        # a shape's share of the engine's time is about its share of the weight bytes read (a
        # block step reads every weight once whatever its rows), at each stream count alike
        workload_weights=tuple(float(n * k) for _ in BATCHES for n, k in MATRICES),
        # n past and short of the 8/16-row tiles, batch 1..17 (every pass size and its remainders),
        # k of 1, 3, 9 and 11 blocks (no whole group of 8, one group and a tail of 1 or 3)
        edge_shapes=({"n": 1, "k": 32, "batch": 1}, {"n": 5, "k": 64, "batch": 3},
                     {"n": 7, "k": 96, "batch": 2}, {"n": 13, "k": 32, "batch": 17},
                     {"n": 3, "k": 352, "batch": 1}, {"n": 31, "k": 352, "batch": 15},
                     {"n": 67, "k": 288, "batch": 7}, {"n": 17, "k": 96, "batch": 16},
                     {"n": 2, "k": 4096, "batch": 1}, {"n": 33, "k": 640, "batch": 9},
                     {"n": 65, "k": 32, "batch": 5}),
        stress_shapes=({"n": 4 * HEAD_CUT, "k": G_HIDDEN, "batch": 1}, {"n": G_HIDDEN, "k": G_INTER, "batch": 33},
                       {"n": 7, "k": 16384, "batch": 3}),
    )


def make_problem(qtype: QT) -> Problem:
    """The ``<type>_engine_matmul`` problem of one of ``TYPES``."""
    qtype = QT(qtype)
    if qtype not in TYPES:
        raise ValueError(f"no engine-matmul problem for {qtype.name} (types: {', '.join(t.name for t in TYPES)})")
    ops = _Ops(qtype)
    name = problem_name(qtype)
    formula = ("y[b,r] = sum_j dw xd dot(q, xq) (q the signed quants)" if qtype == QT.Q8_0 else
               "y[b,r] = sum_j dw xd dot(u, xq) + mw xs (u the unsigned quants, mw "
               + {QT.Q4_0: "-8 dw", QT.Q5_0: "-16 dw"}.get(qtype, "the stored min") + ")")
    return Problem(
        name=name,
        family="quantized_matvec",
        version=1,
        description=f"The engine's linear layer on W (n x k) in GGUF {LAYOUTS[qtype]}, with its numerics: the "
                    "activations come quantised per block of 32 as the engine quantises them (xq int8 [batch, k], "
                    "scale xd and xs = xd * sum(xq) fp32 [batch, k/32]); " + formula + ", the block dots exact in "
                    "int32, xs used as given; y fp32 [batch, n]. k is a multiple of 32. Batch invariant and "
                    "single-threaded, as the engine calls it (see qengine.py).",
        args=(Arg("w", "in", "uint8", block=ops.bs), Arg("xq", "in", "int8", block=QK), Arg("xd", "in"),
              Arg("xs", "in"), Arg("y", "out"), Arg("n", "int"), Arg("k", "int"), Arg("batch", "int")),
        make_inputs=ops.make_inputs,
        output_shapes=lambda s: {"y": (s["batch"], s["n"])},
        reference=ops.reference,
        # the engine's own kernel first: what a candidate must beat to be worth running in it
        baselines={"engine_qnative": ops.baseline_engine_qnative,
                   "dequant_F.linear": ops.baseline_dequant_linear},
        eager=ops.eager,
        # the engine calls the kernel once per thread on that thread's rows: one thread against one
        baseline_threads=1,
        # torch's own fp32 error (harness/accuracy.py), in the op's own form (see _Ops.fp32_torch: not the
        # dequantised F.linear, which never meets the min terms' cancellation); none on cases of < 4 outputs
        fp32_torch=ops.fp32_torch,
        # a dot product of k terms (block terms and min terms) in any order: see q4_1_matmul
        fp32_sum_terms=lambda inputs: int(inputs["k"]),
        shape_constraint=lambda s: s["k"] % QK == 0,
        # as q4_1_packed_matvec: the block dots are exact (int32); what differs from the float64
        # reference is the fp32 arithmetic around them (dw * xd rounded, one fma per block into an
        # fp32 sum of up to 512 terms at k = 16384, the min terms likewise, which cancel against
        # the block terms for the unsigned types: partial sums reach ~10x the O(1) outputs)
        tolerance=Tolerance(1e-4, 1e-4, "exact int32 block dot products; fp32 scale products and an fp32 "
                                        "sum of up to 512 block terms and min terms in any order, whose "
                                        "partial sums reach ~10x the O(1) outputs before the min terms cancel"),
        **_shapes(),
        model_shapes=models.matmul_sample(),
        model_draws=models.matmul_draws(),
        # x enters linearly and is quantised per block: a "large" x only rescales xd and xs
        dists=("normal", "uniform", "tiny", "special"),
        roofline=ops.roofline,
        template=f'{{% set qtype = "{qtype.name.lower()}" %}}\n' + TEMPLATE.read_text(),
        knobs={"mt": [1, 2, 4, 8, 16], "group": [1, 4, 8, 16, 32], "scales": ["grouped8", "per_block"],
               "dot": ["auto", "maddubs", "madd16", "portable"], "vec": ["256", "512"]},
        # qlinear.c's own code: passes of 8 activation rows, groups of at most 16 weight rows
        # (~16 KB), scales 8 blocks at a time, vpdpbusd or maddubs, 256-bit vectors
        knob_defaults={"mt": 8, "group": 16, "scales": "grouped8", "dot": "auto", "vec": "256"},
        knob_aspects={"mt": "blocking", "group": "blocking", "scales": "algorithm", "dot": "vectorisation",
                      "vec": "vectorisation"},
        # the portable kernel takes one (weight row, activation row) at a time in plain C: rows per
        # pass, the scale grouping and the vector width are the SIMD code's
        knob_constraint=lambda kn: kn["dot"] != "portable" or (kn["mt"] == 8 and kn["scales"] == "grouped8"
                                                              and kn["vec"] == "256"),
    )
