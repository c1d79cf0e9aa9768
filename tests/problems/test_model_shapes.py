"""Validation cases from real models (problems/models.py): every bundled CPU problem's fixed sample
holds every catalogue value of each of its dimensions, its shapes are valid and cheap, and the
full-size drawn cases cycle over the whole catalogue without changing the validation version."""

from __future__ import annotations

import json

import numpy as np
import pytest

from swarmfactory.problems import load_problem, models
from swarmfactory.problems.models import MODELS
from swarmfactory.problems.spec import MODEL_CASES_PER_DRAW
from swarmfactory.problems.suites.cpu import NAMES
from swarmfactory.validation import drawn_evidence, validation_set

BATCHES = set(range(1, 65))
NORM_COLS = set(models.HIDDEN)
MATMUL = {"k": set(models.HIDDEN) | set(models.INTERMEDIATE) | set(models.Q_WIDTH),
          "n": set(models.HIDDEN) | set(models.INTERMEDIATE) | set(models.QKV_WIDTH) | set(models.KV_WIDTH),
          "batch": BATCHES}

# per problem: each dimension (or a tuple of dimensions read together) -> the values the fixed
# sample must hold, at least once each
REQUIRED = {
    "rmsnorm": {"cols": NORM_COLS | set(models.HEAD_DIM), "rows": BATCHES},
    "add_rmsnorm": {"cols": NORM_COLS, "rows": BATCHES},
    "layernorm": {"cols": NORM_COLS, "rows": BATCHES},
    "softmax": {"cols": set(models.VOCAB) | set(models.CONTEXTS), "rows": BATCHES | set(models.HEADS)},
    "swiglu": {"n": set(models.INTERMEDIATE)},
    "geglu": {"n": set(models.INTERMEDIATE)},
    "rope": {"head_dim": set(models.HEAD_DIM), "heads": set(models.HEADS) | set(models.KV_HEADS),
             "tokens": BATCHES},
    "attention_decode": {("heads", "kv_heads"): set(models.ATTENTION_HEADS), "head_dim": set(models.HEAD_DIM),
                         "batch": BATCHES},
    "q4_1_matmul": MATMUL,
    "q8_0_matmul": MATMUL,
    "q4_1_packed_matvec": MATMUL,
}


def largest_array(name: str, s) -> int:
    """Elements of the largest array a case of ``name`` at shape ``s`` holds on the trusted side
    (inputs, outputs, the float64 reference and its intermediates: dequantised weights, scores)."""
    if "rows" in s:
        return s["rows"] * s["cols"]
    if name in ("swiglu", "geglu"):
        return s["n"]
    if name == "rope":
        return s["tokens"] * s["heads"] * s["head_dim"]
    if name == "attention_decode":
        b, h, kv, seq, d = (s[k] for k in ("batch", "heads", "kv_heads", "seq", "head_dim"))
        return max(b * kv * seq * d, b * h * seq, b * h * d)
    return max(s["n"] * s["k"], s["batch"] * s["k"], s["batch"] * s["n"])


def test_the_catalogue_holds_the_dimensions_real_models_use():
    assert len({m.name for m in MODELS}) == len(MODELS) >= 40
    for m in MODELS:
        assert m.heads % m.kv_heads == 0 and m.hidden % 32 == 0 and m.intermediate % 32 == 0, m
        assert m.head_dim % 16 == 0, m
    assert {5120, 2048, 8192} <= set(models.HIDDEN)
    assert {11008, 14336} <= set(models.INTERMEDIATE)
    assert {32000, 128256, 151936, 262144} <= set(models.VOCAB)
    assert {64, 80, 96, 112, 128, 256} <= set(models.HEAD_DIM)
    assert 1 in models.GROUPS and any(g > 16 for g in models.GROUPS) and 16 in models.GROUPS
    assert any(m.kv_heads == 1 for m in MODELS)  # multi-query attention
    assert any(v % 65536 and v > 65536 for v in models.VOCAB)


def test_cover_pairs_every_value_of_both_sides_within_the_cap():
    pairs = models.cover([16384, 5120, 64], range(1, 65), lambda c, r: c * r, 1 << 16)
    assert {c for c, _ in pairs} == {16384, 5120, 64} and {r for _, r in pairs} == BATCHES
    assert len(pairs) == 64 and all(c * r <= 1 << 16 for c, r in pairs)


@pytest.mark.parametrize("name", NAMES)
def test_fixed_sample_holds_every_catalogue_value_of_every_dimension(name):
    p = load_problem(name)
    model_cases = [c for c in p.seed_cases() if c.origin == "model"]
    assert [dict(c.shape) for c in model_cases] == [dict(s) for s in p.model_shapes]
    shapes = [dict(s) for s in p.model_shapes]
    for dims, wanted in REQUIRED[name].items():
        have = {tuple(s[d] for d in dims) if isinstance(dims, tuple) else s[dims] for s in shapes}
        missing = sorted(wanted - have)
        assert not missing, f"{name}: the fixed sample lacks {dims} = {missing}"


def caps(name: str) -> tuple[int, int]:
    """The most elements one array of a fixed-sample case and of a drawn case of ``name`` holds:
    where two dimensions meet, the sample's cap; one real value alone may exceed it (a row of
    262208 logits, 53248 elements of a flat activation, a 53248 x 32 weight matrix)."""
    if name in ("q4_1_matmul", "q8_0_matmul", "q4_1_packed_matvec"):
        return max(MATMUL["n"]) * 32, 2 * models.CASE_ELEMENTS  # weights: n x one block of 32
    if name == "attention_decode":
        return 8 * models.SAMPLE_ELEMENTS, models.CASE_ELEMENTS
    if name == "softmax":
        return max(models.VOCAB), models.CASE_ELEMENTS
    if name in ("swiglu", "geglu"):
        return max(models.INTERMEDIATE), models.CASE_ELEMENTS
    return models.SAMPLE_ELEMENTS, models.CASE_ELEMENTS


@pytest.mark.parametrize("name", NAMES)
def test_model_shapes_are_valid_and_cheap(name):
    p = load_problem(name)
    fixed, drawn = caps(name)
    for s in p.model_shapes:
        assert p.valid_shape(s), f"{name}: {dict(s)}"
        assert largest_array(name, s) <= fixed, f"{name}: fixed {dict(s)} is not cheap"
    for label, s in p.model_draws:
        assert p.valid_shape(s) and label, f"{name}: {label} {dict(s)}"
        assert largest_array(name, s) <= drawn, f"{name}: drawn {label} {dict(s)} too large"
    # and the fixed sample stays a fraction of what the rest of the seed cases hold
    rest = sum(largest_array(name, c.shape) for c in p.seed_cases() if c.origin != "model")
    assert sum(largest_array(name, s) for s in p.model_shapes) < rest


@pytest.mark.parametrize("name", NAMES)
def test_the_largest_drawn_case_stays_under_100_mb(name):
    """What the trusted side holds for the largest drawn case: its inputs, the reference and the
    case's tolerance (numpy, traced at their peak, trivial answers included), the reference's
    float64 work in torch (not traced: counted as the largest array in float64, twice), and the
    fp32 outputs read back."""
    import tracemalloc

    from swarmfactory.harness.verify import expected_for

    p = load_problem(name)
    label, shape = max(p.model_draws, key=lambda e: largest_array(name, e[1]))
    tracemalloc.start()
    try:
        inputs = p.make_inputs(dict(shape), np.random.default_rng(0), p.dists[0])
        data = expected_for(p, inputs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    nbytes = peak + 16 * largest_array(name, shape) + sum(4 * v.size for v in data.expected.values())
    assert nbytes < 100e6, f"{name}: {label} {dict(shape)} needs {nbytes / 1e6:.0f} MB"
    assert all(np.isfinite(v).all() for v in data.expected.values())


@pytest.mark.parametrize("name", NAMES)
def test_successive_draws_cover_every_model_shape_then_cycle_the_distributions(name):
    p = load_problem(name)
    k = MODEL_CASES_PER_DRAW
    cycle = p.model_cycle()
    drawn = [c for d in range(cycle) for c in p.model_cases(d)]
    assert {repr(sorted(c.shape.items())) for c in drawn} == \
        {repr(sorted(dict(s).items())) for _, s in p.model_draws}
    assert all(c.origin.startswith("model:") for c in drawn)
    assert len(drawn) == cycle * k >= len(p.model_draws) and len({c.key() for c in drawn}) == len(drawn)
    assert {c.dist for c in drawn[: len(p.model_draws)]} == {p.dists[0]}
    # the next cycle: the same shapes under the next distribution, with seeds of their own
    nxt = [c for d in range(cycle, 2 * cycle) for c in p.model_cases(d)]
    assert {c.dist for c in nxt[k:len(p.model_draws)]} == {p.dists[1]}
    assert not {c.key() for c in nxt} & {c.key() for c in drawn}
    # every model of the catalogue is named by some drawn case
    labels = " ".join(label for label, _ in p.model_draws)
    assert sum(m.name in labels for m in MODELS) >= 0.75 * len(MODELS)
    # draws are deterministic: the same draw gives the same cases
    assert [c.key() for c in p.model_cases(7)] == [c.key() for c in p.model_cases(7)]


@pytest.mark.parametrize("name", ["rmsnorm", "attention_decode", "q4_1_packed_matvec"])
def test_the_validation_version_is_the_same_whatever_the_draw(name):
    p = load_problem(name)
    base, version = validation_set(p)
    for draw in (0, 1, 17, 10_000):
        cases, v = validation_set(p, draw=draw)
        assert v == version
        extra = cases[len(base):]
        assert [c.key() for c in extra] == [c.key() for c in p.model_cases(draw)]
        ev = drawn_evidence(draw, cases)
        assert ev["draw"] == draw and [e["case"] for e in ev["cases"]] == [c.key() for c in extra]


def test_the_fixed_sample_is_part_of_the_validation_version():
    """A problem whose fixed sample changes gets a new validation version; one without model
    shapes keeps the version its evidence was recorded under."""
    import dataclasses
    import hashlib

    p = load_problem("rmsnorm")
    _, version = validation_set(p)
    fewer = dataclasses.replace(p, model_shapes=p.model_shapes[:-1])
    assert validation_set(fewer)[1] != version
    bare = dataclasses.replace(p, model_shapes=(), model_draws=())
    assert validation_set(bare)[1] == hashlib.sha256((p.spec_hash() + "|").encode()).hexdigest()[:12]
    assert bare.spec_hash() == p.spec_hash()  # champions and baselines stay keyed as they were


def test_coordinator_draws_model_cases_per_evaluation_and_records_them(tmp_path):
    """The coordinator adds one draw to each submission, the next for the next, and the verdict's
    evidence names the drawn cases; the validation version it records does not move."""
    from swarmfactory.config import RunConfig
    from swarmfactory.evidence.store import Store
    from swarmfactory.outcome import Outcome, Verdict
    from swarmfactory.swarm.coordinator import Coordinator
    from swarmfactory.swarm.executors import Executor

    class Recording(Executor):
        def __init__(self):
            self.calls = []

        def submit(self, problem, source, cases):
            from concurrent.futures import Future

            self.calls.append(cases)
            f = Future()
            f.set_result(Verdict(Outcome.WRONG, "recorded", "verify"))
            return f

        def shutdown(self, wait=True):
            pass

    store = Store(str(tmp_path / "ev.db"))
    ex = Recording()
    coord = Coordinator(RunConfig.build(problems="rmsnorm", budget=3, parallel=1, compile_baselines=False,
                                        remeasure_champions=False), store, executor=ex)
    coord.run()
    p = load_problem("rmsnorm")
    base, version = validation_set(p)
    assert len(ex.calls) == 3
    for d, cases in enumerate(ex.calls):
        assert [c.key() for c in cases[len(base):]] == [c.key() for c in p.model_cases(d)]
    evs = store.evaluations(problem="rmsnorm")
    assert {e.validation_version for e in evs} == {version}
    assert [e.evidence["model_draw"]["draw"] for e in evs] == [0, 1, 2]


def test_the_fixed_sample_catches_a_planted_bug_the_other_seed_cases_miss(harness):
    """tests/planted/rmsnorm/single_long_row.c drops the partial last chunk of 256 columns of a
    single row of 1024 or more: no edge, stress or workload shape has one (the adversary has to
    find it), the fixed sample's rows of 2880 and 4544 columns do."""
    from pathlib import Path

    p = load_problem("rmsnorm")
    source = (Path(__file__).parents[1] / "planted" / "rmsnorm" / "single_long_row.c").read_text()
    rest = [c for c in p.seed_cases() if c.origin != "model"]
    assert harness.prepare(p, source, rest).rejected is None
    rejected = harness.prepare(p, source).rejected
    assert rejected is not None and rejected.outcome.value == "wrong"
    shape = json.loads(rejected.evidence["case"])["shape"]
    assert shape["rows"] == 1 and shape["cols"] % 256 and shape["cols"] in models.HIDDEN
