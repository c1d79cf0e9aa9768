"""Matrix-vector/matrix products with GGUF block weights, y = x @ dequant(wq).T, one problem per
block type that llama.cpp's Q4_K_M, Q5_K_M and Q4_0 files hold: Q4_0, Q5_0, Q4_K, Q5_K, Q6_K.

``make_problem(qtype)`` builds the problem of one type; every type shares the C ABI of
``q8_0_matmul`` (``wq``: n rows of k/BLOCK blocks as stored in GGUF, x fp32 [batch, k], y fp32
[batch, n]), the template (``qblock_matmul.c.j2``, with the type baked in by a ``set`` line put in
front of its text: the knobs stay the same for every type) and the yardsticks. Weights are
quantised and dequantised by the engine's own ``engine.quants`` (checked bit for bit against the
``gguf`` package elsewhere), so the reference is exactly what the engine multiplies by.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, with_specials

TYPES = (QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)
K_QUANTS = frozenset({QT.Q4_K, QT.Q5_K, QT.Q6_K})
TEMPLATE = Path(__file__).with_name("qblock_matmul.c.j2")

# shapes: SmolLM2-135M (hidden 576, intermediate 1536) and SmolLM2-1.7B's hidden for the types of
# 32-weight blocks, as q8_0_matmul; k a multiple of 256 for the K-quants (llama.cpp stores a row
# of any other length in a legacy type): Gemma 3 270M's down projection (640 x 2048) and
# Llama 3.2 1B / SmolLM2-1.7B (hidden 2048, intermediate 8192)
SMALL_HIDDEN, SMALL_INTER, LARGE = 576, 1536, 2048
K_HIDDEN, K_INTER, K_LARGE_HIDDEN, K_LARGE_INTER = 640, 2048, 2048, 8192

DESCRIPTIONS = {
    QT.Q4_0: "GGUF Q4_0 blocks of 32 (fp16 d, 16 bytes of nibbles: w[l] = d*((qs[l] & 15) - 8), "
             "w[l+16] = d*((qs[l] >> 4) - 8)); k is a multiple of 32",
    QT.Q5_0: "GGUF Q5_0 blocks of 32 (fp16 d, uint32 qh, 16 bytes of nibbles: q[j] = nibble j | "
             "bit j of qh << 4, w = d*(q - 16)); k is a multiple of 32",
    QT.Q4_K: "GGUF Q4_K super-blocks of 256 (144 bytes: fp16 d, fp16 dmin, 12 bytes of eight 6-bit "
             "scales and mins, 128 bytes of nibbles; w = (d*sc)*q - dmin*m per sub-block of 32); "
             "k is a multiple of 256",
    QT.Q5_K: "GGUF Q5_K super-blocks of 256 (176 bytes: fp16 d, fp16 dmin, 12 scale bytes, 32 bytes "
             "of fifth bits, 128 bytes of nibbles; w = (d*sc)*q - dmin*m per sub-block of 32); "
             "k is a multiple of 256",
    QT.Q6_K: "GGUF Q6_K super-blocks of 256 (210 bytes: 128 bytes of low nibbles, 64 of high 2-bit "
             "pairs, 16 int8 scales, fp16 d at the end; w = (d*sc)*(q - 32) per 16 weights); "
             "k is a multiple of 256",
}


def geometry(qtype: QT) -> tuple[int, int]:
    """(weights per block, bytes per block)."""
    return GGML_QUANT_SIZES[qtype]


def _set_f16(blocks: np.ndarray, sel: np.ndarray, at: int, value: float, fields: int = 1) -> None:
    """The fp16 field at byte ``at`` (and the ``fields - 1`` after it) of the selected blocks."""
    blocks[sel, at:at + 2 * fields] = np.tile(np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8), fields)


def patch_special(rng, blocks: np.ndarray, qtype: QT) -> None:
    """Values valid in the format that the quantiser seldom or never writes, in place on
    blocks [n, nb, bytes]: zero, -0.0 and subnormal fp16 scales (3e-6, below fp16's smallest
    normal 6.1e-5), and the extreme quants and 6-bit/int8 scales of the format."""
    u = rng.random(blocks.shape[:2])
    sel = [(u >= lo) & (u < lo + 0.05) for lo in np.arange(0.0, 0.5, 0.05)]
    if qtype in (QT.Q4_0, QT.Q5_0):
        _set_f16(blocks, sel[0], 0, 0.0)
        _set_f16(blocks, sel[1], 0, -0.0)
        _set_f16(blocks, sel[2] | sel[3], 0, 3e-6)
        blocks[sel[4], 2:] = 0x00  # q = 0: w = -8d (Q4_0) or -16d (Q5_0)
        blocks[sel[5], 2:] = 0xFF  # q = 15 or 31, the top of the range
    elif qtype in (QT.Q4_K, QT.Q5_K):
        _set_f16(blocks, sel[0], 0, 0.0)
        _set_f16(blocks, sel[1], 0, -0.0, fields=2)  # d and dmin both -0.0
        _set_f16(blocks, sel[2], 0, 3e-6)
        _set_f16(blocks, sel[3], 2, 3e-6)
        _set_f16(blocks, sel[4], 2, 0.0)  # no min
        blocks[sel[5], 4:16] = 0xFF  # every 6-bit scale and min at 63
        blocks[sel[6], 16:] = 0x00  # q = 0 everywhere (Q5_K: the fifth bits too): w = -dmin*m
        blocks[sel[7], 16:] = 0xFF  # q = 15 (31) everywhere
    elif qtype == QT.Q6_K:
        _set_f16(blocks, sel[0], 208, 0.0)
        _set_f16(blocks, sel[1], 208, -0.0)
        _set_f16(blocks, sel[2], 208, 3e-6)
        blocks[sel[3], 192:208] = np.uint8(0x80)  # every scale -128 (int8's extreme)
        blocks[sel[4], 192:208] = np.uint8(127)
        blocks[sel[5], 0:192] = 0x00  # q = 0: w = -32 d sc
        blocks[sel[6], 0:192] = 0xFF  # q = 63: w = 31 d sc
    else:
        raise ValueError(f"no special blocks for {qtype.name}")
    # and scattered extreme bytes among ordinary blocks
    qbytes = {QT.Q4_0: slice(2, 18), QT.Q5_0: slice(2, 22), QT.Q4_K: slice(16, 144),
              QT.Q5_K: slice(16, 176), QT.Q6_K: slice(0, 192)}[qtype]
    q = blocks[..., qbytes]
    hit = rng.random(q.shape) < 0.02
    q[hit] = rng.choice(np.array([0x00, 0xFF, 0x0F, 0xF0], dtype=np.uint8), int(hit.sum()))


POOL_WEIGHTS = 1 << 18  # weights quantised for one matrix at most (see make_blocks)


def make_blocks(rng, qtype: QT, n: int, k: int, special: bool = False) -> np.ndarray:
    """n rows of k/BLOCK blocks of ``qtype`` as GGUF stores them (flat uint8), quantised by the
    engine's quantiser from Gaussian weights whose spread varies by 32 weights, so outputs are O(1).
    A matrix of more than ``POOL_WEIGHTS`` weights is laid out from a pool of that many quantised
    blocks drawn at random (every block still one the quantiser wrote): the K-quant quantisers
    (numpy ports of llama.cpp's) take ~0.2 s per million weights, and a 2048 x 8192 case would
    otherwise cost seconds to make, every case, every evaluation."""
    from swarmfactory.engine.quants import quantize

    qk, nbytes = geometry(qtype)
    blocks = n * (k // qk)
    pooled = min(blocks, max(1, POOL_WEIGHTS // qk))
    sigma = rng.uniform(0.5, 1.5, (pooled, qk // 32, 1)) / np.sqrt(k)
    w = (rng.standard_normal((pooled, qk // 32, 32)) * sigma).reshape(pooled, qk).astype(np.float32)
    raw = np.ascontiguousarray(quantize(w, qtype)).reshape(pooled, nbytes)
    if pooled < blocks:
        raw = raw[rng.integers(0, pooled, blocks)]
    if special:
        patch_special(rng, raw.reshape(n, k // qk, nbytes), qtype)
    return raw.reshape(-1)


def dequantise(qtype: QT, wq, n: int, k: int):
    """fp32 torch [n, k]: the engine's dequantiser (bit for bit gguf's)."""
    from swarmfactory.engine.quants import dequantize

    qk, nbytes = geometry(qtype)
    return dequantize(qtype, np.asarray(wq, dtype=np.uint8).reshape(n, k // qk * nbytes), n, k)


def _raw(t) -> np.ndarray:
    w = t["wq"]
    return w.numpy() if hasattr(w, "numpy") else np.asarray(w)


def engine_qnative(qtype: QT):
    """The engine's own kernel for ``qtype`` as a baseline factory (``_Ops.baseline_engine_qnative``),
    for the problems of other modules (q8_0_matmul)."""
    return _Ops(qtype).baseline_engine_qnative


class _Ops:
    """The callables of one type's problem (picklable by reference through the module's
    problems; each takes the qtype from here)."""

    def __init__(self, qtype: QT):
        self.qtype = qtype
        self.qk, self.nbytes = geometry(qtype)

    def make_inputs(self, shape, rng, dist):
        n, k, batch = shape["n"], shape["k"], shape["batch"]
        wq = make_blocks(rng, self.qtype, n, k, special=dist == "special")
        x = gen_values(rng, (batch, k), "normal" if dist == "special" else dist)
        if dist == "special":  # NaN (its row of y is NaN), -0.0, denormals
            x = with_specials(rng, x, fraction=0.002)
        return {"wq": wq, "x": x, "n": n, "k": k, "batch": batch}

    def reference(self, t):
        w = dequantise(self.qtype, _raw(t), t["n"], t["k"]).double()
        return {"y": t["x"].double() @ w.T}

    def baseline_dequant_linear(self, t):
        """Weights dequantised once (outside the timed region), then F.linear (oneDNN/MKL sgemm)
        in fp32: torch has no kernel for GGUF's block types."""
        import torch.nn.functional as F

        w = dequantise(self.qtype, _raw(t), t["n"], t["k"])
        x = t["x"]
        return lambda: F.linear(x, w)

    def baseline_engine_qnative(self, t):
        """The engine's own kernel for this type, what it runs today (engine/native/qlinear.c,
        ``qnative``: the stored blocks kept, the best checked ISA path of this CPU, torch's
        intra-op thread count). It quantises the activations to 8 bits per call (every block
        product exact in integers), so its outputs lie slightly outside the fp32 tolerance (about
        1e-3 relative): the harness times it as a yardstick all the same (``choose`` records
        ``within_tolerance`` and takes the fastest). RuntimeError, with the reason, where no
        build of it passes its check on this machine, so the harness skips it loudly."""
        import torch

        from swarmfactory.engine.gguf_loader import QuantTensor
        from swarmfactory.engine.kernels import Weight
        from swarmfactory.engine.native import qlinear

        loaded = qlinear.loaded()
        if loaded.lib is None:
            raise RuntimeError(f"engine_qnative_int8: the native linear kernel is unavailable here: {loaded.reason}")
        n, k = t["n"], t["k"]
        raw = np.ascontiguousarray(_raw(t), dtype=np.uint8).reshape(n, k // self.qk * self.nbytes)
        try:
            packed = qlinear.Packed(Weight([QuantTensor("wq", self.qtype, n, k, raw)]))
        except qlinear.NativeUnavailable as e:
            raise RuntimeError(f"engine_qnative_int8: {e}") from None
        lib, x = loaded.lib, t["x"].contiguous()
        return lambda: packed(lib, x, threads=torch.get_num_threads())

    def eager(self, t):
        """The stored blocks kept; every call dequantises them (engine.quants, vectorised torch)
        and multiplies."""
        n, k, x, raw = t["n"], t["k"], t["x"], _raw(t).copy()
        return lambda: x @ dequantise(self.qtype, raw, n, k).T

    def roofline(self, shape):
        n, k, b = shape["n"], shape["k"], shape["batch"]
        return Roofline(bytes=n * (k // self.qk) * self.nbytes + 4.0 * b * (k + n), flops=2.0 * n * k * b)

    def shape_ok(self, shape) -> bool:
        return shape["k"] % self.qk == 0


def _shapes(qtype: QT) -> dict:
    if qtype not in K_QUANTS:  # as q8_0_matmul
        H, I, L = SMALL_HIDDEN, SMALL_INTER, LARGE
        return dict(
            workload=({"n": H, "k": H, "batch": 1}, {"n": H, "k": I, "batch": 1}, {"n": I, "k": H, "batch": 1},
                      {"n": H, "k": H, "batch": 8}, {"n": H, "k": I, "batch": 8}, {"n": I, "k": H, "batch": 8},
                      {"n": L, "k": L, "batch": 1}),
            edge_shapes=({"n": 5, "k": 64, "batch": 3}, {"n": 1, "k": 32, "batch": 1},
                         {"n": 7, "k": 96, "batch": 2}, {"n": 13, "k": 32, "batch": 5},
                         {"n": 3, "k": 160, "batch": 1}, {"n": 31, "k": 64, "batch": 4},
                         {"n": 67, "k": 288, "batch": 3}, {"n": 2, "k": 4096, "batch": 1},
                         {"n": 17, "k": 576, "batch": 9}, {"n": 1, "k": 1024, "batch": 2},
                         {"n": 65, "k": 32, "batch": 1}),
            stress_shapes=({"n": 4 * I, "k": H, "batch": 1}, {"n": H, "k": I, "batch": 32},
                           {"n": 7, "k": 16384, "batch": 3}),
        )
    H, I, LH, LI = K_HIDDEN, K_INTER, K_LARGE_HIDDEN, K_LARGE_INTER
    return dict(
        workload=({"n": H, "k": I, "batch": 1}, {"n": LH, "k": LH, "batch": 1},
                  {"n": H, "k": I, "batch": 8}, {"n": LH, "k": LH, "batch": 8},
                  {"n": LH, "k": LI, "batch": 1}),
        edge_shapes=({"n": 5, "k": 256, "batch": 3}, {"n": 1, "k": 256, "batch": 1},
                     {"n": 7, "k": 512, "batch": 2}, {"n": 13, "k": 256, "batch": 5},
                     {"n": 3, "k": 768, "batch": 1}, {"n": 31, "k": 512, "batch": 4},
                     {"n": 67, "k": 1280, "batch": 3}, {"n": 2, "k": 4096, "batch": 1},
                     {"n": 17, "k": 2304, "batch": 9}, {"n": 1, "k": 1024, "batch": 2},
                     {"n": 65, "k": 256, "batch": 1}),
        stress_shapes=({"n": 3 * LH, "k": LH, "batch": 1}, {"n": H, "k": I, "batch": 32},
                       {"n": 7, "k": 16384, "batch": 3}),
    )


def _model_shapes(qtype: QT, ok) -> dict:
    """The models' matmul shapes (problems/models.py), those whose k fits the block: every one
    for the 32-weight blocks; for the K-quants the sample's k-part at the k that are multiples
    of 256 (its n-part, k = 32-160, does not fit) and the draws of such k."""
    sample = tuple(s for s in models.matmul_sample() if ok(s))
    draws = tuple((label, s) for label, s in models.matmul_draws() if ok(s))
    return dict(model_shapes=sample, model_draws=draws)


# The fastest single-thread settings measured at each type's batch-1 workload shape (576x576 for
# Q4_0/Q5_0, 640x2048 for the K-quants; gcc 12 -O3 -march=native on a 2-core AVX-512 VM, median of
# 15 interleaved rounds): Q4_0 fused/vw 8/rows 4 21.7 us, Q5_0 fused/16/4 32.5 us, Q4_K dequant/16/1
# 103.6 us (fused/8/4: 107.0), Q5_K dequant/16/1 128.9 us (fused/16/2: 138.1), Q6_K fused/8/1
# 135.6 us (fused/16/2: 136.1). bb changes nothing at batch 1: it is the fastest at batch 8 (4,
# Q4_K 2). threads stays "none", as in every other problem: "omp" ran these 1.7-2x faster while
# the machine's second core was idle, and 100-400x slower (median) while another process held it.
KNOB_DEFAULTS = {
    QT.Q4_0: {"vw": 8, "algo": "fused", "rows": 4, "bb": 4, "threads": "none"},
    QT.Q5_0: {"vw": 16, "algo": "fused", "rows": 4, "bb": 4, "threads": "none"},
    QT.Q4_K: {"vw": 16, "algo": "dequant", "rows": 1, "bb": 2, "threads": "none"},
    QT.Q5_K: {"vw": 16, "algo": "dequant", "rows": 1, "bb": 4, "threads": "none"},
    QT.Q6_K: {"vw": 8, "algo": "fused", "rows": 1, "bb": 4, "threads": "none"},
}


def make_problem(qtype: QT) -> Problem:
    """The ``<type>_matmul`` problem of one of ``TYPES``."""
    qtype = QT(qtype)
    if qtype not in TYPES:
        raise ValueError(f"no block-matmul problem for {qtype.name} (types: {', '.join(t.name for t in TYPES)})")
    ops = _Ops(qtype)
    name = f"{qtype.name.lower()}_matmul"
    qk, nbytes = ops.qk, ops.nbytes
    template = f'{{% set qtype = "{qtype.name.lower()}" %}}\n' + TEMPLATE.read_text()
    return Problem(
        name=name,
        family="quantized_matvec",
        version=1,
        description=f"y = x @ W.T with W (n x k) in {DESCRIPTIONS[qtype]}; x fp32 (batch x k).",
        args=(Arg("wq", "in", "uint8", block=nbytes), Arg("x", "in"), Arg("y", "out"), Arg("n", "int"),
              Arg("k", "int"), Arg("batch", "int")),
        make_inputs=ops.make_inputs,
        output_shapes=lambda s: {"y": (s["batch"], s["n"])},
        reference=ops.reference,
        baselines={"dequant_F.linear": ops.baseline_dequant_linear,
                   "engine_qnative_int8": ops.baseline_engine_qnative},
        eager=ops.eager,
        # the bound on a candidate's error is torch's fp32 one: never the 8-bit engine kernel
        fp32_torch=ops.baseline_dequant_linear,
        # a dot product of k terms in any order: see q4_1_matmul
        fp32_sum_terms=lambda inputs: int(inputs["k"]),
        shape_constraint=ops.shape_ok,
        tolerance=Tolerance(1e-4, 1e-4, "a dot product of up to 16384 fp32 terms in any order (vector "
                                        "lanes, per-sub-block partial sums scaled by d*sc, minus "
                                        "dmin*m times the sub-block's sum of x); outputs are O(1), so "
                                        "atol covers near-zero results too"),
        **_shapes(qtype),
        **_model_shapes(qtype, ops.shape_ok),
        # x enters linearly, so a "large" x only rescales the outputs and the fp32 error with them
        dists=("normal", "uniform", "tiny", "special"),
        roofline=ops.roofline,
        template=template,
        knobs={"vw": [1, 4, 8, 16], "algo": ["dequant", "fused"], "rows": [1, 2, 4],
               "bb": [1, 2, 4], "threads": ["none", "omp"]},
        knob_defaults=dict(KNOB_DEFAULTS[qtype]),
        knob_aspects={"vw": "vectorisation", "algo": "algorithm", "rows": "blocking",
                      "bb": "blocking", "threads": "threading"},
    )
