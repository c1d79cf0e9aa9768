"""Decode attention on the GPU (Llama-3-8B: 32 query heads, 8 KV heads, head dim 128, GQA), fp32:
one query token per sequence against its KV cache, y = softmax(q k^T / sqrt(d)) v."""

from pathlib import Path

import numpy as np

from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values
from swarmfactory.problems.suites.gpu.common import compiled


def make_inputs(shape, rng, dist):
    b, h, hk, s, d = (shape[x] for x in ("batch", "heads", "kv_heads", "seq", "dim"))
    return {"q": gen_values(rng, (b, h, d), dist), "k": gen_values(rng, (b, hk, s, d), dist),
            "v": gen_values(rng, (b, hk, s, d), dist), "batch": b, "heads": h, "kv_heads": hk, "seq": s, "dim": d}


def reference(t):
    q, k, v = t["q"].double(), t["k"].double(), t["v"].double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = (k @ q.unsqueeze(-1)).squeeze(-1) / np.sqrt(q.shape[-1])
    return {"y": (scores.softmax(-1).unsqueeze(-2) @ v).squeeze(-2)}


def atol_for(expected, inputs):
    v = np.abs(inputs["v"][np.isfinite(inputs["v"])].astype(np.float64))
    return {"y": 1e-5 * (float(v.max()) if v.size else 1.0)}


def eager(t):
    import torch.nn.functional as F

    q, k, v = t["q"].unsqueeze(2), t["k"], t["v"]
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True).squeeze(2)


PROBLEM = Problem(
    name="gpu_attention_decode",
    version=1,
    description="Single-token attention over a KV cache with grouped KV heads, fp32 on the GPU.",
    args=(Arg("q", "in"), Arg("k", "in"), Arg("v", "in"), Arg("y", "out"), Arg("batch", "int"),
          Arg("heads", "int"), Arg("kv_heads", "int"), Arg("seq", "int"), Arg("dim", "int")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["batch"], s["heads"], s["dim"])},
    reference=reference,
    baselines={"torch SDPA (eager)": eager, "torch.compile": compiled(eager)},
    eager=eager,
    tolerance=Tolerance(1e-4, 1e-5, "online softmax rescales partial sums block by block: fp32 reordering"),
    atol_for=atol_for,
    workload=({"batch": 1, "heads": 32, "kv_heads": 8, "seq": 4096, "dim": 128},
              {"batch": 16, "heads": 32, "kv_heads": 8, "seq": 4096, "dim": 128},
              {"batch": 1, "heads": 32, "kv_heads": 8, "seq": 32768, "dim": 128}),
    edge_shapes=({"batch": 1, "heads": 1, "kv_heads": 1, "seq": 1, "dim": 4},
                 {"batch": 2, "heads": 4, "kv_heads": 2, "seq": 7, "dim": 8},
                 {"batch": 1, "heads": 2, "kv_heads": 1, "seq": 33, "dim": 16}),
    interpret_shapes=({"batch": 1, "heads": 1, "kv_heads": 1, "seq": 1, "dim": 4},
                      {"batch": 2, "heads": 4, "kv_heads": 2, "seq": 7, "dim": 8},
                      {"batch": 1, "heads": 2, "kv_heads": 1, "seq": 33, "dim": 16}),
    shape_constraint=lambda s: s["heads"] % s["kv_heads"] == 0,
    shapes_from="Llama-3-8B (32 heads, 8 KV heads, head_dim 128); contexts 4k (batch 1 and 16) and 32k",
    dists=("normal", "uniform", "tiny"),
    roofline=lambda s: Roofline(bytes=8.0 * s["batch"] * s["kv_heads"] * s["seq"] * s["dim"],
                                flops=4.0 * s["batch"] * s["heads"] * s["seq"] * s["dim"]),
    backend="triton",
    template=(Path(__file__).with_name("gpu_attention_decode.py.j2")).read_text(),
    knobs={"BLOCK_S": [16, 32, 64, 128, 256], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2, 3]},
    knob_defaults={"BLOCK_S": 32, "num_warps": 4, "num_stages": 1},
    knob_aspects={"BLOCK_S": "blocking", "num_warps": "threading", "num_stages": "unrolling"},
)
