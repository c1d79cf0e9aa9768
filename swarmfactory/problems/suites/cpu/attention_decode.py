"""Decode-step attention: one query token per sequence against its KV cache, grouped-query."""

from pathlib import Path

import numpy as np

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, with_specials
from swarmfactory.problems.suites.cpu.engine_yardstick import engine_baseline

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M


def make_inputs(shape, rng, dist):
    b, h, kvh, s, d = (shape[n] for n in ("batch", "heads", "kv_heads", "seq", "head_dim"))
    base = dist if dist in ("normal", "uniform", "tiny") else "normal"
    q = gen_values(rng, (b, h, d), base)
    k = gen_values(rng, (b, kvh, s, d), base)
    v = gen_values(rng, (b, kvh, s, d), base)
    # models scale by 1/sqrt(head_dim) or by a configured factor (Gemma, muP): an argument
    scale = float(np.float32(rng.uniform(0.5, 2.0) / np.sqrt(d)))
    if dist == "special":  # NaN in keys and values (it must reach the outputs), -0.0, denormals;
        # no NaN in q: torch's own SDPA returns 0 there, so no reference a user has defines it
        q = with_specials(rng, q, ("negzero", "denormal"), fraction=0.002)
        k, v = with_specials(rng, k, fraction=0.002), with_specials(rng, v, fraction=0.002)
    if dist == "large":  # peaked softmax: scores spread over about +-50
        q *= np.float32(8.0)
    elif dist == "shifted":  # every score near +150: exp without the max subtracted overflows
        k[..., 0] = 1.0 + 1e-3 * rng.standard_normal((b, kvh, s)).astype(np.float32)
        q[..., 0] = np.float32(150.0 / scale)
    return {"q": q, "k": k, "v": v, "batch": b, "heads": h, "kv_heads": kvh, "seq": s,
            "head_dim": d, "scale": scale}


def reference(t):
    import torch

    b, h, kvh, d = t["batch"], t["heads"], t["kv_heads"], t["head_dim"]
    q = t["q"].double().view(b, kvh, h // kvh, d)
    p = (torch.einsum("bcgd,bcsd->bcgs", q, t["k"].double()) * t["scale"]).softmax(dim=-1)
    return {"out": torch.einsum("bcgs,bcsd->bcgd", p, t["v"].double()).reshape(b, h, d)}


def baseline_sdpa(t):
    import torch.nn.functional as F

    q, k, v, b, h, d = t["q"], t["k"], t["v"], t["batch"], t["heads"], t["head_dim"]
    q4, scale = q.view(b, h, 1, d), t["scale"]
    return lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True).view(b, h, d)


def baseline_grouped_matmul(t):
    """The query heads of a kv head as one matrix: two batched matmuls and a softmax."""
    q, k, v, b, h, kvh, d = (t[n] for n in ("q", "k", "v", "batch", "heads", "kv_heads", "head_dim"))
    qg, kt, scale = q.view(b, kvh, h // kvh, d), k.transpose(-1, -2), t["scale"]
    return lambda: ((qg @ kt) * scale).softmax(dim=-1).matmul(v).view(b, h, d)


def eager_by_hand(t):
    """Textbook attention: kv heads repeated to the query heads on every call."""
    import torch

    q, k, v, b, h, kvh, d = (t[n] for n in ("q", "k", "v", "batch", "heads", "kv_heads", "head_dim"))
    q4, scale = q.view(b, h, 1, d), t["scale"]

    def fn():
        kr, vr = k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)
        p = torch.softmax((q4 @ kr.transpose(-1, -2)) * scale, dim=-1)
        return (p @ vr).view(b, h, d)

    return fn


def roofline(shape):
    b, h, kvh, s, d = (shape[n] for n in ("batch", "heads", "kv_heads", "seq", "head_dim"))
    return Roofline(bytes=4.0 * (2 * b * kvh * s * d + 2 * b * h * d),
                    flops=4.0 * b * h * s * d + 5.0 * b * h * s)



PROBLEM = Problem(
    name="attention_decode",
    family="attention",
    version=2,
    description="Single-token decode attention over a KV cache with grouped-query heads "
                "(heads a multiple of kv_heads), no mask, fp32; the score scale is an argument.",
    args=(Arg("q", "in"), Arg("k", "in"), Arg("v", "in"), Arg("out", "out"), Arg("batch", "int"),
          Arg("heads", "int"), Arg("kv_heads", "int"), Arg("seq", "int"), Arg("head_dim", "int"),
          Arg("scale", "float")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"out": (s["batch"], s["heads"], s["head_dim"])},
    reference=reference,
    baselines={"sdpa_gqa": baseline_sdpa, "grouped_matmul": baseline_grouped_matmul,
               **engine_baseline("attention")},
    eager=eager_by_hand,
    # q.k over head_dim and p.v over seq, fp32, in any order: the bound from torch's own error
    # allows ~sqrt(longest) half-ulps for it (harness/verify.py)
    fp32_sum_terms=lambda inputs: max(int(inputs["seq"]), int(inputs["head_dim"])),
    shape_constraint=lambda s: s["heads"] % s["kv_heads"] == 0,
    tolerance=Tolerance(1e-4, 1e-4, "two reordered fp32 reductions (q.k over head_dim, p.v over "
                                    "up to ~1e3 keys) and an fp32 exp; scores near 150 carry "
                                    "~1e-5 absolute rounding into the weights"),
    workload=tuple({"batch": b, "heads": HEADS, "kv_heads": KV_HEADS, "seq": s, "head_dim": HEAD_DIM}
                   for b in (1, 8) for s in (128, 1024)),
    edge_shapes=tuple(dict(zip(("batch", "heads", "kv_heads", "seq", "head_dim"), v)) for v in (
        (2, 4, 2, 7, 3), (1, 1, 1, 1, 1), (1, 2, 1, 5, 8), (1, 9, 3, 17, 64), (3, 6, 1, 33, 17),
        (2, 3, 3, 300, 36), (1, 4, 1, 777, 32), (1, 8, 2, 1000, 128), (1, 9, 3, 1031, 64),
        (1, 2, 2, 1, 64), (1, 4, 4, 63, 65))),
    stress_shapes=tuple(dict(zip(("batch", "heads", "kv_heads", "seq", "head_dim"), v)) for v in (
        (1, HEADS, KV_HEADS, 4096, HEAD_DIM), (32, HEADS, KV_HEADS, 128, HEAD_DIM), (2, 8, 1, 511, 256))),
    param_ranges={"scale": (0.01, 2.0)},
    model_shapes=models.attention_sample(),
    model_draws=models.attention_draws(),
    dists=("normal", "uniform", "tiny", "large", "shifted", "special"),
    roofline=roofline,
    template=(Path(__file__).with_name("attention_decode.c.j2")).read_text(),
    knobs={"vw": [1, 4, 8, 16], "algo": ["online", "two_pass"], "group": ["shared", "per_head"],
           "kblock": [16, 64, 256], "exp": ["poly", "libm"], "threads": ["none", "heads", "split"]},
    knob_defaults={"vw": 8, "algo": "online", "group": "shared", "kblock": 64, "exp": "poly",
                   "threads": "none"},
    knob_aspects={"vw": "vectorisation", "algo": "algorithm", "group": "blocking",
                  "kblock": "blocking", "exp": "algorithm", "threads": "threading"},
    # two_pass scores all keys at once: the key block size would only rename the same kernel
    knob_constraint=lambda k: k["algo"] == "online" or k["kblock"] == 64,
)
