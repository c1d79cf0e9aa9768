"""The engine's own linear layer on the K-quants (Q4_K, Q5_K, Q6_K), with the engine's numerics:
one problem per type, ``<type>_engine_matmul``, as qengine.py's for the 32-element types.

The activations come quantised as qlinear.c's ``quantize_row`` quantises them for the K-quants
(``quantize_rows_256`` gives the same bits): per block of 256, d = amax / 127, q = rint(x * 127 /
amax) (fp32), and the sums of q per 16 (bsums). Every super-block's products are exact in
integers; a champion can replace the engine's kernel for every weight part of its type.

ABI (the function named after the problem)::

    void q4_k_engine_matmul(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *bsums,
                            float *y, int64_t n, int64_t k, int64_t batch);

``w``: the n rows of W [n, k] as GGUF stores them, k/256 super-blocks a row (Q4_K 144 bytes,
Q5_K 176, Q6_K 210); ``xq`` int8 [batch, k] (|xq| <= 127); ``xd`` fp32 [batch, k/256];
``bsums`` int16 [batch, k/16], the sum of each 16 consecutive xq as the engine computes it (a
kernel uses it as given: the harness's timing runs replace input units from other draws, so it
need not match xq there). k is a multiple of 256, n >= 1, batch >= 1. Per super-block i of
weight row r and activation row b (d, dmin the super-block's fp16 scales, u the unsigned quants)::

    Q4_K, Q5_K: d xd sum_j sc_j dot(u_j, xq_j) - dmin xd sum_j m_j (bsum_2j + bsum_2j+1)
                (j the 8 sub-blocks of 32, sc_j, m_j their 6-bit scales and mins)
    Q6_K:       d xd sum_g sc_g (dot(u_g, xq_g) - 32 bsum_g)
                (g the 16 groups of 16, sc_g the int8 scales, u 0..63)

and y[b, r] the sum over the super-blocks. A non-finite activation gives its block xd = NaN (xq
= 0, bsums 0): every output of its row is NaN.

Requirements beyond the harness's checks, as qengine.py's: batch invariance and no threads of its
own. The template's default knobs are qlinear.c's own K-quant code (``unpack_k``, ``tilek``,
``groupk``, ``TILES``, ``row_group``): the same bits as ``sf_qlinear_q256``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, with_specials
from swarmfactory.problems.suites.cpu import qengine
from swarmfactory.problems.suites.cpu.qengine import MIN_BOUNDED_OUTPUTS, EngineQ32, _f32, _numpy, problem_name

TYPES = (QT.Q4_K, QT.Q5_K, QT.Q6_K)
QK = 256
BLOCK_BYTES = {QT.Q4_K: 144, QT.Q5_K: 176, QT.Q6_K: 210}
TEMPLATE = Path(__file__).with_name("qengine_k_matmul.c.j2")

# k must be a multiple of 256 (llama.cpp stores a K-quant only there: Gemma 3 270M's hidden 640 and
# SmolLM2-135M's 576 are not, so their K-quant weights are the down projections): Gemma 3 270M's
# down (640 x 2048), SmolLM2-135M's (576 x 1536), Qwen2.5-1.5B's q|k|v (1536 + 2 * 256 rows x 1536)
# and a 2048 x 2048 projection (Llama-3.2-1B's o, SmolLM2-1.7B's q), at 1, 16 and 64 streams
MATRICES = ((640, 2048), (576, 1536), (2048, 1536), (2048, 2048))
BATCHES = (1, 16, 64)

LAYOUTS = {
    QT.Q4_K: "Q4_K super-blocks of 256 (fp16 d, dmin; 12 bytes of 6-bit scales/mins; 128 bytes of nibbles: "
             "w = d sc_j u - dmin m_j per sub-block j of 32)",
    QT.Q5_K: "Q5_K super-blocks of 256 (fp16 d, dmin; 12 bytes of 6-bit scales/mins; 32 bytes of high bits; "
             "128 bytes of nibbles: w = d sc_j u - dmin m_j, u 5 bits)",
    QT.Q6_K: "Q6_K super-blocks of 256 (128 bytes of low nibbles, 64 of high 2 bits, 16 int8 scales, fp16 d: "
             "w = d sc_g (u - 32) per group g of 16, u 6 bits)",
}


# -- activations -----------------------------------------------------------------------------------

def quantize_rows_256(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xq int8 [M, K], xd fp32 [M, K/256], bsums int16 [M, K/16]) of fp32 x [M, K], bit for bit
    qlinear.c's ``quantize_row`` for the K-quants: per block of 256, amax = max |x|, id = 127 /
    amax (0 for an all-zero block), q = rint(clamp(x * id, -127, 127)) in fp32 (ties to even),
    d = amax / 127; a block with a non-finite value gets d = NaN and q = 0."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    M, K = x.shape
    xb = x.reshape(M, K // QK, QK)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        a = np.abs(xb)
        bad = ~(a <= np.float32(3.4028234663852886e38)).all(-1)
        amax = np.where(bad, np.float32(0), np.where(np.isnan(a), np.float32(0), a).max(-1)).astype(np.float32)
        safe = np.where(amax > 0, amax, np.float32(1)).astype(np.float32)
        inv = np.where(amax > 0, np.float32(127) / safe, np.float32(0)).astype(np.float32)
        v = np.clip(xb * inv[..., None], np.float32(-127), np.float32(127))
        q = np.rint(np.where(bad[..., None], np.float32(0), v)).astype(np.int8)
        d = np.where(bad, np.float32(np.nan), amax / np.float32(127)).astype(np.float32)
    bsums = q.reshape(M, K // 16, 16).astype(np.int32).sum(-1).astype(np.int16)
    return q.reshape(M, K), d, bsums


def make_activations(rng, batch: int, k: int, dist: str) -> tuple[np.ndarray, ...]:
    """(xq, xd, bsums): fp32 activations drawn from ``dist``, quantised as the engine does.
    ``special``: -0.0 and denormals, all-zero blocks (xd = 0) and one block as a non-finite
    activation leaves it (xq = 0, bsums 0, xd = NaN), in the last row where batch > 1, at batch 1
    in half the draws."""
    special = dist == "special"
    x = gen_values(rng, (batch, k), "normal" if special else dist)
    nb = k // QK
    if special:
        x = with_specials(rng, x, kinds=("negzero", "denormal"), fraction=0.01)
        xb = x.reshape(batch, nb, QK)
        xb[rng.random((batch, nb)) < 0.1] = 0.0
        if batch > 1:
            xb[0, 0] = 0.0
    xq, xd, bsums = quantize_rows_256(x)
    if special:
        j = int(rng.integers(0, nb))
        if batch > 1 or rng.random() < 0.5:
            xq[batch - 1, QK * j:QK * (j + 1)] = 0
            bsums[batch - 1, 16 * j:16 * (j + 1)] = 0
            xd[batch - 1, j] = np.float32(np.nan)
    return xq, xd, bsums


# -- weights ---------------------------------------------------------------------------------------

def decode(qtype: QT, w, n: int, k: int) -> dict:
    """The stored super-blocks as the problem's formula takes them: ``u`` int64 [n, k] (the
    unsigned quants), ``sc`` int64 [n, k/16] (each group of 16's integer scale: sc_j of its
    sub-block for Q4_K/Q5_K, the int8 scale for Q6_K), ``mn`` int64 [n, k/16] (the group's integer
    factor of its bsum: m_j for Q4_K/Q5_K, -32 sc_g for Q6_K), ``d``, ``dmin`` float64 [n, k/256]
    (dmin = 0 for Q6_K: its bsum term is scaled by d)."""
    qtype = QT(qtype)
    nb = k // QK
    b = np.asarray(w, dtype=np.uint8).reshape(n, nb, BLOCK_BYTES[qtype]).astype(np.int64)
    if qtype == QT.Q6_K:
        ql, qh = b[..., :128], b[..., 128:192]
        u = np.empty((n, nb, QK), np.int64)
        for h in range(2):
            for s in range(4):
                lo = (ql[..., 64 * h + 32 * (s & 1):64 * h + 32 * (s & 1) + 32] >> (4 * (s >> 1))) & 15
                hi = (qh[..., 32 * h:32 * h + 32] >> (2 * s)) & 3
                u[..., 128 * h + 32 * s:128 * h + 32 * s + 32] = lo | (hi << 4)
        sc = b[..., 192:208].astype(np.uint8).view(np.int8).astype(np.int64)  # [n, nb, 16]
        d = np.asarray(w, np.uint8).reshape(n, nb, -1)[..., 208:210].copy().view("<f2")[..., 0].astype(np.float64)
        return {"u": u.reshape(n, k), "sc": sc.reshape(n, k // 16), "mn": (-32 * sc).reshape(n, k // 16),
                "d": d, "dmin": np.zeros_like(d), "b": None}
    raw = np.asarray(w, np.uint8).reshape(n, nb, -1)
    d = raw[..., 0:2].copy().view("<f2")[..., 0].astype(np.float64)
    dmin = raw[..., 2:4].copy().view("<f2")[..., 0].astype(np.float64)
    s = b[..., 4:16]  # get_scale_min_k4
    sc = np.empty((n, nb, 8), np.int64)
    mn = np.empty((n, nb, 8), np.int64)
    sc[..., :4], mn[..., :4] = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    qs = b[..., 48:176] if qtype == QT.Q5_K else b[..., 16:144]
    u = np.empty((n, nb, 8, 32), np.int64)
    for j in range(8):
        u[..., j, :] = (qs[..., 32 * (j // 2):32 * (j // 2) + 32] >> (4 * (j % 2))) & 15
        if qtype == QT.Q5_K:
            u[..., j, :] |= ((b[..., 16:48] >> j) & 1) << 4
    return {"u": u.reshape(n, k), "sc": np.repeat(sc, 2, -1).reshape(n, k // 16),
            "mn": np.repeat(mn, 2, -1).reshape(n, k // 16), "d": d, "dmin": dmin}


# -- the op ----------------------------------------------------------------------------------------

class _Ops(qengine._Ops):
    """qengine's callables with activation blocks of 256 and their sums per 16: the inputs, the
    formula, torch's fp32 answer, the engine's entry point and the roofline differ; the
    dequantised baseline and the eager reference are qengine's (their min terms come from x, not
    bsums: another function only of the mixed inputs timing runs make)."""

    block = QK
    block_bytes = BLOCK_BYTES

    def make_inputs(self, shape, rng, dist):
        from swarmfactory.problems.suites.cpu.qblock import make_blocks

        n, k, batch = shape["n"], shape["k"], shape["batch"]
        w = make_blocks(rng, self.qtype, n, k, special=dist == "special")
        xq, xd, bsums = make_activations(rng, batch, k, dist)
        return {"w": w, "xq": xq, "xd": xd, "bsums": bsums, "n": n, "k": k, "batch": batch}

    def formula(self, t, dtype):
        """y in ``dtype``: per super-block the integer sums (exact in float64: below 2^30) isum =
        sum sc u xq and msum = sum mn bsum (bsums as given), then d xd isum - dmin xd msum
        (Q6_K: d xd (isum + msum), its mn = -32 sc), summed over the super-blocks."""
        import torch

        n, k, batch = t["n"], t["k"], t["batch"]
        nb = k // QK
        dec = decode(self.qtype, _numpy(t["w"]), n, k)
        a = dec["u"].reshape(n, k // 16, 16) * dec["sc"][..., None]  # integer weights sc * u
        aw = torch.from_numpy(a.reshape(n, nb, QK)).to(dtype).transpose(0, 1)  # [nb, n, 256]
        qx = t["xq"].to(dtype).view(batch, nb, QK).permute(1, 2, 0)  # [nb, 256, batch]
        isum = torch.bmm(aw, qx)  # [nb, n, batch], exact
        mn = torch.from_numpy(dec["mn"].reshape(n, nb, 16)).to(dtype).transpose(0, 1)  # [nb, n, 16]
        bs = t["bsums"].to(dtype).view(batch, nb, 16).permute(1, 2, 0)  # [nb, 16, batch]
        msum = torch.bmm(mn, bs)  # exact
        d, dmin = torch.from_numpy(dec["d"]).to(dtype), torch.from_numpy(dec["dmin"]).to(dtype)  # [n, nb]
        xd = t["xd"].to(dtype)  # [batch, nb]
        if self.qtype == QT.Q6_K:
            return torch.einsum("jib,ij,bj->bi", isum + msum, d, xd)
        return torch.einsum("jib,ij,bj->bi", isum, d, xd) - torch.einsum("jib,ij,bj->bi", msum, dmin, xd)

    def fp32_torch(self, t):
        """Torch's own fp32 answer in the op's own form (see qengine._Ops.fp32_torch): the unsigned
        part of the weights dequantised (d sc u per element), the activations xq * xd, F.linear,
        plus the bsum terms per group of 16: xs_g = xd bsum_g (bsums as given) times mw_g =
        -dmin m_j (Q4_K/Q5_K) or -32 d sc_g (Q6_K). No bound on a case of fewer than
        ``MIN_BOUNDED_OUTPUTS`` finite outputs (ValueError)."""
        import torch
        import torch.nn.functional as F

        n, k, batch = t["n"], t["k"], t["batch"]
        nb = k // QK
        finite_rows = int(torch.isfinite(t["xd"]).all(-1).sum())
        if n * finite_rows < MIN_BOUNDED_OUTPUTS:
            raise ValueError(f"{n * finite_rows} finite outputs: too few for a bound from torch's own error")
        dec = decode(self.qtype, _numpy(t["w"]), n, k)
        dd = np.repeat(dec["d"], 16, -1)  # per group of 16
        wu = _f32((dec["u"].reshape(n, k // 16, 16) * (dd * dec["sc"])[..., None]).reshape(n, k))
        if self.qtype == QT.Q6_K:
            mw = _f32(dd * dec["mn"])
        else:
            mw = _f32(-np.repeat(dec["dmin"], 16, -1) * dec["mn"])
        xd = t["xd"].float()
        x = (t["xq"].float().view(batch, nb, QK) * xd[..., None]).view(batch, k).contiguous()
        xs = (t["bsums"].float().view(batch, nb, 16) * xd[..., None]).view(batch, k // 16).contiguous()
        return lambda: F.linear(x, wu) + xs @ mw.T

    def baseline_engine_qnative(self, t):
        """The engine's own kernel for this type (qlinear.c's ``sf_qlinear_q256``, or where this
        CPU's build packs it ``sf_qlinear_q256_packed`` on the copy packed at setup), in the library
        the engine runs, single-threaded, timed in a C loop as a candidate is. RuntimeError, with
        the reason, where it is unavailable (the harness skips it loudly)."""
        return EngineQ32(self.qtype, t, symbol="sf_qlinear_q256", arrays=("w", "xq", "xd", "bsums"))

    def roofline(self, shape):
        n, k, b = shape["n"], shape["k"], shape["batch"]
        nb = k // QK
        return Roofline(bytes=n * nb * self.bs + b * (k + 4.0 * nb + 2.0 * (k // 16)) + 4.0 * b * n,
                        flops=2.0 * n * k * b)


def _shapes() -> dict:
    return dict(
        workload=tuple({"n": n, "k": k, "batch": b} for b in BATCHES for n, k in MATRICES),
        workload_weights=tuple(float(n * k) for _ in BATCHES for n, k in MATRICES),
        # n past and short of the 16-row groups, batch 1..17 (every pass of 8/4/2/1 and their
        # remainders), k of 1, 2, 3 and 10 super-blocks
        edge_shapes=({"n": 1, "k": 256, "batch": 1}, {"n": 5, "k": 512, "batch": 3},
                     {"n": 7, "k": 768, "batch": 2}, {"n": 13, "k": 256, "batch": 17},
                     {"n": 31, "k": 768, "batch": 15}, {"n": 17, "k": 512, "batch": 16},
                     {"n": 33, "k": 256, "batch": 9}, {"n": 3, "k": 2560, "batch": 5},
                     {"n": 65, "k": 256, "batch": 7}),
        stress_shapes=({"n": 4096, "k": 2048, "batch": 1}, {"n": 640, "k": 2048, "batch": 33},
                       {"n": 7, "k": 16384, "batch": 3}),
    )


def _model_shapes() -> dict:
    """The models' matmul shapes whose k is a multiple of 256 (as qblock._model_shapes)."""
    ok = lambda s: s["k"] % QK == 0  # noqa: E731
    return dict(model_shapes=tuple(s for s in models.matmul_sample() if ok(s)),
                model_draws=tuple((label, s) for label, s in models.matmul_draws() if ok(s)))


def make_problem(qtype: QT) -> Problem:
    """The ``<type>_engine_matmul`` problem of one of ``TYPES`` (the K-quants)."""
    qtype = QT(qtype)
    if qtype not in TYPES:
        raise ValueError(f"no K-quant engine-matmul problem for {qtype.name}")
    ops = _Ops(qtype)
    formula = ("per super-block d xd sum_g sc_g (dot(u_g, xq_g) - 32 bsum_g) (groups of 16, u 0..63)"
               if qtype == QT.Q6_K else
               "per super-block d xd sum_j sc_j dot(u_j, xq_j) - dmin xd sum_j m_j (bsum_2j + bsum_2j+1) "
               "(sub-blocks of 32, u unsigned)")
    return Problem(
        name=problem_name(qtype),
        family="quantized_matvec",
        version=1,
        description=f"The engine's linear layer on W (n x k) in GGUF {LAYOUTS[qtype]}, with its numerics: the "
                    "activations come quantised per block of 256 as the engine quantises them (xq int8 [batch, k], "
                    "scale xd fp32 [batch, k/256], bsums int16 [batch, k/16] the sums of xq per 16, used as "
                    "given); y[b,r] = sum of " + formula + ", the integer sums exact in int32; y fp32 [batch, n]. "
                    "k is a multiple of 256. Batch invariant and single-threaded, as the engine calls it "
                    "(see qengine_k.py).",
        args=(Arg("w", "in", "uint8", block=ops.bs), Arg("xq", "in", "int8", block=QK), Arg("xd", "in"),
              Arg("bsums", "in", "int16", block=16), Arg("y", "out"), Arg("n", "int"), Arg("k", "int"),
              Arg("batch", "int")),
        make_inputs=ops.make_inputs,
        output_shapes=lambda s: {"y": (s["batch"], s["n"])},
        reference=ops.reference,
        baselines={"engine_qnative": ops.baseline_engine_qnative,
                   "dequant_F.linear": ops.baseline_dequant_linear},
        eager=ops.eager,
        baseline_threads=1,
        fp32_torch=ops.fp32_torch,
        fp32_sum_terms=lambda inputs: int(inputs["k"]),
        shape_constraint=lambda s: s["k"] % QK == 0,
        # exact integer sums per super-block (up to 2^25, rounded once to fp32), fp32 scale
        # products and an fp32 sum of up to 64 super-block terms (k = 16384) per lane, whose min
        # terms cancel against the block terms
        tolerance=Tolerance(1e-4, 1e-4, "exact int32 super-block sums rounded to fp32; fp32 scale products and "
                                        "an fp32 sum of the super-block terms and their min terms in any order"),
        **_shapes(),
        **_model_shapes(),
        dists=("normal", "uniform", "tiny", "special"),
        roofline=ops.roofline,
        template=f'{{% set qtype = "{qtype.name.lower()}" %}}\n' + TEMPLATE.read_text(),
        knobs={"mt": [1, 2, 4, 8], "group": [1, 4, 8, 16], "dot": ["maddubs", "portable"],
               "unpack": ["superblock", "chunk"]},
        # qlinear.c's own code: passes of 8 activation rows, groups of at most 16 weight rows
        # (~16 KB), maddubs + madd, a super-block unpacked once per pass
        knob_defaults={"mt": 8, "group": 16, "dot": "maddubs", "unpack": "superblock"},
        knob_aspects={"mt": "blocking", "group": "blocking", "dot": "vectorisation", "unpack": "algorithm"},
        # the portable kernel takes one (weight row, activation row) at a time in plain C
        knob_constraint=lambda kn: kn["dot"] != "portable" or (kn["mt"] == 8 and kn["unpack"] == "superblock"),
    )
