"""Matrix-vector/matrix product with GGUF Q8_0 weights: y = x @ dequant(wq).T."""

from pathlib import Path

import numpy as np

from gguf import GGMLQuantizationType as QT

from swarmfactory.problems import models
from swarmfactory.problems.suites.cpu.qblock import engine_qnative
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, with_specials

HIDDEN, INTERMEDIATE, HIDDEN_LARGE = 576, 1536, 2048  # SmolLM2-135M; SmolLM2-1.7B's hidden
QK, BLOCK_BYTES = 32, 34


def make_blocks(rng, n, k, special=False):
    """n rows of k/32 Q8_0 blocks quantised the way GGUF does it (d = max|w| / 127, q =
    round(w / d)) from Gaussian weights whose spread varies by block, so outputs are O(1)."""
    nb = k // QK
    sigma = rng.uniform(0.5, 1.5, (n, nb, 1)) / np.sqrt(k)
    w = rng.standard_normal((n, nb, QK)) * sigma
    d = (np.abs(w).max(axis=-1) / 127.0).astype("<f2")
    dd = d.astype(np.float64)[..., None]
    q = np.clip(np.rint(np.divide(w, dd, out=np.zeros_like(w), where=dd > 0)), -127, 127).astype(np.int8)
    if special:  # zero and -0.0 scales, subnormal fp16 scales, -128 (valid in the format, never
        # produced by GGUF's quantiser), blocks at the extremes of int8
        u = rng.random((n, nb))
        d[u < 0.05] = 0.0
        d[(u >= 0.05) & (u < 0.1)] = np.float16(-0.0)
        d[(u >= 0.1) & (u < 0.2)] = np.float16(3e-6)
        q[(u >= 0.2) & (u < 0.25)] = -128
        q[(u >= 0.25) & (u < 0.3)] = 127
        q[rng.random(q.shape) < 0.02] = -128
    blocks = np.empty((n, nb, BLOCK_BYTES), dtype=np.uint8)
    blocks[..., 0:2] = d.view(np.uint8).reshape(n, nb, 2)
    blocks[..., 2:] = q.view(np.uint8)
    return blocks.reshape(-1)


def decode(wq, n, k):
    """(q as int8 n x k, d as float64 n x k/32) from the packed blocks."""
    blocks = np.asarray(wq, dtype=np.uint8).reshape(n, k // QK, BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float64)
    q = blocks[..., 2:].copy().view(np.int8).reshape(n, k)
    return q, d


def dequantise(wq, n, k):
    q, d = decode(wq, n, k)
    return (q.reshape(n, k // QK, QK) * d[..., None]).reshape(n, k)


def make_inputs(shape, rng, dist):
    n, k, batch = shape["n"], shape["k"], shape["batch"]
    wq = make_blocks(rng, n, k, special=dist == "special")
    x = gen_values(rng, (batch, k), "normal" if dist == "special" else dist)
    if dist == "special":  # NaN (its row of y is NaN), -0.0, denormals
        x = with_specials(rng, x, fraction=0.002)
    return {"wq": wq, "x": x, "n": n, "k": k, "batch": batch}


def reference(t):
    import torch

    w = torch.from_numpy(dequantise(t["wq"].numpy(), t["n"], t["k"]))
    return {"y": t["x"].double() @ w.T}


def baseline_dequant_linear(t, dtype=None):
    """Weights dequantised once (outside the timed region), then F.linear (oneDNN/MKL sgemm).
    torch has no group-wise int8 weight kernel (`_weight_int8pack_mm` takes one scale per row,
    which cannot represent Q8_0's scale per 32 weights)."""
    import torch
    import torch.nn.functional as F

    w = torch.from_numpy(dequantise(t["wq"].numpy(), t["n"], t["k"])).float()
    x = t["x"]
    if dtype is None:
        return lambda: F.linear(x, w)
    w, x = w.to(dtype), x.to(dtype)
    return lambda: F.linear(x, w).float()


def baseline_dequant_linear_bf16(t):
    """The same with bf16 weights and activations: half the bytes of fp32 weights (Q8_0 has
    1.06 bytes a weight), torch's fast path on CPUs with bf16 dot products; a lower-precision
    competitor, checked to bf16 tolerance."""
    import torch

    return baseline_dequant_linear(t, dtype=torch.bfloat16)


def eager_by_hand(t):
    """int8 weights kept; every call dequantises (q * d) and multiplies."""
    import torch

    n, k, x = t["n"], t["k"], t["x"]
    q, d = decode(t["wq"].numpy(), n, k)
    q = torch.from_numpy(q.copy()).view(n, k // QK, QK)
    d = torch.from_numpy(d).float()[..., None]
    return lambda: x @ (q.float() * d).view(n, k).T


def roofline(shape):
    n, k, b = shape["n"], shape["k"], shape["batch"]
    return Roofline(bytes=n * (k // QK) * BLOCK_BYTES + 4.0 * b * (k + n), flops=2.0 * n * k * b)


PROBLEM = Problem(
    name="q8_0_matmul",
    family="quantized_matvec",
    version=1,
    description="y = x @ W.T with W (n x k) in GGUF Q8_0 blocks (fp16 d, 32 int8 q; w = d*q), "
                "x fp32 (batch x k); k is a multiple of 32.",
    args=(Arg("wq", "in", "uint8", block=BLOCK_BYTES), Arg("x", "in"), Arg("y", "out"), Arg("n", "int"),
          Arg("k", "int"), Arg("batch", "int")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["batch"], s["n"])},
    reference=reference,
    # the engine's own kernel for Q8_0 (qlinear.c, 8-bit activations) beside torch: what a
    # champion must beat to matter in the engine
    baselines={"dequant_F.linear": baseline_dequant_linear,
               "dequant_F.linear_bf16": baseline_dequant_linear_bf16,
               "engine_qnative_int8": engine_qnative(QT.Q8_0)},
    eager=eager_by_hand,
    # a dot product of k terms in any order: see q4_1_matmul
    fp32_sum_terms=lambda inputs: int(inputs["k"]),
    shape_constraint=lambda s: s["k"] % QK == 0,
    tolerance=Tolerance(1e-4, 1e-4, "a dot product of up to 16384 fp32 terms in any order (vector "
                                    "lanes, per-block partial sums scaled by d); outputs are O(1), "
                                    "so atol covers near-zero results too"),
    workload=({"n": HIDDEN, "k": HIDDEN, "batch": 1}, {"n": HIDDEN, "k": INTERMEDIATE, "batch": 1},
              {"n": INTERMEDIATE, "k": HIDDEN, "batch": 1}, {"n": HIDDEN, "k": HIDDEN, "batch": 8},
              {"n": HIDDEN, "k": INTERMEDIATE, "batch": 8}, {"n": INTERMEDIATE, "k": HIDDEN, "batch": 8},
              {"n": HIDDEN_LARGE, "k": HIDDEN_LARGE, "batch": 1}),
    edge_shapes=({"n": 5, "k": 64, "batch": 3}, {"n": 1, "k": 32, "batch": 1},
                 {"n": 7, "k": 96, "batch": 2}, {"n": 13, "k": 32, "batch": 5},
                 {"n": 3, "k": 160, "batch": 1}, {"n": 31, "k": 64, "batch": 4},
                 {"n": 67, "k": 288, "batch": 3}, {"n": 2, "k": 4096, "batch": 1},
                 {"n": 17, "k": 576, "batch": 9}, {"n": 1, "k": 1024, "batch": 2},
                 {"n": 65, "k": 32, "batch": 1}),
    stress_shapes=({"n": 4 * INTERMEDIATE, "k": HIDDEN, "batch": 1},
                   {"n": HIDDEN, "k": INTERMEDIATE, "batch": 32}, {"n": 7, "k": 16384, "batch": 3}),
    model_shapes=models.matmul_sample(),
    model_draws=models.matmul_draws(),
    # x enters linearly, so a "large" x only rescales the outputs and the fp32 error with them
    dists=("normal", "uniform", "tiny", "special"),
    roofline=roofline,
    template=(Path(__file__).with_name("q8_0_matmul.c.j2")).read_text(),
    knobs={"vw": [1, 4, 8, 16], "algo": ["dequant", "block"], "rows": [1, 2, 4],
           "bb": [1, 2, 4], "threads": ["none", "omp"]},
    knob_defaults={"vw": 8, "algo": "block", "rows": 2, "bb": 2, "threads": "none"},
    knob_aspects={"vw": "vectorisation", "algo": "algorithm", "rows": "blocking",
                  "bb": "blocking", "threads": "threading"},
)
