"""The GGUF block-type matmuls (q4_0, q5_0, q4_k, q5_k, q6_k: problems/suites/cpu/qblock.py): the
reference against gguf's own dequantiser, the template's kernels (default knobs and every other
knob value) against the reference, the engine's kernel as a yardstick, and wrong kernels that
the cases must catch. Compiled with real gcc and called through ctypes (conftest.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import re

import numpy as np
import pytest
import torch

from swarmfactory.problems import Case
from swarmfactory.problems.spec import check_problem, to_torch
from swarmfactory.problems.suites.cpu import BLOCK_NAMES

TYPES = ("q4_0", "q5_0", "q4_k", "q5_k", "q6_k")
OTHER_ALGO = {"dequant": "fused", "fused": "dequant"}


def problem(t: str):
    return importlib.import_module(f"swarmfactory.problems.suites.cpu.{t}_matmul").PROBLEM


def variants(t: str) -> list[dict]:
    """Two settings besides the defaults per type; over the five types (test_every_knob_value_is_
    exercised) every value of every knob runs."""
    p = problem(t)
    i = TYPES.index(t)
    return [{"algo": OTHER_ALGO[p.knob_defaults["algo"]], "vw": (1, 4, 8, 4, 16)[i], "rows": 4, "bb": 4,
             "threads": "omp"},
            {"vw": (4, 8, 1, 16, 8)[i], "rows": 2, "bb": 1, "threads": "none"}]


def cases(p, dists=("normal", "special")) -> list[Case]:
    """Edge shapes: one block, a few blocks, odd n and n past the row tile, batches 1..9."""
    shapes = [p.edge_shapes[i] for i in (0, 1, 2, 3, 6, 8)]
    return [Case(dict(s), seed=70 + i, dist=d) for i, s in enumerate(shapes) for d in dists]


@pytest.fixture(scope="module", autouse=True)
def three_omp_threads():
    """An odd OpenMP thread count whatever the machine, so the row split is uneven."""
    lib = ctypes.util.find_library("gomp")
    if lib is None:
        yield
        return
    gomp = ctypes.CDLL(lib)
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(3)
    yield
    gomp.omp_set_num_threads(before)


def test_the_names_are_the_modules():
    assert BLOCK_NAMES == tuple(f"{t}_matmul" for t in TYPES)
    for t in TYPES:
        assert problem(t).name == f"{t}_matmul"


@pytest.mark.parametrize("t", TYPES)
def test_problem_is_well_formed(t):
    from swarmfactory.backends.cstatic import check_source

    p = problem(t)
    check_problem(p)
    assert p.family == "quantized_matvec" and p.version == 1
    assert set(p.knob_aspects) == set(p.knobs) and all(len(v) >= 2 for v in p.knobs.values())
    assert p.render().count(p.c_signature) == 1
    for shape in (*p.edge_shapes, *p.stress_shapes, *p.workload, *p.model_shapes,
                  *(s for _, s in p.model_draws)):
        assert p.valid_shape(shape), f"{t}: {dict(shape)} breaks its own shape constraint"
    assert not p.valid_shape({"n": 4, "k": 16, "batch": 1})
    assert list(p.baselines) == ["dequant_F.linear", "engine_qnative_int8"]
    for knobs in [{}, *variants(t)]:
        assert check_source(p.render(knobs)) is None


@pytest.mark.parametrize("t", TYPES)
def test_rendered_sources_pass_the_c_backends_checks(t):
    """What the harness asks of a candidate's build: the source, the preprocessed source and the
    assembly checks (no threads but OpenMP, no system calls, timers or inline assembly) and no
    code run while the library loads."""
    from swarmfactory.backends.c import CBackend

    p = problem(t)
    for knobs in ({}, variants(t)[0]):  # the defaults, and OpenMP
        art = CBackend().build(p.render(knobs), p.name, prototype=p.c_prototype, checks=True)
        assert art.path


@pytest.mark.parametrize("t", TYPES)
def test_reference_is_gguf_dequantiser_times_x(t):
    """The reference's weights are gguf-py's own dequantisation of the stored blocks (so the
    reference is independent of the engine quantiser's and dequantiser's bugs), special
    blocks included."""
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize as gguf_dequantize

    p = problem(t)
    qt = QT[t.upper()]
    for dist in ("normal", "special"):
        shape = dict(p.edge_shapes[0])
        shape["k"] *= 3
        inputs = p.make_inputs(shape, np.random.default_rng(5), dist)
        n, k = shape["n"], shape["k"]
        w = gguf_dequantize(inputs["wq"].reshape(n, -1), qt).reshape(n, k)
        expected = torch.from_numpy(inputs["x"]).double() @ torch.from_numpy(np.array(w, dtype=np.float64)).T
        got = p.reference(to_torch(inputs))["y"]
        assert got.dtype == torch.float64
        assert torch.allclose(got, expected, rtol=1e-13, atol=0, equal_nan=True), f"{t} {dist}"
        if dist == "special":  # NaN in x: its row of y is NaN
            assert np.isnan(got.numpy()).any()


def test_every_knob_value_is_exercised():
    seen = {k: set() for k in problem(TYPES[0]).knobs}
    for t in TYPES:
        p = problem(t)
        for knobs in [{}, *variants(t)]:
            for k, v in {**p.knob_defaults, **knobs}.items():
                seen[k].add(v)
    assert seen == {k: set(v) for k, v in problem(TYPES[0]).knobs.items()}


@pytest.mark.parametrize("t", TYPES)
def test_kernels_match_reference_on_edge_cases(t, compiler, case_data, kernel_call, assert_close):
    p = problem(t)
    settings = [{}, *variants(t)]
    sources = [p.render(s) for s in settings]
    compiler.build_many(sources)
    for knobs, src in zip(settings, sources):
        fn = compiler.load(p, src)
        for case in cases(p):
            inputs, ref = case_data.get(p, case)
            got = kernel_call(p, fn, inputs, case.shape)
            assert_close(p, got, ref, f"{t} {knobs or 'defaults'} {p.shape_label(case.shape)} {case.dist}", inputs)


@pytest.mark.parametrize("t", TYPES)
def test_engine_qnative_runs_within_its_8bit_error(t):
    """The engine's kernel quantises the activations to 8 bits: about 1e-3 of the outputs'
    scale off the fp32 result, never more than 1e-2."""
    from swarmfactory.engine.native import qlinear

    if qlinear.loaded().lib is None:
        pytest.skip(f"no native linear kernel here: {qlinear.loaded().reason}")
    p = problem(t)
    qk = 256 if t.endswith("_k") else 32
    for shape in ({"n": 37, "k": 4 * qk, "batch": 1}, {"n": 64, "k": 8 * qk, "batch": 5}):
        inputs = to_torch(p.make_inputs(shape, np.random.default_rng(9), "normal"))
        ref = p.reference(inputs)["y"]
        got = p.baselines["engine_qnative_int8"](inputs)()
        assert got.shape == ref.shape and got.dtype == torch.float32
        err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
        assert 0 < err <= 1e-2, f"{t} {shape}: {err:.2e}"


def _wrong(t: str) -> str:
    """A kernel one plausible slip away from right."""
    p = problem(t)
    if t == "q4_k":  # the min term dropped: w = d*sc*q, as if Q4_K had no dmin
        src, count = re.subn(r" - xs\d+ \* dm\d+", "", p.render({"algo": "fused"}))
    elif t == "q5_0":  # the fifth bit ignored (Q4_0 habits with Q5_0's offset)
        src, count = re.subn(r" \| \(hi << 4\)", "", p.render({"algo": "fused"}))
    else:  # Q6_K's offset off by one
        src, count = re.subn(r"\) - 32\)", ") - 31)", p.render({"algo": "fused"}))
    assert count, f"{t}: the slip was not planted"
    return src


@pytest.mark.parametrize("t", ("q4_k", "q5_0", "q6_k"))
def test_a_wrong_kernel_fails_every_verification_case(t, compiler, case_data, kernel_call, assert_close):
    p = problem(t)
    fn = compiler.load(p, _wrong(t))
    for case in cases(p, dists=("normal",)):
        inputs, ref = case_data.get(p, case)
        got = kernel_call(p, fn, inputs, case.shape)
        with pytest.raises(AssertionError, match="outside"):
            assert_close(p, got, ref, f"{t} wrong {p.shape_label(case.shape)}", inputs)


@pytest.mark.parametrize("t", TYPES)
def test_fp32_baseline_and_eager_match_reference(t, assert_close):
    p = problem(t)
    for i, shape in enumerate([p.edge_shapes[6], p.edge_shapes[8]]):
        inputs = p.make_inputs(shape, np.random.default_rng(300 + i), "special")
        ref = p.reference(to_torch(inputs))
        for name, setup in (("dequant_F.linear", p.baselines["dequant_F.linear"]), ("eager", p.eager)):
            got = {"y": setup(to_torch(inputs))().numpy()}
            assert_close(p, got, ref, f"{t} {name} {p.shape_label(shape)}", inputs)
