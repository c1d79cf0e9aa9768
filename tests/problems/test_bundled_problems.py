"""Every bundled problem: its default kernel, a sample of its design space and its baselines
agree with its reference, compiled with real gcc and called through ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import random

import numpy as np
import pytest

from swarmfactory.problems import list_problems, load_problem
from swarmfactory.problems.spec import lower_precision, to_torch
from swarmfactory.problems.suites.cpu import NAMES

ASPECTS = {"vectorisation", "unrolling", "blocking", "threading", "algorithm"}


@pytest.fixture(scope="module", autouse=True)
def three_omp_threads():
    """An odd thread count for the kernels' OpenMP runtime, whatever the machine, so row splits,
    sequence splits and uneven chunks run even on one core."""
    lib = ctypes.util.find_library("gomp")
    if lib is None:
        yield
        return
    gomp = ctypes.CDLL(lib)
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(3)
    yield
    gomp.omp_set_num_threads(before)


def knob_sample(problem, n_random: int = 5) -> list[dict]:
    """Each knob's every value with the others at default, then seeded random valid combos."""
    out: list[dict] = []
    for knob, values in problem.knobs.items():
        for v in values:
            combo = {**problem.knob_defaults, knob: v}
            if v != problem.knob_defaults[knob] and problem.valid_knobs(combo):
                out.append(combo)
    rng = random.Random(f"knobs-{problem.name}")
    tries = 0
    while n_random and tries < 1000:
        tries += 1
        combo = {k: rng.choice(list(v)) for k, v in problem.knobs.items()}
        if problem.valid_knobs(combo) and combo not in out and combo != dict(problem.knob_defaults):
            out.append(combo)
            n_random -= 1
    return out


def tail_cases(problem):
    """Every edge shape under the first distribution, and every distribution on the last two
    (longest, most tail-heavy) edge shapes."""
    cases = problem.seed_cases()
    first = {}
    for c in cases:
        if c.origin == "seed" and c.dist == problem.dists[0]:
            first.setdefault(problem.shape_label(c.shape), c)
    tails = [dict(s) for s in problem.edge_shapes[-2:]]
    extra = [c for c in cases if c.origin == "seed" and dict(c.shape) in tails
             and c.dist != problem.dists[0]]
    return list(first.values()) + extra


def test_every_bundled_problem_is_listed():
    assert set(NAMES) <= set(list_problems())


@pytest.mark.parametrize("name", NAMES)
def test_problem_is_well_formed(name):
    p = load_problem(name)
    assert p.template is not None and p.roofline is not None
    assert set(p.knob_aspects) == set(p.knobs) and set(p.knob_aspects.values()) <= ASPECTS
    assert all(len(v) >= 2 for v in p.knobs.values()), "every knob needs a choice"
    assert p.valid_knobs(p.knob_defaults)
    assert p.tolerance.reason and p.tolerance.rtol <= 1e-4
    assert f"{p.name}(" in p.c_signature and p.render().count(p.c_signature) == 1
    for shape in p.workload:
        r = p.roofline(shape)
        assert r.bytes > 0 and r.flops > 0
    assert len(p.edge_shapes) >= 5 and p.dists[0] == "normal"


@pytest.mark.parametrize("name", NAMES)
def test_default_kernel_matches_reference_on_every_seed_case(name, compiler, case_data, kernel_call,
                                                             assert_close):
    p = load_problem(name)
    fn = compiler.load(p, p.render())
    for case in p.seed_cases():
        inputs, ref = case_data.get(p, case)
        before = {k: np.copy(v) for k, v in inputs.items() if isinstance(v, np.ndarray)}
        got = kernel_call(p, fn, inputs, case.shape)
        assert_close(p, got, ref, f"{name} default {p.shape_label(case.shape)} {case.dist} seed={case.seed}",
                     inputs)
        for k, v in before.items():
            assert np.array_equal(v, inputs[k], equal_nan=True), f"{name} wrote its input {k}"


@pytest.mark.parametrize("name", NAMES)
def test_sampled_knob_combinations_match_reference_on_tail_cases(name, compiler, case_data,
                                                                 kernel_call, assert_close):
    p = load_problem(name)
    combos = knob_sample(p)
    sources = [p.render(c) for c in combos]
    compiler.build_many(sources)
    cases = tail_cases(p)
    for combo, src in zip(combos, sources):
        fn = compiler.load(p, src)
        for case in cases:
            inputs, ref = case_data.get(p, case)
            got = kernel_call(p, fn, inputs, case.shape)
            assert_close(p, got, ref, f"{name} {combo} {p.shape_label(case.shape)} {case.dist}", inputs)


@pytest.mark.parametrize("name", NAMES)
def test_baselines_match_reference_on_workload(name, assert_close):
    p = load_problem(name)
    assert p.baselines
    for i, shape in enumerate(p.workload):
        inputs = p.make_inputs(shape, np.random.default_rng(100 + i), "normal")
        ref = p.reference(to_torch(inputs))
        for bname, setup in p.baselines.items():
            out = setup(to_torch(inputs))()
            outs = out if isinstance(out, (tuple, list)) else (out,)
            got = {a.name: o.detach().numpy() for a, o in zip(p.outputs, outs)}
            if lower_precision(bname):  # a lower-precision competitor: within its precision's tolerance
                # bf16: 8 bits of mantissa; int8 activations (the engine's qnative): each block's
                # rounding, up to 0.025 on these O(1) outputs (measured on q8_0_matmul's workload)
                atol = 5e-2 if bname.endswith("_int8") else 2e-2
                for k, v in ref.items():
                    np.testing.assert_allclose(got[k], v.double().numpy(), rtol=1.6e-2, atol=atol)
                continue
            assert_close(p, got, ref, f"{name} baseline {bname} {p.shape_label(shape)}", inputs)


@pytest.mark.parametrize("name", NAMES)
def test_eager_composition_matches_reference_on_workload(name, assert_close):
    p = load_problem(name)
    if p.eager is None:
        pytest.skip(f"{name} times its reference as the eager composition")
    for i, shape in enumerate(p.workload):
        inputs = p.make_inputs(shape, np.random.default_rng(200 + i), "normal")
        out = p.eager(to_torch(inputs))()
        outs = out if isinstance(out, (tuple, list)) else (out,)
        got = {a.name: o.detach().numpy() for a, o in zip(p.outputs, outs)}
        assert_close(p, got, p.reference(to_torch(inputs)), f"{name} eager {p.shape_label(shape)}", inputs)


@pytest.mark.parametrize("name", NAMES)
def test_every_bundled_shape_is_valid_for_its_problem(name):
    p = load_problem(name)
    for shape in (*p.edge_shapes, *p.stress_shapes, *p.workload):
        assert p.valid_shape(shape), f"{name}: {dict(shape)} breaks its own shape constraint"


@pytest.mark.parametrize("name", NAMES)
def test_every_seed_case_has_inputs_the_reference_accepts(name, case_data):
    p = load_problem(name)
    for case in p.seed_cases():
        _, ref = case_data.get(p, case)
        for k, r in ref.items():
            assert tuple(r.shape) == p.output_shapes(case.shape)[k]
            if case.dist != "special":  # special-valued inputs carry NaN on purpose
                assert not r.isnan().any(), f"{name}: reference NaN on {case.key()}"


@pytest.mark.parametrize("name", NAMES)
def test_fp32_baselines_pass_every_seed_case_they_run_on(name, case_data, assert_close):
    """A tolerance must admit torch's own fp32 result, on every case, not only the workload."""
    p = load_problem(name)
    for case in p.seed_cases():
        inputs, ref = case_data.get(p, case)
        for bname, setup in p.baselines.items():
            if lower_precision(bname):
                continue
            try:
                out = setup(to_torch(inputs))()
            except RuntimeError:  # e.g. torch's int4 kernel needs n % 16 == 0
                continue
            outs = out if isinstance(out, (tuple, list)) else (out,)
            got = {a.name: o.detach().float().numpy() for a, o in zip(p.outputs, outs)}
            assert_close(p, got, ref, f"{name} baseline {bname} {case.key()}", inputs)


@pytest.mark.parametrize("name", NAMES)
def test_no_trivial_output_passes_any_seed_case(name):
    """Every case must be able to fail: zeros, a constant, an input passed through or the answer
    shifted by one element is wrong under the case's tolerance (or is the fp32 answer itself)."""
    from swarmfactory.harness.verify import CASES, FP32_FLOOR, _close, trivial_outputs

    p = load_problem(name)
    for case in p.seed_cases():
        data = CASES.get(p, case)
        for out, exp in data.expected.items():
            for label, triv in trivial_outputs(exp, data.inputs).items():
                if _close(exp, triv, p.tolerance.rtol, data.atol[out]).all():
                    gap = np.nanmax(np.abs(triv - exp)[np.isfinite(exp)], initial=0.0)
                    assert gap <= 2 * FP32_FLOOR + p.tolerance.rtol * np.nanmax(np.abs(exp)), \
                        f"{name} {case.key()}: {label} passes"


@pytest.mark.parametrize("name", NAMES)
def test_every_seed_case_is_bounded_by_torchs_own_fp32_error(name):
    """Torch's fp32 answer runs on every seed case and bounds every output that has a finite
    value, except where the inputs repeat one magnitude (the fixed tolerance alone judges those)."""
    from swarmfactory.harness.accuracy import fp32_torch_path, repeated_input
    from swarmfactory.harness.verify import CASES

    p = load_problem(name)
    assert fp32_torch_path(p) is not None
    bounded = 0
    for case in p.seed_cases():
        data = CASES.get(p, case)
        if repeated_input(data.inputs):
            assert not data.torch_error
            continue
        for out, exp in data.expected.items():
            if np.isfinite(exp).any():
                assert out in data.torch_error, f"{name} {case.key()}: no torch error for {out}"
                bounded += 1
    assert bounded
