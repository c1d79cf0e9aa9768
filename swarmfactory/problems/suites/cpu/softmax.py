"""Numerically stable row-wise softmax: y = exp(x - max) / sum(exp(x - max))."""

from pathlib import Path

import numpy as np

from swarmfactory.problems import models
from swarmfactory.problems.spec import Arg, Problem, Roofline, Tolerance, gen_values, with_specials

VOCAB = 49152  # SmolLM2-135M
SCORES = 512  # attention-score rows of a 512-token context


def make_inputs(shape, rng, dist):
    rows, cols = shape["rows"], shape["cols"]
    if dist != "special":
        return {"x": gen_values(rng, (rows, cols), dist), "rows": rows, "cols": cols}
    # masked scores: about a tenth of the entries are -inf, never a whole row (the softmax of an
    # all -inf row is undefined); row 0 keeps a single finite entry. Elsewhere NaN (the row's
    # result is NaN: it must not be dropped), -0.0 and denormals.
    x = with_specials(rng, gen_values(rng, (rows, cols), "normal"))
    x[rng.random((rows, cols)) < 0.1] = -np.inf
    x[0, :] = -np.inf
    x[np.arange(rows), rng.integers(0, cols, rows)] = rng.standard_normal(rows).astype(np.float32)
    return {"x": x, "rows": rows, "cols": cols}


def reference(t):
    return {"y": t["x"].double().softmax(dim=-1)}


def baseline_eager(t):
    import torch.nn.functional as F

    x = t["x"]
    return lambda: F.softmax(x, dim=-1)


def eager_by_hand(t):
    x = t["x"]

    def fn():
        e = (x - x.amax(dim=-1, keepdim=True)).exp()
        return e / e.sum(dim=-1, keepdim=True)

    return fn


def roofline(shape):
    n = shape["rows"] * shape["cols"]
    return Roofline(bytes=4.0 * 2 * n, flops=5.0 * n)  # max, subtract, exp, sum, scale


PROBLEM = Problem(
    name="softmax",
    family="softmax",
    version=2,
    description="Row-wise numerically stable softmax (attention scores, vocabulary logits), fp32.",
    args=(Arg("x", "in"), Arg("y", "out"), Arg("rows", "int"), Arg("cols", "int")),
    make_inputs=make_inputs,
    output_shapes=lambda s: {"y": (s["rows"], s["cols"])},
    reference=reference,
    baselines={"F.softmax": baseline_eager},
    eager=eager_by_hand,
    tolerance=Tolerance(5e-5, 1e-7, "outputs are in [0, 1] with no cancellation; fp32 exp costs "
                                    "~2 ulp, and a sum of 5e4-2e5 near-equal positive terms drifts: "
                                    "torch's own fp32 softmax is off by up to 2.7e-5 relative on "
                                    "196,608-wide rows; atol only absorbs exp underflow near 1e-38"),
    workload=({"rows": 9, "cols": SCORES}, {"rows": 72, "cols": SCORES},
              {"rows": 1, "cols": VOCAB}, {"rows": 8, "cols": VOCAB}),
    # the first edge shape is the one check_problem probes: softmax of a 1-wide row is constant
    edge_shapes=({"rows": 3, "cols": 17}, {"rows": 1, "cols": 1}, {"rows": 1, "cols": 7},
                 {"rows": 5, "cols": 31}, {"rows": 2, "cols": 577}, {"rows": 13, "cols": 33},
                 {"rows": 1, "cols": 16411}, {"rows": 3, "cols": 50021}, {"rows": 2, "cols": 1023},
                 {"rows": 1, "cols": 257}),
    stress_shapes=({"rows": 2, "cols": 65536}, {"rows": 1, "cols": 4 * VOCAB}, {"rows": 288, "cols": SCORES}),
    # vocabularies (logits, a few rows) and attention scores (context widths, rows of heads)
    model_shapes=models.unique(models.rows_cols(models.VOCAB, (1, 2, 3)),  # one row where a vocabulary is > 1 MB
                               models.rows_cols(models.CONTEXTS, models.BATCHES + models.HEADS)),
    model_draws=models.rows_cols_draws(lambda i, m: ((m.vocab, 1),
                                                     (models.CONTEXTS[i % len(models.CONTEXTS)], m.heads))),
    dists=("normal", "uniform", "large", "tiny", "special"),
    roofline=roofline,
    template=(Path(__file__).with_name("softmax.c.j2")).read_text(),
    knobs={"vw": [1, 4, 8, 16], "acc": [1, 2, 4], "algo": ["two_pass", "three_pass", "online"],
           "exp": ["poly", "libm"], "threads": ["none", "rows", "split"]},
    knob_defaults={"vw": 8, "acc": 2, "algo": "two_pass", "exp": "poly", "threads": "none"},
    knob_aspects={"vw": "vectorisation", "acc": "unrolling", "algo": "algorithm",
                  "exp": "algorithm", "threads": "threading"},
)
