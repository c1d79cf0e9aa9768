"""Softmax over rows on the GPU (Llama-3-8B's vocabulary, 128256 logits per token), fp32."""

from pathlib import Path

from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values
from swarmfactory.problems.suites.gpu.common import compiled, need

VOCAB = 128256  # Llama-3-8B vocab_size


def make_inputs(shape, rng, dist):
    return {"x": gen_values(rng, (shape["rows"], shape["cols"]), dist), "rows": shape["rows"], "cols": shape["cols"]}


def reference(t):
    return {"y": t["x"].double().softmax(dim=-1)}


def eager(t):
    x = t["x"]
    return lambda: x.softmax(dim=-1)


def liger(t):
    mod = need("liger_kernel.ops.softmax", "liger-kernel")
    x = t["x"]
    return lambda: mod.LigerSoftmaxFunction.apply(x)


def quack(t):
    mod = need("quack.softmax", "quack-kernels")
    x = t["x"]
    return lambda: mod.softmax(x)


PROBLEM = Problem(
    name="gpu_softmax",
    version=1,
    description="Row-wise softmax, fp32 on the GPU (sampling over a Llama-3 vocabulary).",
    args=(Arg("x", "in"), Arg("y", "out"), Arg("rows", "int"), Arg("cols", "int")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["rows"], s["cols"])},
    reference=reference,
    baselines={"liger-kernel": liger, "quack-kernels": quack, "torch.compile": compiled(eager)},
    eager=eager,
    tolerance=Tolerance(1e-4, 1e-6, "block-wise max and sum over up to 128k terms reorder the fp32 "
                                    "reduction; exp of the shifted logits differs by ulps"),
    workload=({"rows": 1, "cols": VOCAB}, {"rows": 32, "cols": VOCAB}, {"rows": 256, "cols": VOCAB}),
    edge_shapes=({"rows": 1, "cols": 1}, {"rows": 3, "cols": 17}, {"rows": 2, "cols": 4099}),
    interpret_shapes=({"rows": 1, "cols": 1}, {"rows": 3, "cols": 17}, {"rows": 2, "cols": 300}),
    shapes_from="Llama-3-8B (vocab_size 128256); rows = sequences sampled at once: 1, 32, 256",
    dists=("normal", "uniform", "large", "tiny"),
    roofline=lambda s: Roofline(bytes=8.0 * s["rows"] * s["cols"], flops=5.0 * s["rows"] * s["cols"]),
    backend="triton",
    template=(Path(__file__).with_name("gpu_softmax.py.j2")).read_text(),
    knobs={"BLOCK": [128, 256, 512, 1024, 2048, 4096], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3]},
    knob_defaults={"BLOCK": 256, "num_warps": 4, "num_stages": 1},
    knob_aspects={"BLOCK": "blocking", "num_warps": "threading", "num_stages": "unrolling"},
)
