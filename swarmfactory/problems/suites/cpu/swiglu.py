"""SwiGLU activation of the Llama MLP: y = silu(gate) * up = gate * sigmoid(gate) * up."""

from pathlib import Path

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, with_specials
from swarmfactory.problems.suites.cpu.engine_yardstick import engine_baseline

INTERMEDIATE = 1536  # SmolLM2-135M


def make_inputs(shape, rng, dist):
    n = shape["n"]
    if dist == "special":  # NaN, -0.0 and denormals in both (silu(-inf) is undefined: no inf)
        return {"gate": with_specials(rng, gen_values(rng, (n,), "normal")),
                "up": with_specials(rng, gen_values(rng, (n,), "normal")), "n": n}
    return {"gate": gen_values(rng, (n,), dist), "up": gen_values(rng, (n,), dist), "n": n}


def reference(t):
    g, u = t["gate"].double(), t["up"].double()
    return {"y": g * g.sigmoid() * u}


def baseline_eager(t):
    import torch.nn.functional as F

    g, u = t["gate"], t["up"]
    return lambda: F.silu(g) * u


def eager_by_hand(t):
    import torch

    g, u = t["gate"], t["up"]
    return lambda: g * torch.sigmoid(g) * u


def roofline(shape):
    n = shape["n"]
    return Roofline(bytes=4.0 * 3 * n, flops=5.0 * n)  # negate, exp, add, divide, multiply



PROBLEM = Problem(
    name="swiglu",
    family="gated_activation",
    version=2,
    description="SiLU-gated product silu(gate) * up over a flat fp32 vector (Llama MLP activation).",
    args=(Arg("gate", "in"), Arg("up", "in"), Arg("y", "out"), Arg("n", "int")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["n"],)},
    reference=reference,
    baselines={"F.silu*up": baseline_eager, **engine_baseline("gated", "silu")},
    eager=eager_by_hand,
    tolerance=Tolerance(1e-5, 1e-30, "elementwise with no cancellation: fp32 exp (~2 ulp), the "
                                     "divide and two products stay within ~1e-6 relative; atol "
                                     "only absorbs results that underflow (|gate| ~ 1e4)"),
    workload=({"n": INTERMEDIATE}, {"n": 8 * INTERMEDIATE}, {"n": 128 * INTERMEDIATE}),
    edge_shapes=({"n": 17}, {"n": 1}, {"n": 7}, {"n": 31}, {"n": 577}, {"n": 4099},
                 {"n": 65537}, {"n": 1023}, {"n": 257}),
    stress_shapes=({"n": 4 * 128 * INTERMEDIATE}, {"n": 1 << 16}),
    model_shapes=tuple({"n": n} for n in models.INTERMEDIATE),
    model_draws=models.flat_draws(lambda m: m.intermediate),
    dists=("normal", "uniform", "large", "tiny", "alternating", "special"),
    roofline=roofline,
    template=(Path(__file__).with_name("swiglu.c.j2")).read_text(),
    knobs={"vw": [1, 4, 8, 16], "unroll": [1, 2, 4], "form": ["div", "stable"],
           "exp": ["poly", "libm"], "threads": ["none", "omp"]},
    knob_defaults={"vw": 8, "unroll": 2, "form": "div", "exp": "poly", "threads": "none"},
    knob_aspects={"vw": "vectorisation", "unroll": "unrolling", "form": "algorithm",
                  "exp": "algorithm", "threads": "threading"},
)
