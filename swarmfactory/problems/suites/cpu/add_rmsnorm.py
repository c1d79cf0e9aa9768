"""Residual add fused with RMSNorm, as in every Llama block: h = x + r (the new residual stream)
and y = h / sqrt(mean(h^2) + eps) * w (the next sublayer's input)."""

from pathlib import Path

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, log_uniform
from swarmfactory.problems.suites.cpu.engine_yardstick import engine_baseline

HIDDEN, HIDDEN_LARGE = 576, 2048  # SmolLM2-135M, SmolLM2-1.7B
EPS = (1e-6, 1e-3)  # Llama-family models use 1e-6 .. 1e-5; norms elsewhere up to 1e-3


def make_inputs(shape, rng, dist):
    rows, cols = shape["rows"], shape["cols"]
    return {
        "x": gen_values(rng, (rows, cols), dist),
        "r": gen_values(rng, (rows, cols), dist),
        "w": gen_values(rng, (cols,), "normal" if dist in ("large", "tiny", "special") else dist),
        "rows": rows, "cols": cols, "eps": log_uniform(rng, *EPS),
    }


def reference(t):
    h = t["x"].double() + t["r"].double()
    y = h / (h.pow(2).mean(dim=-1, keepdim=True) + t["eps"]).sqrt() * t["w"].double()
    return {"h": h, "y": y}


def baseline_add_rms_norm(t):
    """The add, then torch's RMSNorm (one fused kernel under torch.compile)."""
    import torch.nn.functional as F

    x, r, w, eps, cols = t["x"], t["r"], t["w"], t["eps"], t["cols"]

    def fn():
        h = x + r
        return h, F.rms_norm(h, (cols,), w, eps)

    return fn


def eager_by_hand(t):
    """What a user writes by hand in PyTorch: the residual add and HF's LlamaRMSNorm, fp32."""
    import torch

    x, r, w, eps = t["x"], t["r"], t["w"], t["eps"]

    def fn():
        h = x + r
        return h, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w

    return fn


def roofline(shape):
    n = shape["rows"] * shape["cols"]
    return Roofline(bytes=4.0 * (4 * n + shape["cols"]), flops=5.0 * n)



PROBLEM = Problem(
    name="add_rmsnorm",
    family="norm",
    version=1,
    description="Residual add fused with RMSNorm (Llama), fp32, two outputs: h = x + r, the new "
                "residual, and y = rmsnorm(h) * w; eps is an argument (1e-6 .. 1e-3).",
    args=(Arg("x", "in"), Arg("r", "in"), Arg("w", "in"), Arg("h", "out"), Arg("y", "out"),
          Arg("rows", "int"), Arg("cols", "int"), Arg("eps", "float")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"h": (s["rows"], s["cols"]), "y": (s["rows"], s["cols"])},
    reference=reference,
    baselines={"add+F.rms_norm": baseline_add_rms_norm, **engine_baseline("add_rmsnorm")},
    eager=eager_by_hand,
    # as rmsnorm: a row's fp32 sum of squares in any order (harness/verify.py)
    fp32_sum_terms=lambda inputs: int(inputs["cols"]),
    tolerance=Tolerance(1e-4, 1e-4, "h is one fp32 add (half an ulp); y as rmsnorm: the kernel "
                                    "may reorder the fp32 sum of squares (vectorised, multiple "
                                    "accumulators), ~1e-5 relative over 1e4 terms"),
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
    dists=("normal", "uniform", "large", "tiny", "constant", "alternating", "special"),
    roofline=roofline,
    template=(Path(__file__).with_name("add_rmsnorm.c.j2")).read_text(),
    knobs={"vw": [1, 4, 8, 16], "acc": [1, 2, 4], "unroll": [1, 2, 4],
           "pass2": ["reload", "recompute"], "threads": ["none", "omp"]},
    knob_defaults={"vw": 8, "acc": 2, "unroll": 1, "pass2": "reload", "threads": "none"},
    knob_aspects={"vw": "vectorisation", "acc": "unrolling", "unroll": "unrolling",
                  "pass2": "algorithm", "threads": "threading"},
)
