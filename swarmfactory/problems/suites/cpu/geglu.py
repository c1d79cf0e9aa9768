"""GeGLU activation of the Gemma MLP: y = gelu_tanh(gate) * up, with GELU's tanh approximation
(`gelu_pytorch_tanh`): gelu_tanh(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))."""

import math
from pathlib import Path

import numpy as np

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, with_specials
from swarmfactory.problems.suites.cpu.engine_yardstick import engine_baseline

INTERMEDIATE, INTERMEDIATE_LARGE = 1536, 8192  # SmolLM2-135M, SmolLM2-1.7B
SQRT_2_OVER_PI, KAPPA = math.sqrt(2.0 / math.pi), 0.044715


def make_inputs(shape, rng, dist):
    n = shape["n"]
    if dist == "special":  # NaN, -0.0 and denormals in both
        return {"gate": with_specials(rng, gen_values(rng, (n,), "normal")),
                "up": with_specials(rng, gen_values(rng, (n,), "normal")), "n": n}
    return {"gate": gen_values(rng, (n,), dist), "up": gen_values(rng, (n,), dist), "n": n}


def reference(t):
    g, u = t["gate"].double(), t["up"].double()
    return {"y": 0.5 * g * (1.0 + (SQRT_2_OVER_PI * (g + KAPPA * g.pow(3))).tanh()) * u}


def atol_for(expected, inputs):
    """1 + tanh(z) cancels for gate < 0: torch's fp32 GELU (and any kernel that computes it that
    way) loses up to ~ulp(1)/2 of it, |gate| ulp(1)/4 of the output; beyond gate ~ -6 tanh rounds
    to -1 and the output to 0, within e^-25 |gate| of the truth. So atol scales with |up| and
    min(|gate|, 8)."""
    g = np.nan_to_num(np.abs(np.asarray(inputs["gate"], dtype=np.float64)), nan=0.0, posinf=0.0)
    u = np.nan_to_num(np.abs(np.asarray(inputs["up"], dtype=np.float64)), nan=0.0, posinf=0.0)
    return {"y": 1e-30 + 1e-7 * u * np.minimum(g, 8.0)}


def baseline_gelu_tanh(t):
    import torch.nn.functional as F

    g, u = t["gate"], t["up"]
    return lambda: F.gelu(g, approximate="tanh") * u


def eager_by_hand(t):
    """HF's NewGELUActivation written out, times up."""
    import torch

    g, u = t["gate"], t["up"]
    return lambda: 0.5 * g * (1.0 + torch.tanh(SQRT_2_OVER_PI * (g + KAPPA * torch.pow(g, 3.0)))) * u


def roofline(shape):
    n = shape["n"]
    return Roofline(bytes=4.0 * 3 * n, flops=9.0 * n)  # cube, polynomial, exp, add, divide, products



PROBLEM = Problem(
    name="geglu",
    family="gated_activation",
    version=1,
    description="GELU-gated product gelu_tanh(gate) * up over a flat fp32 vector (Gemma MLP "
                "activation; GELU's tanh approximation, gelu_pytorch_tanh).",
    args=(Arg("gate", "in"), Arg("up", "in"), Arg("y", "out"), Arg("n", "int")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["n"],)},
    reference=reference,
    baselines={"F.gelu_tanh*up": baseline_gelu_tanh, **engine_baseline("gated", "gelu_tanh")},
    eager=eager_by_hand,
    atol_for=atol_for,
    tolerance=Tolerance(1e-5, 1e-30, "elementwise: the cube, exp or tanh (~2 ulp) and three "
                                     "products stay within ~1e-6 relative, except where 1 + "
                                     "tanh(z) cancels (gate < 0), which costs torch's own fp32 up "
                                     "to ~3e-8 |gate up| absolute: atol 1e-7 |up| min(|gate|, 8)"),
    workload=({"n": INTERMEDIATE}, {"n": 8 * INTERMEDIATE}, {"n": 128 * INTERMEDIATE},
              {"n": INTERMEDIATE_LARGE}),
    edge_shapes=({"n": 17}, {"n": 1}, {"n": 7}, {"n": 31}, {"n": 577}, {"n": 4099},
                 {"n": 65537}, {"n": 1023}, {"n": 257}),
    stress_shapes=({"n": 4 * 128 * INTERMEDIATE}, {"n": 1 << 16}),
    model_shapes=tuple({"n": n} for n in models.INTERMEDIATE),
    model_draws=models.flat_draws(lambda m: m.intermediate),
    dists=("normal", "uniform", "large", "tiny", "alternating", "special"),
    roofline=roofline,
    template=(Path(__file__).with_name("geglu.c.j2")).read_text(),
    knobs={"vw": [1, 4, 8, 16], "unroll": [1, 2, 4], "form": ["div", "stable"],
           "exp": ["poly", "libm"], "threads": ["none", "omp"]},
    knob_defaults={"vw": 8, "unroll": 2, "form": "div", "exp": "poly", "threads": "none"},
    knob_aspects={"vw": "vectorisation", "unroll": "unrolling", "form": "algorithm",
                  "exp": "algorithm", "threads": "threading"},
)
