"""LayerNorm over rows: y = (x - mean(x)) / sqrt(var(x) + eps) * w + b (biased variance)."""

from pathlib import Path

import numpy as np

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, log_uniform

HIDDEN, HIDDEN_LARGE = 576, 2048  # SmolLM2-135M, SmolLM2-1.7B
EPS = (1e-6, 1e-3)  # GPT-2, Phi, Whisper and ViT use 1e-5 .. 1e-6; norms elsewhere up to 1e-3


def make_inputs(shape, rng, dist):
    rows, cols = shape["rows"], shape["cols"]
    if dist == "offset":  # every row far from zero (|mean| 8 .. 64 std): E[x^2] - E[x]^2 cancels
        shift = rng.uniform(8.0, 64.0, (rows, 1)) * rng.choice([-1.0, 1.0], (rows, 1))
        x = (rng.standard_normal((rows, cols)) + shift).astype(np.float32)
    else:
        x = gen_values(rng, (rows, cols), dist)
    wdist = dist if dist in ("uniform", "alternating") else "normal"  # constant rows: y = b
    return {"x": x, "w": gen_values(rng, (cols,), wdist), "b": gen_values(rng, (cols,), wdist),
            "rows": rows, "cols": cols, "eps": log_uniform(rng, *EPS)}


def reference(t):
    x, w, b = t["x"].double(), t["w"].double(), t["b"].double()
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    return {"y": (x - mean) / (var + t["eps"]).sqrt() * w + b}


def baseline_layer_norm(t):
    import torch.nn.functional as F

    x, w, b, eps, cols = t["x"], t["w"], t["b"], t["eps"], t["cols"]
    return lambda: F.layer_norm(x, (cols,), w, b, eps)


def eager_by_hand(t):
    """What a user writes by hand in PyTorch: mean, biased variance, normalise, scale and shift."""
    import torch

    x, w, b, eps = t["x"], t["w"], t["b"], t["eps"]

    def fn():
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return (x - mean) * torch.rsqrt(var + eps) * w + b

    return fn


def roofline(shape):
    n = shape["rows"] * shape["cols"]
    return Roofline(bytes=4.0 * (2 * n + 2 * shape["cols"]), flops=7.0 * n)


PROBLEM = Problem(
    name="layernorm",
    family="norm",
    version=1,
    description="Row-wise layer normalisation with a learned scale and bias (torch LayerNorm, "
                "biased variance), fp32; eps is an argument (1e-6 .. 1e-3).",
    args=(Arg("x", "in"), Arg("w", "in"), Arg("b", "in"), Arg("y", "out"), Arg("rows", "int"),
          Arg("cols", "int"), Arg("eps", "float")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["rows"], s["cols"])},
    reference=reference,
    baselines={"F.layer_norm": baseline_layer_norm},
    eager=eager_by_hand,
    # torch's F.layer_norm sums in a tree (or in double); a kernel's fp32 sums of the row and of
    # its centred squares, in chunks, one pass or two, cost up to ~sqrt(cols) half-ulps more:
    # the bound from torch's own error allows that (harness/verify.py)
    fp32_sum_terms=lambda inputs: int(inputs["cols"]),
    tolerance=Tolerance(1e-4, 1e-4, "the kernel may reorder the fp32 sums of the mean and the "
                                    "centred squares (~1e-5 relative over 1e4 terms); rows whose "
                                    "mean is 8-64 std away (the `offset` dist) cost torch's own "
                                    "fp32 LayerNorm ~1.3e-5, a one-pass fp32 E[x^2] - E[x]^2 ~2e-3"),
    workload=({"rows": 1, "cols": HIDDEN}, {"rows": 8, "cols": HIDDEN}, {"rows": 128, "cols": HIDDEN},
              {"rows": 8, "cols": HIDDEN_LARGE}),
    edge_shapes=({"rows": 1, "cols": 1}, {"rows": 1, "cols": 7}, {"rows": 3, "cols": 17},
                 {"rows": 5, "cols": 31}, {"rows": 2, "cols": 577}, {"rows": 13, "cols": 576},
                 {"rows": 2, "cols": 4099}, {"rows": 1, "cols": 1023}, {"rows": 3, "cols": 1025},
                 {"rows": 1, "cols": 64}),
    stress_shapes=({"rows": 1, "cols": 16384}, {"rows": 2, "cols": 65536}, {"rows": 512, "cols": HIDDEN}),
    param_ranges={"eps": EPS},
    model_shapes=models.rows_cols(models.HIDDEN),
    model_draws=models.rows_cols_draws(lambda i, m: ((m.hidden, 1),)),
    dists=("normal", "uniform", "large", "tiny", "constant", "alternating", "offset", "special"),
    roofline=roofline,
    template=(Path(__file__).with_name("layernorm.c.j2")).read_text(),
    knobs={"vw": [1, 4, 8, 16], "acc": [1, 2, 4], "unroll": [1, 2, 4],
           "algo": ["two_pass", "one_pass"], "threads": ["none", "omp"]},
    knob_defaults={"vw": 8, "acc": 2, "unroll": 1, "algo": "two_pass", "threads": "none"},
    knob_aspects={"vw": "vectorisation", "acc": "unrolling", "unroll": "unrolling",
                  "algo": "algorithm", "threads": "threading"},
)
