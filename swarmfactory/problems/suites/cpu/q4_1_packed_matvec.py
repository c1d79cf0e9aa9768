"""The native decoder's hot loop: Q4_1 weights in its packed layout against int8 activations.

What ``engine/native/decode.c`` runs for every Q4_1 matrix of a decode step (``matmul_groups``),
with exactly its data: the weight W [n, k] packed by the engine's own ``pack_records`` (groups of
8 rows, one 160-byte record per block of 32 columns, the last group padded with zero rows) and
the activations quantised by a port of its ``quantize_row`` (``layouts.py``).
The template's default knobs are the decoder's current code, so the seed is the engine's loop;
a candidate plugs back into the decoder with ``EngineConfig.native_matvec`` (engine/native/matvec.py).

ABI::

    void q4_1_packed_matvec(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs,
                            float *y, int64_t n, int64_t k, int64_t batch);

``w``: ceil(n / 8) * k / 32 records; ``xq`` int8 [batch, k]; ``xd`` (scale) and ``xs`` (offset
term d * sum(q)) fp32 [batch, k / 32]; ``y`` fp32 [batch, n], written. k is a multiple of 32.
The engine calls it once per thread on that thread's run of row groups (``w`` offset to its
first group, ``n`` its rows), so a kernel must not assume n is a multiple of 8 or the whole
matrix.

Requirement beyond the harness's checks (the engine's batch invariance): every y[b, i] is
computed by the same operations whatever ``batch`` and ``n`` are and whatever else is in the
call, so a row's result is bitwise the same alone or in a batch; the engine checks this of a
candidate before it runs it (``native.matvec.probe_matvec``).
"""

from pathlib import Path

import numpy as np

from swarmfactory.layouts import QK, REC_Q4_1, ROWS, pack_records, quantize_rows, unpack_q4_1
from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, with_specials
from swarmfactory.problems.suites.cpu.q4_1_matmul import make_blocks

DIM, FFN, QKV = 576, 1536, 960  # SmolLM2-135M: dim, ffn; q|k|v = (9 + 2 * 3) heads x 64


def make_inputs(shape, rng, dist):
    n, k, batch = shape["n"], shape["k"], shape["batch"]
    special = dist == "special"
    blocks = make_blocks(rng, n, k, special=special).reshape(n, k // QK, -1)
    w = pack_records(blocks, "q4_1").reshape(-1)
    x = gen_values(rng, (batch, k), "normal" if special else dist)
    if special:  # all-zero blocks (d = s = 0), -0.0, denormals (they quantise to 0)
        x = with_specials(rng, x, kinds=("negzero", "denormal"), fraction=0.01)
        xb = x.reshape(batch, k // QK, QK)
        xb[rng.random((batch, k // QK)) < 0.1] = 0.0
        xb[0, 0] = 0.0
    xq, xd, xs, _ = quantize_rows(x)
    return {"w": w, "xq": xq, "xd": xd, "xs": xs, "n": n, "k": k, "batch": batch}


def reference(t):
    """In float64 from the same inputs: the block dot products are exact integers (in float64,
    whose 53 bits hold any sum of 32 products of 4 and 8 bits), then scaled and summed."""
    import torch

    n, k, batch = t["n"], t["k"], t["batch"]
    nb = k // QK
    q, d, m = unpack_q4_1(t["w"].numpy(), n, k)
    qw = torch.from_numpy(q.astype(np.float64)).view(n, nb, QK).transpose(0, 1)  # [nb, n, 32]
    qx = t["xq"].double().view(batch, nb, QK).permute(1, 2, 0)  # [nb, 32, batch]
    dots = torch.bmm(qw, qx)  # [nb, n, batch], exact
    d, m = torch.from_numpy(d), torch.from_numpy(m)  # [n, nb]
    xd, xs = t["xd"].double(), t["xs"].double()  # [batch, nb]
    y = torch.einsum("jib,ij,bj->bi", dots, d, xd) + xs @ m.T
    return {"y": y}


def _as_q4_1_matmul(t):
    """The same matrix as GGUF blocks and the dequantised activations (xq * xd), for the
    baselines: what an engine without the packed kernel would multiply."""
    import torch

    n, k = t["n"], t["k"]
    q, d, m = unpack_q4_1(t["w"].numpy(), n, k)
    blocks = np.empty((n, k // QK, 20), np.uint8)
    blocks[..., 0:2] = np.ascontiguousarray(d, "<f2").view(np.uint8).reshape(n, -1, 2)
    blocks[..., 2:4] = np.ascontiguousarray(m, "<f2").view(np.uint8).reshape(n, -1, 2)
    qb = q.reshape(n, k // QK, QK).astype(np.uint8)
    blocks[..., 4:] = qb[..., :16] | (qb[..., 16:] << 4)
    x = (t["xq"].float().view(t["batch"], -1, QK) * t["xd"].float()[..., None]).view(t["batch"], k)
    return {"wq": torch.from_numpy(blocks.reshape(-1)), "x": x.contiguous(), "n": n, "k": k, "batch": t["batch"]}


def baseline_int4pack(t):
    """torch's CPU int4 kernel on the same weights, fp32 activations dequantised from xq, xd."""
    from swarmfactory.problems.suites.cpu.q4_1_matmul import baseline_int4pack as inner

    return inner(_as_q4_1_matmul(t))


def baseline_int4pack_bf16(t):
    import torch

    from swarmfactory.problems.suites.cpu.q4_1_matmul import baseline_int4pack as inner

    return inner(_as_q4_1_matmul(t), dtype=torch.bfloat16)


def baseline_dequant_linear(t):
    from swarmfactory.problems.suites.cpu.q4_1_matmul import baseline_dequant_linear as inner

    return inner(_as_q4_1_matmul(t))


def eager_by_hand(t):
    """Every call dequantises the weights (q * d + m) and multiplies the dequantised activations."""
    from swarmfactory.problems.suites.cpu.q4_1_matmul import eager_by_hand as inner

    return inner(_as_q4_1_matmul(t))


def roofline(shape):
    n, k, b = shape["n"], shape["k"], shape["batch"]
    records = -(-n // ROWS) * (k // QK) * REC_Q4_1
    return Roofline(bytes=records + b * (k + 8.0 * (k // QK)) + 4.0 * b * n, flops=2.0 * n * k * b)


PROBLEM = Problem(
    name="q4_1_packed_matvec",
    family="quantized_matvec",
    version=1,
    description="The native decoder's Q4_1 matmul: y = W x for W (n x k) packed as the engine packs "
                "it (groups of 8 rows interleaved in 160-byte records per block of 32 columns) and "
                "x quantised per block of 32 to int8 (xq, scale xd, offset term xs = xd * sum(xq)); "
                "y[b,i] = sum_j xd d sum(q xq) + m xs. Batch invariant (see the module docstring).",
    args=(Arg("w", "in", "uint8", block=REC_Q4_1), Arg("xq", "in", "int8", block=QK), Arg("xd", "in"),
          Arg("xs", "in"), Arg("y", "out"), Arg("n", "int"), Arg("k", "int"), Arg("batch", "int")),
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
    # a dot product of k terms (block sums and offsets) in any order: see q4_1_matmul
    fp32_sum_terms=lambda inputs: int(inputs["k"]),
    shape_constraint=lambda s: s["k"] % QK == 0,
    # The block dot products are exact (int32); what differs from the float64 reference is the
    # fp32 arithmetic around them: d_w * d_x rounded, one fma per block into an fp32 sum of up
    # to 512 terms (k = 16384), the offset sum m * s likewise, and their sum, which cancels
    # (m ~ -8d centres the weights: partial sums reach ~10x the O(1) outputs). That is a few
    # 1e-6 at most, in any summation order a kernel picks; 1e-4 is q4_1_matmul's tolerance.
    tolerance=Tolerance(1e-4, 1e-4, "exact int32 block dot products; fp32 scale products and an fp32 "
                                    "sum of up to 512 block terms and offset terms in any order, whose "
                                    "partial sums reach ~10x the O(1) outputs before the offset cancels"),
    workload=({"n": QKV, "k": DIM, "batch": 1}, {"n": 2 * FFN, "k": DIM, "batch": 1},
              {"n": DIM, "k": FFN, "batch": 1}, {"n": QKV, "k": DIM, "batch": 4},
              {"n": 2 * FFN, "k": DIM, "batch": 16}, {"n": DIM, "k": FFN, "batch": 16}),
    # the engine's call mix: each shape's share of a decode step's time is about its share of the
    # weight bytes read (a matvec is memory bound, and small batches read them once); steps at
    # one stream and at several weigh alike
    workload_weights=tuple(float(n * k) for n, k in ((QKV, DIM), (2 * FFN, DIM), (DIM, FFN)) * 2),
    edge_shapes=({"n": 5, "k": 64, "batch": 3}, {"n": 1, "k": 32, "batch": 1},
                 {"n": 7, "k": 96, "batch": 2}, {"n": 13, "k": 32, "batch": 17},
                 {"n": 8, "k": 160, "batch": 1}, {"n": 31, "k": 64, "batch": 5},
                 {"n": 67, "k": 288, "batch": 3}, {"n": 2, "k": 4096, "batch": 1},
                 {"n": 24, "k": 1024, "batch": 2}, {"n": 65, "k": 32, "batch": 1},
                 {"n": 17, "k": 576, "batch": 33}),
    stress_shapes=({"n": 4 * FFN, "k": DIM, "batch": 1}, {"n": DIM, "k": FFN, "batch": 64},
                   {"n": 7, "k": 16384, "batch": 3}),
    model_shapes=models.matmul_sample(),
    model_draws=models.matmul_draws(),
    # x enters linearly and is quantised per block: a "large" x only rescales xd and xs
    dists=("normal", "uniform", "tiny", "special"),
    roofline=roofline,
    template=(Path(__file__).with_name("q4_1_packed_matvec.c.j2")).read_text(),
    knobs={"bmax": [1, 4, 8, 16], "offset": ["second_pass", "fused"], "dot": ["auto", "maddubs", "portable"],
           "unroll": [1, 2, 4], "threads": ["none", "omp"]},
    knob_defaults={"bmax": 16, "offset": "second_pass", "dot": "auto", "unroll": 1, "threads": "none"},
    knob_aspects={"bmax": "blocking", "offset": "algorithm", "dot": "vectorisation", "unroll": "unrolling",
                  "threads": "threading"},
)
