"""The K-quant <type>_engine_matmul problems (problems/suites/cpu/qengine_k.py): the engine's own
linear layer on Q4_K, Q5_K, Q6_K with its numerics (activations quantised to 8 bits per block of
256, with their sums per 16).

The activations' quantiser is the engine's bit for bit and the template's defaults are qlinear.c's
kernel: the template on ``quantize_rows_256(x)`` gives the same bits as the engine's ``sf_qlinear``
on fp32 x, and as ``sf_qlinear_q256`` on the problem's inputs (AVX2 path here; the portable code
against the engine's portable build). Every SIMD setting (rows per pass, row groups, unpacking) gives
the same bits too; every knob value passes the harness's comparison on the edge shapes under every
distribution, and inputs the timing runs mix (bsums unrelated to xq) are computed as stated.
Compiled with real gcc and called through ctypes (conftest.py)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from swarmfactory.problems import Case, list_problems
from swarmfactory.problems.spec import check_problem, lower_precision, to_torch
from swarmfactory.problems.suites.cpu import ENGINE_NAMES
from swarmfactory.problems.suites.cpu.qengine import problem_name
from swarmfactory.problems.suites.cpu.qengine_k import TYPES, decode, quantize_rows_256
from test_engine_matmul import (  # noqa: E402 (the 32-element types' helpers)
    assert_every_knob_value_sampled, call, engine_lib, engine_packed_call, inputs_for, problem, same_path_lib)

# every value of every knob over the three types (test_every_knob_value_is_sampled)
SAMPLES = {
    QT.Q4_K: [{"mt": 1, "group": 1, "unpack": "chunk"}, {"dot": "portable", "group": 4}],
    QT.Q5_K: [{"mt": 2, "group": 8}, {"mt": 4, "unpack": "chunk"}, {"dot": "portable", "group": 1}],
    QT.Q6_K: [{"mt": 4, "group": 4, "unpack": "chunk"}, {"dot": "portable", "group": 8}, {"mt": 1}],
}


def engine_packed(lib, qt: QT, w: np.ndarray, n: int, k: int, x: np.ndarray) -> np.ndarray:
    """The engine's whole linear layer on fp32 x (its own quantisation), one thread, on the stored
    blocks (the kernel the template's defaults are; a build with vpdpbusd runs the engine on a
    packed copy: ``engine_packed_call``)."""
    from swarmfactory.engine.gguf_loader import QuantTensor
    from swarmfactory.engine.kernels import Weight
    from swarmfactory.engine.native import qlinear

    part = QuantTensor("w", qt, n, k, np.ascontiguousarray(w).reshape(n, -1))
    packed = qlinear.Packed(Weight([part]))
    packed.pack = False
    return packed(lib, torch.from_numpy(np.ascontiguousarray(x, np.float32)), 1).numpy()


def engine_q256(lib, qt: QT, inputs: dict) -> np.ndarray:
    n, k, b = inputs["n"], inputs["k"], inputs["batch"]
    y = np.full((b, n), np.nan, np.float32)
    args = [np.ascontiguousarray(inputs[a]) for a in ("w", "xq", "xd", "bsums")]
    assert lib.sf_qlinear_q256(int(qt), *(a.ctypes.data for a in args), y.ctypes.data, n, k, b) == 0
    return y


def with_x(inputs: dict, x: np.ndarray) -> dict:
    xq, xd, bsums = quantize_rows_256(x)
    return {**inputs, "xq": xq, "xd": xd, "bsums": bsums, "batch": x.shape[0]}


def test_the_names_are_registered_and_not_in_all():
    from swarmfactory.problems import _derived_name

    assert ENGINE_NAMES[5:8] == tuple(problem_name(t) for t in TYPES) == (
        "q4_k_engine_matmul", "q5_k_engine_matmul", "q6_k_engine_matmul")
    assert not set(ENGINE_NAMES) & set(list_problems())
    assert _derived_name("q6_k_engine_matmul.SmolLM2-135M")


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_problem_is_well_formed(qt):
    from swarmfactory.backends.cstatic import check_source

    p = problem(qt)
    check_problem(p)
    assert p.name == problem_name(qt) and p.family == "quantized_matvec" and p.baseline_threads == 1
    assert set(p.knob_aspects) == set(p.knobs) and all(len(v) >= 2 for v in p.knobs.values())
    assert p.valid_knobs(p.knob_defaults) and all(p.valid_knobs({**p.knob_defaults, **s}) for s in SAMPLES[qt])
    for knobs in [{}, *SAMPLES[qt]]:
        src = p.render(knobs)
        assert src.count(p.c_signature) == 1 and check_source(src) is None and "#pragma omp" not in src
    assert "int16_t *bsums" in p.c_signature
    for shape in (*p.edge_shapes, *p.stress_shapes, *p.workload, *p.model_shapes, *(s for _, s in p.model_draws)):
        assert p.valid_shape(shape), dict(shape)
    assert p.model_shapes and p.model_draws
    assert not p.valid_shape({"n": 4, "k": 640, "batch": 1})
    assert list(p.baselines) == ["engine_qnative", "dequant_F.linear"]
    assert not any(lower_precision(b) for b in p.baselines)


def test_every_knob_value_is_sampled():
    assert_every_knob_value_sampled(problem(QT.Q4_K), SAMPLES)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_decode_is_gguf_dequantiser(qt):
    """What the reference multiplies by: d sc u - dmin m (Q6_K: d sc (u - 32)) is gguf-py's
    dequantisation of the stored blocks, special blocks included (to fp32 rounding)."""
    from gguf.quants import dequantize as gguf_dequantize

    p = problem(qt)
    for dist in ("normal", "special"):
        inputs = inputs_for(p, 9, 768, 2, 5, dist)
        dec = decode(qt, inputs["w"], 9, 768)
        g = lambda a: np.repeat(a, 16, -1)  # noqa: E731 - per super-block -> per group of 16
        ours = (dec["u"].reshape(9, 48, 16) * (g(dec["d"]) * dec["sc"])[..., None]
                + ((g(dec["d"]) if qt == QT.Q6_K else -g(dec["dmin"])) * dec["mn"])[..., None]).reshape(9, 768)
        want = gguf_dequantize(inputs["w"].reshape(9, -1), qt).reshape(9, 768).astype(np.float64)
        assert np.allclose(ours, want, rtol=1e-6, atol=1e-9, equal_nan=True), dist


def test_activation_quantiser_is_the_engines(compiler, kernel_call):
    """quantize_rows_256 against qlinear.c's quantize_row (through the engine's whole layer, whose
    only input is fp32 x): ties, clamping, zero, non-finite and denormal blocks. The kernel check
    is bitwise (test_default_is_the_engines_kernel_bitwise), so equal outputs mean equal (xq, xd,
    bsums); the float64 reference from them is the engine's result to fp32 rounding."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 768)).astype(np.float32)
    x[1, :256] = 0.0
    x[2, 300] = np.inf
    x[3, 600] = np.nan
    x[4, :256] = np.float32(1e-40)
    x[5, :256] = np.round(rng.standard_normal(256) * 4) / 4 * np.float32(127 / 16)  # exact .5 ties
    x[5, 0] = 16 * np.float32(127 / 16)
    xq, xd, bsums = quantize_rows_256(x)
    assert (xq[1, :256] == 0).all() and xd[1, 0] == 0
    assert np.isnan(xd[2, 1]) and (xq[2, 256:512] == 0).all() and np.isnan(xd[3, 2]) and np.isfinite(xd[3, :2]).all()
    assert (bsums == xq.reshape(6, 48, 16).astype(np.int32).sum(-1)).all() and np.abs(xq).max() == 127
    lib = same_path_lib()
    for qt in TYPES:
        p = problem(qt)
        inputs = with_x(inputs_for(p, 19, 768, 6, 1), x)
        got = p.reference(to_torch(inputs))["y"].numpy()
        want = engine_packed(lib, qt, inputs["w"], 19, 768, x)
        assert np.array_equal(call(kernel_call, p, compiler.load(p, p.render()), inputs), want, equal_nan=True)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        ok = np.isfinite(want)
        assert np.abs(got[ok] - want[ok]).max() <= 1e-5 * np.abs(want[ok]).max(), qt.name


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_default_is_the_engines_kernel_bitwise(qt, compiler, kernel_call):
    """The seed is qlinear.c's own code: on quantize_rows_256(x) the same bits as the engine's
    linear layer on x (stored layout), and on the problem's inputs the same as sf_qlinear_q256;
    the baseline (once, and in its C loop) is what the engine runs: that kernel, or where this
    build packs the K-quants its packed kernel, which agrees with it to fp32 rounding."""
    lib = same_path_lib()
    p = problem(qt)
    fn = compiler.load(p, p.render())
    rng = np.random.default_rng(int(qt))
    for i, (n, k, batch) in enumerate(((1, 256, 1), (37, 768, 5), (13, 512, 17), (67, 1536, 9), (300, 2560, 64))):
        inputs = inputs_for(p, n, k, batch, 10 + i)
        x = (rng.standard_normal((batch, k)) * rng.uniform(0.1, 10, (batch, 1))).astype(np.float32)
        mine = with_x(inputs, x)
        assert np.array_equal(call(kernel_call, p, fn, mine), engine_packed(lib, qt, inputs["w"], n, k, x)), (n, k)
    for i, (n, k, batch) in enumerate(((1, 256, 1), (33, 768, 5), (70, 512, 19))):
        for dist in ("normal", "special"):
            inputs = inputs_for(p, n, k, batch, 20 + i, dist)
            want = engine_q256(lib, qt, inputs)
            assert np.array_equal(call(kernel_call, p, fn, inputs), want, equal_nan=True), (n, k, batch, dist)
    base = p.baselines["engine_qnative"](to_torch(inputs))
    packed = engine_packed_call(lib, qt, inputs, "sf_qlinear_q256_packed", ("xq", "xd", "bsums"))
    if packed is not None:
        assert base.symbol == "sf_qlinear_q256_packed"
        assert np.allclose(packed, want, rtol=1e-4, atol=1e-4 * np.nanmax(np.abs(want)), equal_nan=True), "packed"
        want = packed
    assert np.array_equal(base().numpy(), want, equal_nan=True)
    base.y.fill_(0.0)
    base.loop(3)
    assert np.array_equal(base.y.numpy(), want, equal_nan=True)


def test_every_simd_setting_gives_the_engines_bits(compiler, kernel_call):
    """mt, group and unpack only order the same operations: every SIMD setting is bitwise the
    defaults (so bitwise the engine)."""
    for qt in TYPES:
        p = problem(qt)
        settings = [s for s in SAMPLES[qt] if s.get("dot") != "portable"]
        sources = [p.render()] + [p.render(s) for s in settings]
        compiler.build_many(sources)
        for dist in ("normal", "special"):
            inputs = inputs_for(p, 45, 768, 23, 8, dist)
            want = call(kernel_call, p, compiler.load(p, sources[0]), inputs)
            for s, src in zip(settings, sources[1:]):
                assert np.array_equal(call(kernel_call, p, compiler.load(p, src), inputs), want, equal_nan=True), s


def test_portable_code_is_the_engines_portable_build(kernel_call):
    """dot=portable (or a target without AVX2) is qlinear.c's portable kernel: the same bits as the
    engine's portable build on consistent activations (its Q6_K code takes the -32 offset from xq,
    the template's from bsums, the same integer there)."""
    from swarmfactory.backends.c import CBackend
    from swarmfactory.engine.native import qlinear
    from swarmfactory.engine.native.isa import BASE_FLAGS, path_named

    try:
        path = path_named("portable")
        lib = qlinear.load_library(path)
    except Exception as e:  # noqa: BLE001 - no portable build on this machine
        pytest.skip(f"no portable build of the engine here: {e}")
    flags = (*path.flags, *BASE_FLAGS)
    rng = np.random.default_rng(4)
    for qt in TYPES:
        p = problem(qt)
        for knobs in ({}, {"dot": "portable"}):
            art = CBackend().build(p.render(knobs), p.name, flags, prototype=p.c_prototype)
            fn = getattr(ctypes.CDLL(art.path, mode=ctypes.RTLD_LOCAL), p.name)
            inputs = inputs_for(p, 19, 768, 6, 3, "special")
            x = rng.standard_normal((6, 768)).astype(np.float32)
            x[5, 10] = np.nan
            got = call(kernel_call, p, fn, with_x(inputs, x))
            assert np.array_equal(got, engine_packed(lib, qt, inputs["w"], 19, 768, x), equal_nan=True), (qt, knobs)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_reference_is_the_engines_numerics(qt, assert_close):
    """The float64 reference and the engine's kernel agree to fp32 rounding, and the problem's
    torch fp32 path to the same; both pass the harness's comparison."""
    from swarmfactory.problems.suites.cpu.qengine_k import _Ops

    lib = engine_lib()
    p = problem(qt)
    for i, (n, k, batch) in enumerate(((40, 768, 3), (17, 2048, 16), (3, 16384, 2))):
        inputs = inputs_for(p, n, k, batch, 40 + i)
        ref = p.reference(to_torch(inputs))
        assert ref["y"].dtype == torch.float64
        mag = _Ops(qt).formula({**to_torch(inputs), "xq": torch.from_numpy(np.abs(inputs["xq"]))}, torch.float64)
        for got in (engine_q256(lib, qt, inputs), p.fp32_torch(to_torch(inputs))().numpy()):
            assert np.abs(got - ref["y"].numpy()).max() / np.abs(mag.numpy()).max() < 1e-6
            assert_close(p, {"y": got}, ref, f"{qt.name} {n}x{k}x{batch}", inputs)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_knob_settings_pass_verification(qt, compiler, case_data, kernel_call, assert_close):
    """The defaults and the sample, as the harness compares them, on the edge shapes under every
    distribution and a larger shape."""
    p = problem(qt)
    settings = [{}, *SAMPLES[qt]]
    sources = [p.render(s) for s in settings]
    compiler.build_many(sources)
    cases = [Case(dict(s), seed=50 + i, dist=d) for i, s in enumerate(p.edge_shapes) for d in p.dists]
    cases.append(Case({"n": 333, "k": 1536, "batch": 19}, seed=7, dist="special"))
    for knobs, src in zip(settings, sources):
        fn = compiler.load(p, src)
        for case in cases:
            inputs, ref = case_data.get(p, case)
            got = kernel_call(p, fn, inputs, case.shape)
            assert_close(p, got, ref, f"{qt.name} {knobs} {case.key()}", inputs)


@pytest.mark.parametrize("knobs", [{}, {"mt": 4, "unpack": "chunk", "group": 1}, {"mt": 2, "group": 8},
                                   {"dot": "portable"}], ids=["defaults", "mt4-chunk-g1", "mt2-g8", "portable"])
def test_results_do_not_depend_on_batch_or_rows_in_the_call(knobs, compiler, kernel_call):
    """A row alone, in a batch (across the passes of 8/4/2/1 rows) or with only part of the matrix
    in the call gives the same bits."""
    for qt in TYPES if not knobs else (QT.Q5_K, QT.Q6_K):
        p = problem(qt)
        fn = compiler.load(p, p.render(knobs))
        n, k, batch = 67, 768, 31
        full_in = inputs_for(p, n, k, batch, 9)
        full = call(kernel_call, p, fn, full_in)

        def rows(b0, b1, r0=0, r1=n):
            sub = {**full_in, "xq": full_in["xq"][b0:b1], "xd": full_in["xd"][b0:b1],
                   "bsums": full_in["bsums"][b0:b1], "batch": b1 - b0, "n": r1 - r0,
                   "w": full_in["w"].reshape(n, -1)[r0:r1].reshape(-1)}
            return call(kernel_call, p, fn, sub)

        for b in (0, 5, batch - 1):
            assert np.array_equal(rows(b, b + 1)[0], full[b]), (qt.name, b)
        for b0, b1 in ((3, 10), (1, 31), (0, 17)):
            assert np.array_equal(rows(b0, b1), full[b0:b1]), (qt.name, b0, b1)
        for r0, r1 in ((0, 1), (5, 29), (40, 67)):
            assert np.array_equal(rows(0, batch, r0, r1), full[:, r0:r1]), (qt.name, r0, r1)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_a_nonfinite_activation_block_makes_its_row_nan(qt, compiler, kernel_call):
    p = problem(qt)
    fn = compiler.load(p, p.render())
    inputs = inputs_for(p, 21, 768, 6, 11, "special")
    bad = np.isnan(inputs["xd"]).any(-1)
    assert bad.tolist() == [False] * 5 + [True] and (inputs["xd"] == 0).any()
    for y in (call(kernel_call, p, fn, inputs), p.reference(to_torch(inputs))["y"].numpy()):
        assert np.isnan(y[bad]).all() and np.isfinite(y[~bad]).all()


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_a_kernel_5_percent_off_fails_verification(qt, compiler, case_data, kernel_call, assert_close):
    p = problem(qt)
    src = p.render()
    assert src.count("_mm256_set1_ps(sv.d * dx)") >= 1
    fn = compiler.load(p, src.replace("_mm256_set1_ps(sv.d * dx)", "_mm256_set1_ps(1.05f * sv.d * dx)"))
    for case in [Case(dict(s), seed=60 + i) for i, s in enumerate(p.edge_shapes)] + \
            [Case(dict(p.workload[0]), seed=61)]:
        inputs, ref = case_data.get(p, case)
        got = kernel_call(p, fn, inputs, case.shape)
        with pytest.raises(AssertionError, match="outside|torch"):
            assert_close(p, got, ref, f"{qt.name} 5% off {case.key()}", inputs)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_fp32_baseline_and_eager_match_reference(qt, assert_close):
    p = problem(qt)
    for i, (n, k, batch) in enumerate(((67, 768, 3), (17, 1536, 9))):
        for dist in ("normal", "special"):
            inputs = inputs_for(p, n, k, batch, 300 + i, dist)
            ref = p.reference(to_torch(inputs))
            for name, setup in (("dequant_F.linear", p.baselines["dequant_F.linear"]), ("eager", p.eager)):
                got = {"y": setup(to_torch(inputs))().numpy()}
                assert_close(p, got, ref, f"{qt.name} {name} {n}x{k}x{batch} {dist}", inputs)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_every_setting_computes_the_stated_function_of_inputs_the_timing_run_mixes(qt, compiler, kernel_call):
    """The harness's timing runs replace input units from other draws (super-blocks of xq, xd
    values, one super-block's bsums, each on their own), so bsums need not be xq's sums there: a
    kernel (and the engine's SIMD kernel) must compute the stated function with bsums as given."""
    from swarmfactory.harness.verify import compare

    p = problem(qt)
    settings = [{}, *SAMPLES[qt]]
    sources = [p.render(s) for s in settings]
    compiler.build_many(sources)
    rng = np.random.default_rng(5)
    inputs = inputs_for(p, 37, 768, 9, seed=3)
    inputs["bsums"] = rng.integers(-2032, 2033, inputs["bsums"].shape).astype(np.int16)  # unrelated to xq
    inputs["xd"][4, 1] = np.nan  # a NaN scale: row 4 is NaN
    want = p.reference(to_torch(inputs))["y"].numpy()
    assert np.isnan(want[4]).all() and np.isfinite(np.delete(want, 4, 0)).all()
    consistent = {**inputs, "bsums": quantize_rows_256(np.zeros((9, 768), np.float32))[2]}
    assert np.abs(p.reference(to_torch(consistent))["y"].numpy()[0] - want[0]).max() > 1e-3  # bsums matter
    for knobs, src in zip(settings, sources):
        got = kernel_call(p, compiler.load(p, src), inputs, {"n": 37, "k": 768, "batch": 9})
        assert compare(p, {"y": want}, got, f"{qt.name} {knobs}") is None, knobs
    assert compare(p, {"y": want}, {"y": engine_q256(engine_lib(), qt, inputs)}, "engine") is None
