"""Rotary position embedding on the GPU (Llama-3-8B: 32 heads of dim 128, rotate-half as in HF
Llama), fp32: y = x * cos + rotate_half(x) * sin, cos/sin per token and frequency."""

from pathlib import Path

import numpy as np

from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values
from swarmfactory.problems.suites.gpu.common import compiled


def make_inputs(shape, rng, dist):
    t, h, d = shape["tokens"], shape["heads"], shape["dim"]
    pos = rng.integers(0, 8192, size=(t, 1))
    inv = 500000.0 ** (-np.arange(0, d // 2) * 2.0 / d)  # rope_theta 500000
    ang = pos * inv[None, :]
    return {"x": gen_values(rng, (t, h, d), dist), "cos": np.cos(ang).astype(np.float32),
            "sin": np.sin(ang).astype(np.float32), "tokens": t, "heads": h, "dim": d}


def reference(t):
    x = t["x"].double()
    cos, sin = t["cos"].double()[:, None, :], t["sin"].double()[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    import torch

    return {"y": torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)}


def eager(t):
    import torch

    x, cos, sin = t["x"], t["cos"][:, None, :], t["sin"][:, None, :]
    half = x.shape[-1] // 2
    cos2, sin2 = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return lambda: x * cos2 + torch.cat([-x[..., half:], x[..., :half]], -1) * sin2


PROBLEM = Problem(
    name="gpu_rope",
    version=1,
    description="Rotary embedding (rotate-half) of one projection [tokens, heads, dim], fp32 on the GPU.",
    args=(Arg("x", "in"), Arg("cos", "in"), Arg("sin", "in"), Arg("y", "out"), Arg("tokens", "int"),
          Arg("heads", "int"), Arg("dim", "int")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["tokens"], s["heads"], s["dim"])},
    reference=reference,
    baselines={"torch.compile": compiled(eager)},
    eager=eager,
    tolerance=Tolerance(1e-5, 1e-6, "two fp32 products and a sum per element: a few ulps"),
    workload=({"tokens": 1, "heads": 32, "dim": 128}, {"tokens": 64, "heads": 32, "dim": 128},
              {"tokens": 4096, "heads": 32, "dim": 128}),
    edge_shapes=({"tokens": 1, "heads": 1, "dim": 2}, {"tokens": 3, "heads": 5, "dim": 18},
                 {"tokens": 7, "heads": 8, "dim": 128}),
    interpret_shapes=({"tokens": 1, "heads": 1, "dim": 2}, {"tokens": 3, "heads": 5, "dim": 18},
                      {"tokens": 2, "heads": 3, "dim": 64}),
    shape_constraint=lambda s: s["dim"] % 2 == 0,
    shapes_from="Llama-3-8B (num_attention_heads 32, head_dim 128, rope_theta 500000); tokens 1, 64, 4096",
    dists=("normal", "uniform", "large", "tiny", "special"),
    roofline=lambda s: Roofline(bytes=8.0 * s["tokens"] * s["heads"] * s["dim"] + 4.0 * s["tokens"] * s["dim"],
                                flops=3.0 * s["tokens"] * s["heads"] * s["dim"]),
    backend="triton",
    template=(Path(__file__).with_name("gpu_rope.py.j2")).read_text(),
    knobs={"HEADS_PER_PROGRAM": [1, 2, 4, 8], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2]},
    knob_defaults={"HEADS_PER_PROGRAM": 1, "num_warps": 4, "num_stages": 1},
    knob_aspects={"HEADS_PER_PROGRAM": "blocking", "num_warps": "threading", "num_stages": "unrolling"},
)
