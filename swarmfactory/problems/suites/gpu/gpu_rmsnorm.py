"""RMSNorm on the GPU (Llama-3-8B: hidden 4096, eps 1e-5), fp32: y = x / sqrt(mean(x^2) + eps) * w."""

from pathlib import Path

from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, log_uniform
from swarmfactory.problems.suites.gpu.common import compiled, need

HIDDEN = 4096  # Llama-3-8B hidden_size
EPS = (1e-6, 1e-3)


def make_inputs(shape, rng, dist):
    rows, cols = shape["rows"], shape["cols"]
    return {"x": gen_values(rng, (rows, cols), dist),
            "w": gen_values(rng, (cols,), "normal" if dist in ("large", "tiny", "special") else dist),
            "rows": rows, "cols": cols, "eps": log_uniform(rng, *EPS)}


def reference(t):
    x, w = t["x"].double(), t["w"].double()
    return {"y": x / (x.pow(2).mean(dim=-1, keepdim=True) + t["eps"]).sqrt() * w}


def eager(t):
    import torch

    x, w, eps = t["x"], t["w"], t["eps"]
    return lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def liger(t):
    mod = need("liger_kernel.ops.rms_norm", "liger-kernel")
    x, w, eps = t["x"], t["w"], t["eps"]
    return lambda: mod.LigerRMSNormFunction.apply(x, w, eps)


def quack(t):
    mod = need("quack.rmsnorm", "quack-kernels")
    x, w, eps = t["x"], t["w"], t["eps"]
    return lambda: mod.rmsnorm(x, w, eps=eps)


def roofline(shape):
    n = shape["rows"] * shape["cols"]
    return Roofline(bytes=4.0 * (2 * n + shape["cols"]), flops=4.0 * n)


PROBLEM = Problem(
    name="gpu_rmsnorm",
    version=1,
    description="Row-wise RMSNorm with a learned scale (Llama RMSNorm), fp32 on the GPU; eps is an argument.",
    args=(Arg("x", "in"), Arg("w", "in"), Arg("y", "out"), Arg("rows", "int"), Arg("cols", "int"),
          Arg("eps", "float")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["rows"], s["cols"])},
    reference=reference,
    baselines={"liger-kernel": liger, "quack-kernels": quack, "torch.compile": compiled(eager)},
    eager=eager,
    tolerance=Tolerance(1e-4, 1e-4, "a block-wise fp32 sum of squares over 4096 terms reorders the "
                                    "reduction: ~1e-5 relative"),
    workload=({"rows": 1, "cols": HIDDEN}, {"rows": 64, "cols": HIDDEN}, {"rows": 4096, "cols": HIDDEN}),
    edge_shapes=({"rows": 1, "cols": 1}, {"rows": 3, "cols": 17}, {"rows": 2, "cols": 4099},
                 {"rows": 7, "cols": 4096}),
    interpret_shapes=({"rows": 1, "cols": 1}, {"rows": 3, "cols": 17}, {"rows": 2, "cols": 300}),
    shapes_from="Llama-3-8B (hidden_size 4096, rms_norm_eps 1e-5); rows = tokens: decode 1, batch 64, prefill 4096",
    param_ranges={"eps": EPS},
    dists=("normal", "uniform", "large", "tiny", "special"),
    roofline=roofline,
    backend="triton",
    template=(Path(__file__).with_name("gpu_rmsnorm.py.j2")).read_text(),
    knobs={"BLOCK": [64, 128, 256, 512, 1024, 2048], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2, 3]},
    knob_defaults={"BLOCK": 256, "num_warps": 4, "num_stages": 1},
    knob_aspects={"BLOCK": "blocking", "num_warps": "threading", "num_stages": "unrolling"},
)
