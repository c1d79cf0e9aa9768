"""A 4-bit GEMV on the GPU (decode with int4 weights of Llama-3-8B's projections), fp32 activations.

Weights are symmetric int4 with one fp32 scale per group of 32 along K (the layout of GPTQ/AWQ-style
kernels without zero points): ``w[n, k] = (nibble - 8) * scales[n, k // 32]``; byte ``k // 2`` of row
``n`` holds element ``k`` in its low nibble when k is even, in its high nibble when odd.
``y[n] = sum_k w[n, k] * x[k]``.
"""

from pathlib import Path

import numpy as np

from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values
from swarmfactory.problems.suites.gpu.common import compiled

GROUP = 32


def make_inputs(shape, rng, dist):
    n, k = shape["n"], shape["k"]
    return {"x": gen_values(rng, (k,), dist),
            "wq": rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8),
            "scales": (np.abs(rng.standard_normal((n, k // GROUP))) * 0.02 + 1e-3).astype(np.float32),
            "n": n, "k": k}


def dequant(wq, scales):
    import torch

    lo = (wq & 0xF).to(torch.int64)
    hi = (wq >> 4).to(torch.int64)
    q = torch.stack([lo, hi], dim=-1).reshape(wq.shape[0], -1) - 8
    return q.to(scales.dtype) * scales.repeat_interleave(GROUP, dim=1)


def reference(t):
    w = dequant(t["wq"], t["scales"].double())
    return {"y": w @ t["x"].double()}


def atol_for(expected, inputs):
    """fp32 reordering of K products: a bound proportional to sum |w x| (not to |y|, which can cancel)."""
    import torch

    w = dequant(torch.from_numpy(inputs["wq"]), torch.from_numpy(inputs["scales"]).double()).numpy()
    x = np.nan_to_num(inputs["x"].astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    return {"y": 2e-6 * (np.abs(w) @ np.abs(x)) + 1e-30}


def eager(t):
    wq, scales, x = t["wq"], t["scales"], t["x"]
    return lambda: dequant(wq, scales) @ x


PROBLEM = Problem(
    name="gpu_q4_gemv",
    version=1,
    description="y = W x with W int4 (symmetric, fp32 scale per 32 along K, two per byte), fp32 on the GPU.",
    args=(Arg("x", "in"), Arg("wq", "in", "uint8"), Arg("scales", "in"), Arg("y", "out"),
          Arg("n", "int"), Arg("k", "int")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["n"],)},
    reference=reference,
    baselines={"torch.compile": compiled(eager)},
    eager=eager,
    tolerance=Tolerance(1e-4, 1e-4, "the K-long dot product is reordered by the kernel's blocking"),
    atol_for=atol_for,
    workload=({"n": 4096, "k": 4096}, {"n": 14336, "k": 4096}, {"n": 4096, "k": 14336}),
    edge_shapes=({"n": 1, "k": 32}, {"n": 5, "k": 64}, {"n": 17, "k": 96}),
    interpret_shapes=({"n": 1, "k": 32}, {"n": 5, "k": 64}, {"n": 17, "k": 96}),
    shape_constraint=lambda s: s["k"] % GROUP == 0,
    shapes_from="Llama-3-8B projections at decode: q/o 4096x4096, gate/up 14336x4096, down 4096x14336",
    dists=("normal", "uniform", "large", "tiny"),
    roofline=lambda s: Roofline(bytes=s["n"] * s["k"] / 2 + 4.0 * (s["n"] * s["k"] / GROUP + s["k"] + s["n"]),
                                flops=2.0 * s["n"] * s["k"]),
    backend="triton",
    template=(Path(__file__).with_name("gpu_q4_gemv.py.j2")).read_text(),
    knobs={"BLOCK_N": [1, 2, 4, 8, 16], "BLOCK_K": [32, 64, 128, 256, 512], "num_warps": [1, 2, 4, 8],
           "num_stages": [1, 2, 3]},
    knob_defaults={"BLOCK_N": 4, "BLOCK_K": 64, "num_warps": 4, "num_stages": 1},
    knob_aspects={"BLOCK_N": "blocking", "BLOCK_K": "blocking", "num_warps": "threading",
                  "num_stages": "unrolling"},
)
