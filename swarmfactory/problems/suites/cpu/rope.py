"""Rotary position embedding (RoPE), rotate-half convention as in HF Llama."""

from pathlib import Path

import numpy as np

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, log_uniform, with_specials
from swarmfactory.problems.suites.cpu.engine_yardstick import engine_baseline

HEADS, KV_HEADS, HEAD_DIM, THETA = 9, 3, 64, 100000.0  # SmolLM2-135M
MAX_POS = 4096
THETA_RANGE = (1e4, 1e6)  # Llama 2: 1e4, SmolLM2: 1e5, Llama 3: 5e5


def make_inputs(shape, rng, dist):
    tokens, heads, head_dim = shape["tokens"], shape["heads"], shape["head_dim"]
    pos = rng.integers(0, MAX_POS, tokens).astype(np.int64)
    pos[0] = MAX_POS - 1 if tokens > 1 else pos[0]  # the largest angle is always checked
    if dist == "special":
        x = with_specials(rng, gen_values(rng, (tokens, heads, head_dim), "normal"))
    else:
        x = gen_values(rng, (tokens, heads, head_dim), dist)
    return {"x": x, "pos": pos, "tokens": tokens, "heads": heads, "head_dim": head_dim,
            "theta": log_uniform(rng, *THETA_RANGE)}


def reference(t):
    import torch

    x, d = t["x"].double(), t["head_dim"]
    inv = float(t["theta"]) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = t["pos"].double()[:, None, None] * inv  # tokens x 1 x half
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return {"y": torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)}


def baseline_hf(t):
    """HF Llama's rotary embedding and apply_rotary_pos_emb, fp32, inv_freq precomputed."""
    import torch

    x, pos, d, theta = t["x"], t["pos"], t["head_dim"], float(t["theta"])
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))

    def fn():
        freqs = pos[:, None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    return fn


def atol_for(expected, inputs):
    """An angle is off by up to ~5e-4 rad in fp32 at position 4096 (what HF computes), and that
    moves an output by the angle error times the norm of its rotated pair: atol scales with it."""
    y = expected["y"]
    half = y.shape[-1] // 2
    with np.errstate(invalid="ignore", over="ignore"):
        pair = np.sqrt(y[..., :half] ** 2 + y[..., half:] ** 2)
    pair = np.nan_to_num(np.concatenate([pair, pair], axis=-1), nan=0.0, posinf=0.0)
    return {"y": 1e-5 + 1e-3 * pair}


def roofline(shape):
    n = shape["tokens"] * shape["heads"] * shape["head_dim"]
    return Roofline(bytes=4.0 * 2 * n + 8.0 * shape["tokens"], flops=3.0 * n)  # 2 mul + 1 add each



PROBLEM = Problem(
    name="rope",
    family="rope",
    version=2,
    description="Rotary position embedding (rotate-half, HF Llama) of tokens x heads x head_dim "
                "fp32 activations at int64 positions; head_dim is even, positions are in "
                f"[0, {MAX_POS}), theta is an argument ({THETA_RANGE[0]:g} .. {THETA_RANGE[1]:g}).",
    args=(Arg("x", "in"), Arg("pos", "in", "int64"), Arg("y", "out"), Arg("tokens", "int"),
          Arg("heads", "int"), Arg("head_dim", "int"), Arg("theta", "float")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["tokens"], s["heads"], s["head_dim"])},
    reference=reference,
    baselines={"hf_llama_eager": baseline_hf, **engine_baseline("rope")},
    eager=baseline_hf,
    shape_constraint=lambda s: s["head_dim"] % 2 == 0,
    tolerance=Tolerance(1e-4, 1e-5, "an fp32 angle pos * inv_freq (what HF Llama computes) is off "
                                    "by up to ~2 * pos * 2^-24 = 5e-4 rad at pos 4096, which moves "
                                    "an output by that times |(x_i, x_i+half)|, even where the "
                                    "rotated value is near 0: atol is 1e-5 + 1e-3 * that norm"),
    atol_for=atol_for,
    param_ranges={"theta": THETA_RANGE},
    workload=({"tokens": 1, "heads": HEADS, "head_dim": HEAD_DIM},
              {"tokens": 1, "heads": KV_HEADS, "head_dim": HEAD_DIM},
              {"tokens": 8, "heads": HEADS, "head_dim": HEAD_DIM},
              {"tokens": 128, "heads": HEADS, "head_dim": HEAD_DIM},
              {"tokens": 128, "heads": KV_HEADS, "head_dim": HEAD_DIM}),
    edge_shapes=({"tokens": 3, "heads": 2, "head_dim": 34}, {"tokens": 1, "heads": 1, "head_dim": 2},
                 {"tokens": 2, "heads": 1, "head_dim": 6}, {"tokens": 5, "heads": 3, "head_dim": 10},
                 {"tokens": 7, "heads": 5, "head_dim": 66}, {"tokens": 2, "heads": 9, "head_dim": 64},
                 {"tokens": 3, "heads": 2, "head_dim": 130}, {"tokens": 37, "heads": 3, "head_dim": 600},
                 {"tokens": 1, "heads": 1, "head_dim": 64}, {"tokens": 2, "heads": 1, "head_dim": 256}),
    stress_shapes=({"tokens": 512, "heads": HEADS, "head_dim": HEAD_DIM},
                   {"tokens": 3, "heads": 2, "head_dim": 4096}),
    model_shapes=models.rope_sample(),
    model_draws=models.rope_draws(),
    dists=("normal", "uniform", "tiny", "large", "alternating", "special"),
    roofline=roofline,
    template=(Path(__file__).with_name("rope.c.j2")).read_text(),
    knobs={"vw": [1, 4, 8, 16], "block": [16, 64, 256], "share": ["token", "none"],
           "angle": ["f32", "f64"], "trig": ["poly", "libm"], "threads": ["none", "omp"]},
    knob_defaults={"vw": 8, "block": 64, "share": "token", "angle": "f32", "trig": "poly",
                   "threads": "none"},
    knob_aspects={"vw": "vectorisation", "block": "blocking", "share": "algorithm",
                  "angle": "algorithm", "trig": "algorithm", "threads": "threading"},
)
