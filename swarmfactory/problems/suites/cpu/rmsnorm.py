"""RMSNorm over rows, as in Llama: y = x / sqrt(mean(x^2) + eps) * w."""

from pathlib import Path


from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, log_uniform
from swarmfactory.problems.suites.cpu.engine_yardstick import engine_baseline

HIDDEN = 576  # SmolLM2-135M
EPS = (1e-6, 1e-3)  # Llama-family models use 1e-6 .. 1e-5; norms elsewhere up to 1e-3


def make_inputs(shape, rng, dist):
    rows, cols = shape["rows"], shape["cols"]
    return {
        "x": gen_values(rng, (rows, cols), dist),
        "w": gen_values(rng, (cols,), "normal" if dist in ("large", "tiny", "special") else dist),
        "rows": rows, "cols": cols, "eps": log_uniform(rng, *EPS),
    }


def reference(t):
    x, w = t["x"].double(), t["w"].double()
    y = x / (x.pow(2).mean(dim=-1, keepdim=True) + t["eps"]).sqrt() * w
    return {"y": y}


def baseline_eager(t):
    import torch.nn.functional as F

    x, w, eps, cols = t["x"], t["w"], t["eps"], t["cols"]
    return lambda: F.rms_norm(x, (cols,), w, eps)


def eager(t):
    """What a user writes by hand in PyTorch (HF's LlamaRMSNorm, fp32)."""
    import torch

    x, w, eps = t["x"], t["w"], t["eps"]
    return lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def roofline(shape):
    n = shape["rows"] * shape["cols"]
    return Roofline(bytes=4.0 * (2 * n + shape["cols"]), flops=4.0 * n)



PROBLEM = Problem(
    name="rmsnorm",
    family="norm",
    version=2,
    description="Row-wise RMS normalisation with a learned scale (Llama RMSNorm), fp32; eps is an "
                "argument (1e-6 .. 1e-3).",
    args=(Arg("x", "in"), Arg("w", "in"), Arg("y", "out"), Arg("rows", "int"), Arg("cols", "int"),
          Arg("eps", "float")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["rows"], s["cols"])},
    reference=reference,
    baselines={"F.rms_norm": baseline_eager, **engine_baseline("rmsnorm")},
    eager=eager,
    # torch sums the squares in a tree; a kernel's fp32 sum of a row in any order costs up to
    # ~sqrt(cols) half-ulps more: the bound from torch's own error allows that (harness/verify.py)
    fp32_sum_terms=lambda inputs: int(inputs["cols"]),
    tolerance=Tolerance(1e-4, 1e-4, "the kernel may reorder the fp32 sum of squares (vectorised, "
                                    "multiple accumulators); over 1e4 terms that costs ~1e-5 relative"),
    workload=({"rows": 1, "cols": HIDDEN}, {"rows": 8, "cols": HIDDEN}, {"rows": 128, "cols": HIDDEN}),
    edge_shapes=({"rows": 1, "cols": 1}, {"rows": 1, "cols": 7}, {"rows": 3, "cols": 17},
                 {"rows": 5, "cols": 31}, {"rows": 2, "cols": 577}, {"rows": 13, "cols": 576},
                 {"rows": 2, "cols": 4099}, {"rows": 1, "cols": 1023}, {"rows": 3, "cols": 1025},
                 {"rows": 1, "cols": 64}),
    stress_shapes=({"rows": 1, "cols": 16384}, {"rows": 2, "cols": 65536}, {"rows": 512, "cols": HIDDEN}),
    param_ranges={"eps": EPS},
    model_shapes=models.rows_cols(models.HIDDEN + models.HEAD_DIM),  # hidden; per-head q/k norms
    model_draws=models.rows_cols_draws(lambda i, m: ((m.hidden, 1), (m.head_dim, m.heads))),
    dists=("normal", "uniform", "large", "tiny", "constant", "alternating", "special"),
    roofline=roofline,
    template=(Path(__file__).with_name("rmsnorm.c.j2")).read_text(),
    knobs={"vw": [1, 4, 8, 16], "acc": [1, 2, 4], "unroll": [1, 2, 4],
           "scale": ["mul_inv", "div"], "threads": ["none", "omp"]},
    knob_defaults={"vw": 8, "acc": 2, "unroll": 1, "scale": "mul_inv", "threads": "none"},
    knob_aspects={"vw": "vectorisation", "acc": "unrolling", "unroll": "unrolling",
                  "scale": "algorithm", "threads": "threading"},
)
