"""SwiGLU on the GPU (Llama-3-8B MLP: intermediate 14336), fp32: y = silu(gate) * up."""

from pathlib import Path

from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values
from swarmfactory.problems.suites.gpu.common import compiled, need

INTER = 14336  # Llama-3-8B intermediate_size


def make_inputs(shape, rng, dist):
    n = (shape["rows"], shape["cols"])
    return {"gate": gen_values(rng, n, dist), "up": gen_values(rng, n, dist), "rows": shape["rows"], "cols": shape["cols"]}


def reference(t):
    g = t["gate"].double()
    return {"y": g * g.sigmoid() * t["up"].double()}


def eager(t):
    import torch.nn.functional as F

    g, u = t["gate"], t["up"]
    return lambda: F.silu(g) * u


def liger(t):
    mod = need("liger_kernel.ops.swiglu", "liger-kernel")
    g, u = t["gate"], t["up"]
    return lambda: mod.LigerSiLUMulFunction.apply(g, u)


PROBLEM = Problem(
    name="gpu_swiglu",
    version=1,
    description="SwiGLU activation, silu(gate) * up, elementwise, fp32 on the GPU.",
    args=(Arg("gate", "in"), Arg("up", "in"), Arg("y", "out"), Arg("rows", "int"), Arg("cols", "int")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["rows"], s["cols"])},
    reference=reference,
    baselines={"liger-kernel": liger, "torch.compile": compiled(eager)},
    eager=eager,
    tolerance=Tolerance(1e-5, 1e-6, "elementwise: exp and division in fp32, a few ulps"),
    workload=({"rows": 1, "cols": INTER}, {"rows": 64, "cols": INTER}, {"rows": 4096, "cols": INTER}),
    edge_shapes=({"rows": 1, "cols": 1}, {"rows": 3, "cols": 17}, {"rows": 2, "cols": 4099}),
    interpret_shapes=({"rows": 1, "cols": 1}, {"rows": 3, "cols": 17}, {"rows": 2, "cols": 301}),
    shapes_from="Llama-3-8B (intermediate_size 14336); rows = tokens: decode 1, batch 64, prefill 4096",
    dists=("normal", "uniform", "large", "tiny", "special"),
    roofline=lambda s: Roofline(bytes=12.0 * s["rows"] * s["cols"], flops=6.0 * s["rows"] * s["cols"]),
    backend="triton",
    template=(Path(__file__).with_name("gpu_swiglu.py.j2")).read_text(),
    knobs={"BLOCK": [256, 512, 1024, 2048, 4096], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2]},
    knob_defaults={"BLOCK": 1024, "num_warps": 4, "num_stages": 1},
    knob_aspects={"BLOCK": "blocking", "num_warps": "threading", "num_stages": "unrolling"},
)
