"""Matrix-vector/matrix product with GGUF Q4_1 weights: y = x @ dequant(wq).T."""

from pathlib import Path

import numpy as np

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, with_specials

HIDDEN, INTERMEDIATE = 576, 1536  # SmolLM2-135M
QK, BLOCK_BYTES = 32, 20


def make_blocks(rng, n, k, special=False):
    """n rows of k/32 realistic Q4_1 blocks: d ~ small positive fp16, m ~ -8d, random nibbles."""
    nb = k // QK
    d = rng.uniform(0.002, 0.02, (n, nb)).astype("<f2")
    m = (-(8.0 + rng.uniform(-1.0, 1.0, (n, nb))) * d.astype(np.float64)).astype("<f2")
    if special:  # constant blocks (d = 0), zero offsets, subnormal fp16 scales
        u = rng.random((n, nb))
        d[u < 0.1] = 0.0
        m[(u >= 0.1) & (u < 0.2)] = 0.0
        d[(u >= 0.2) & (u < 0.3)] = np.float16(3e-6)
    blocks = np.empty((n, nb, BLOCK_BYTES), dtype=np.uint8)
    blocks[..., 0:2] = d.view(np.uint8).reshape(n, nb, 2)
    blocks[..., 2:4] = m.view(np.uint8).reshape(n, nb, 2)
    blocks[..., 4:] = rng.integers(0, 256, (n, nb, 16), dtype=np.uint8)
    return blocks.reshape(-1)


def decode(wq, n, k):
    """(q as int64 n x k, d and m as float64 n x k/32) from the packed blocks."""
    blocks = np.asarray(wq, dtype=np.uint8).reshape(n, k // QK, BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float64)
    m = blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float64)
    qs = blocks[..., 4:]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(n, k).astype(np.int64)
    return q, d, m


def dequantise(wq, n, k):
    blocks = np.asarray(wq, dtype=np.uint8).reshape(n, k // QK, BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float64)
    m = blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float64)
    qs = blocks[..., 4:]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1)  # uint8: the nibbles, low halves first
    return (q * d[..., None] + m[..., None]).reshape(n, k)


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


def baseline_int4pack(t, dtype=None):
    """torch's CPU int4 kernel, group 32: it computes (q - 8) * scale + zero, so scale = d and
    zero = m + 8d reproduce Q4_1's d * q + m. It needs n to be a multiple of 16 (every workload
    shape is). With ``dtype=bfloat16`` activations and scales are bf16 (its fast path, as engines
    use it), the result cast back to fp32."""
    import torch

    if dtype is not None:
        t = dict(t, x=t["x"].to(dtype))
        inner = baseline_int4pack(t)
        return lambda: inner().float()

    n, k, x = t["n"], t["k"], t["x"]
    q, d, m = decode(t["wq"].numpy(), n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        torch.from_numpy(q.astype(np.int32)), 2)
    scale = torch.from_numpy(d).to(x.dtype)
    zero = torch.from_numpy(m + 8.0 * d).to(x.dtype)
    scales_and_zeros = torch.stack([scale.T, zero.T], dim=-1).contiguous()  # k/32 x n x 2
    return lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, QK, scales_and_zeros)


def baseline_int4pack_bf16(t):
    import torch

    return baseline_int4pack(t, dtype=torch.bfloat16)


def baseline_dequant_linear(t):
    """Weights dequantised once to fp32, then F.linear (oneDNN/MKL sgemm)."""
    import torch
    import torch.nn.functional as F

    w = torch.from_numpy(dequantise(t["wq"].numpy(), t["n"], t["k"])).float()
    x = t["x"]
    return lambda: F.linear(x, w)


def eager_by_hand(t):
    """Nibbles unpacked once; every call dequantises (q * d + m) and multiplies."""
    import torch

    n, k, x = t["n"], t["k"], t["x"]
    q, d, m = decode(t["wq"].numpy(), n, k)
    q = torch.from_numpy(q).float().view(n, k // QK, QK)
    d, m = torch.from_numpy(d).float()[..., None], torch.from_numpy(m).float()[..., None]
    return lambda: x @ (q * d + m).view(n, k).T


def roofline(shape):
    n, k, b = shape["n"], shape["k"], shape["batch"]
    return Roofline(bytes=n * (k // QK) * BLOCK_BYTES + 4.0 * b * (k + n), flops=2.0 * n * k * b)


PROBLEM = Problem(
    name="q4_1_matmul",
    family="quantized_matvec",
    version=2,
    description="y = x @ W.T with W (n x k) in GGUF Q4_1 blocks (fp16 d, fp16 m, 32 nibbles; "
                "w = d*q + m), x fp32 (batch x k); k is a multiple of 32.",
    args=(Arg("wq", "in", "uint8", block=BLOCK_BYTES), Arg("x", "in"), Arg("y", "out"), Arg("n", "int"),
          Arg("k", "int"), Arg("batch", "int")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["batch"], s["n"])},
    reference=reference,
    baselines={"torch_int4pack_mm": baseline_int4pack,
               "torch_int4pack_mm_bf16": baseline_int4pack_bf16,
               "dequant_F.linear": baseline_dequant_linear},
    eager=eager_by_hand,
    # torch's own fp32 error (harness/verify.py): the weights dequantised to fp32, then an fp32
    # matmul; not the first baseline (torch's int4 kernel needs n % 16 == 0)
    fp32_torch=baseline_dequant_linear,
    # MKL's sgemm sums in blocks; a kernel's fp32 dot product of k terms in any order costs up to
    # ~sqrt(k) half-ulps more: that bound allows it
    fp32_sum_terms=lambda inputs: int(inputs["k"]),
    shape_constraint=lambda s: s["k"] % QK == 0,
    tolerance=Tolerance(1e-4, 1e-4, "a dot product of up to 4096 fp32 terms in any order (vector "
                                    "lanes, per-block partial sums, d * sum(x q) + m * sum(x)); "
                                    "outputs are O(1), so atol covers near-zero results too"),
    workload=({"n": HIDDEN, "k": HIDDEN, "batch": 1}, {"n": HIDDEN, "k": INTERMEDIATE, "batch": 1},
              {"n": INTERMEDIATE, "k": HIDDEN, "batch": 1}, {"n": HIDDEN, "k": HIDDEN, "batch": 8},
              {"n": HIDDEN, "k": INTERMEDIATE, "batch": 8}, {"n": INTERMEDIATE, "k": HIDDEN, "batch": 8}),
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
    template=(Path(__file__).with_name("q4_1_matmul.c.j2")).read_text(),
    knobs={"vw": [1, 4, 8, 16], "algo": ["dequant", "nibble"], "rows": [1, 2, 4],
           "bb": [1, 2, 4], "threads": ["none", "omp"]},
    knob_defaults={"vw": 8, "algo": "nibble", "rows": 2, "bb": 2, "threads": "none"},
    knob_aspects={"vw": "vectorisation", "algo": "algorithm", "rows": "blocking",
                  "bb": "blocking", "threads": "threading"},
)
