"""KDA forward (Kimi Delta Attention, the gated delta rule with per-channel decay of Kimi Linear),
fp32 on the GPU. The problem is the output of the chunked forward (fla's ``chunk_kda``); a kernel
may compute it chunk-wise or recurrently. Per batch b and head h, with state S in R^{K x V}:

    S_t = diag(exp(g_t)) S_{t-1}                  (per-channel decay, g_t <= 0, along K)
    S_t = S_t + beta_t k_t (v_t - S_t^T k_t)^T     (the delta rule)
    o_t = scale * S_t^T q_t                         (S_0 = 0, scale = K^-1/2)

Layouts: q, k, g [B, T, H, K]; v, o [B, T, H, V]; beta [B, T, H]. k is L2-normalised per head
(as the model does before the kernel: `use_qk_l2norm`), beta in (0, 1), so the update contracts.
"""

from pathlib import Path

import numpy as np

from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values


def _dims(s):
    return s["batch"], s["seq"], s["heads"], s["dk"], s["dv"]


def make_inputs(shape, rng, dist):
    b, t, h, dk, dv = _dims(shape)
    k = rng.standard_normal((b, t, h, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True) + 1e-6
    return {"q": gen_values(rng, (b, t, h, dk), dist), "k": k.astype(np.float32),
            "v": gen_values(rng, (b, t, h, dv), dist),
            "g": (-rng.uniform(0.0, 1.0, (b, t, h, dk)) ** 2).astype(np.float32),
            "beta": rng.uniform(0.05, 0.95, (b, t, h)).astype(np.float32),
            "batch": b, "seq": t, "heads": h, "dk": dk, "dv": dv, "scale": float(np.float32(dk ** -0.5))}


def reference(t):
    import torch

    q, k, v, g, beta = (t[n].double() for n in ("q", "k", "v", "g", "beta"))
    b, T, h, dk = q.shape
    dv = v.shape[-1]
    S = torch.zeros(b, h, dk, dv, dtype=torch.float64)
    o = torch.empty(b, T, h, dv, dtype=torch.float64)
    for i in range(T):
        S = S * g[:, i].exp().unsqueeze(-1)
        kt, vt = k[:, i], v[:, i]
        pred = torch.einsum("bhk,bhkv->bhv", kt, S)
        S = S + torch.einsum("bhk,bhv->bhkv", kt, (vt - pred) * beta[:, i].unsqueeze(-1))
        o[:, i] = torch.einsum("bhk,bhkv->bhv", q[:, i], S) * t["scale"]
    return {"o": o}


def atol_for(expected, inputs):
    scale = 1.0
    for n in ("q", "v"):
        a = np.abs(inputs[n][np.isfinite(inputs[n])])
        scale *= max(1.0, float(a.max()) if a.size else 1.0)
    return {"o": 2e-5 * scale}


def fla_chunk(t):
    from swarmfactory.problems.suites.gpu.common import need

    mod = need("fla.ops.kda", "flash-linear-attention")
    q, k, v, g, beta, scale = (t[n] for n in ("q", "k", "v", "g", "beta", "scale"))
    return lambda: mod.chunk_kda(q=q, k=k, v=v, g=g, beta=beta, scale=scale)[0]


def eager(t):
    """Token by token in PyTorch: the plain composition (no chunking)."""
    import torch

    q, k, v, g, beta, scale = (t[n] for n in ("q", "k", "v", "g", "beta", "scale"))

    def run():
        b, T, h, dk = q.shape
        S = torch.zeros(b, h, dk, v.shape[-1], dtype=q.dtype, device=q.device)
        out = torch.empty_like(v)
        for i in range(T):
            S = S * g[:, i].exp().unsqueeze(-1)
            pred = torch.einsum("bhk,bhkv->bhv", k[:, i], S)
            S = S + torch.einsum("bhk,bhv->bhkv", k[:, i], (v[:, i] - pred) * beta[:, i].unsqueeze(-1))
            out[:, i] = torch.einsum("bhk,bhkv->bhv", q[:, i], S) * scale
        return out
    return run


PROBLEM = Problem(
    name="gpu_kda",
    version=1,
    description="Kimi Delta Attention forward: gated delta rule with per-channel (per key dim) decay, fp32.",
    args=(Arg("q", "in"), Arg("k", "in"), Arg("v", "in"), Arg("g", "in"), Arg("beta", "in"), Arg("o", "out"),
          Arg("batch", "int"), Arg("seq", "int"), Arg("heads", "int"), Arg("dk", "int"), Arg("dv", "int"),
          Arg("scale", "float")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"o": (s["batch"], s["seq"], s["heads"], s["dv"])},
    reference=reference,
    baselines={"flash-linear-attention (chunk_kda)": fla_chunk},
    eager=eager,
    tolerance=Tolerance(1e-3, 1e-5, "a chunked form reassociates the recurrence (WY/UT transforms "
                                    "and a triangular solve per chunk) in fp32"),
    atol_for=atol_for,
    workload=({"batch": 1, "seq": 4096, "heads": 32, "dk": 128, "dv": 128},
              {"batch": 8, "seq": 1024, "heads": 32, "dk": 128, "dv": 128}),
    edge_shapes=({"batch": 1, "seq": 1, "heads": 1, "dk": 4, "dv": 4},
                 {"batch": 2, "seq": 9, "heads": 2, "dk": 8, "dv": 16},
                 {"batch": 1, "seq": 70, "heads": 1, "dk": 16, "dv": 8}),
    interpret_shapes=({"batch": 1, "seq": 1, "heads": 1, "dk": 4, "dv": 4},
                      {"batch": 2, "seq": 9, "heads": 2, "dk": 8, "dv": 16},
                      {"batch": 1, "seq": 70, "heads": 1, "dk": 16, "dv": 8}),
    shapes_from="Kimi-Linear-48B-A3B (KDA layers: 32 heads, head_dim 128); prefill 1x4096 and 8x1024 tokens",
    dists=("normal", "uniform", "tiny"),
    roofline=lambda s: Roofline(bytes=4.0 * s["batch"] * s["seq"] * s["heads"] * (3 * s["dk"] + 2 * s["dv"] + 1),
                                flops=8.0 * s["batch"] * s["seq"] * s["heads"] * s["dk"] * s["dv"]),
    backend="triton",
    template=(Path(__file__).with_name("gpu_kda.py.j2")).read_text(),
    knobs={"BLOCK_V": [8, 16, 32, 64, 128], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2, 3]},
    knob_defaults={"BLOCK_V": 16, "num_warps": 4, "num_stages": 1},
    knob_aspects={"BLOCK_V": "blocking", "num_warps": "threading", "num_stages": "unrolling"},
)
