"""The <type>_engine_matmul problems (problems/suites/cpu/qengine.py): the engine's own linear layer on
the 32-element GGUF block types, with its numerics (activations quantised to 8 bits per block).

The template's defaults are qlinear.c's kernel: compared with the engine's ``sf_qlinear_q32``
bitwise (AVX2 path here; the portable path against the engine's portable build). Every value of
every knob is built and verified as the harness compares (tolerance and torch's own fp32 error),
the wide code (16-row passes, 512-bit vectors) also with its 512-bit vectors emulated by pairs of
256-bit ones (QE_EMULATE_AVX512) and compiled for AVX-512 (it cannot run here); a sample of knob
settings is checked for the batch invariance the engine relies on. Compiled with real gcc and
called through ctypes (conftest.py)."""

from __future__ import annotations

import ctypes
import re
import subprocess

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from swarmfactory.problems import Case, list_problems, load_problem
from swarmfactory.problems.spec import check_problem, lower_precision, to_torch
from swarmfactory.problems.suites.cpu import ENGINE_NAMES
from swarmfactory.problems.suites.cpu.qengine import TYPES, decode, problem_name

EMULATE = "#define QE_EMULATE_AVX512 1\n"  # the wide code on this AVX2 host (tests only)


def problem(qt: QT):
    return load_problem(problem_name(qt))


def engine_lib():
    from swarmfactory.engine.native import qlinear

    if qlinear.loaded().lib is None:
        pytest.skip(f"no native linear kernel here: {qlinear.loaded().reason}")
    return qlinear.loaded().lib


def same_path_lib():
    """``engine_lib`` where the engine runs the ISA path a template compiles to on this host (a
    candidate is built for the host; SWARMFACTORY_CPU_MASK narrows the engine only), for the
    bitwise comparisons; a skip under a mask that sends the engine to another path."""
    from swarmfactory.engine.native import qlinear
    from swarmfactory.hardware import cpu_features

    lib = engine_lib()
    host = qlinear.runnable_paths(cpu_features(None))[0].name
    if qlinear.loaded().isa != host:
        pytest.skip(f"the engine runs its {qlinear.loaded().isa} path under the mask, a template compiles for "
                    f"this host's {host}")
    return lib


def engine_call(lib, qt: QT, inputs: dict) -> np.ndarray:
    n, k, b = inputs["n"], inputs["k"], inputs["batch"]
    y = np.full((b, n), np.nan, np.float32)
    args = [np.ascontiguousarray(inputs[a]) for a in ("w", "xq", "xd", "xs")]
    assert lib.sf_qlinear_q32(int(qt), *(a.ctypes.data for a in args), y.ctypes.data, n, k, b) == 0
    return y


def engine_packed_call(lib, qt: QT, inputs: dict, symbol: str = "sf_qlinear_q32_packed",
                       arrays: tuple = ("xq", "xd", "xs")) -> np.ndarray | None:
    """What the engine runs for the weight on a build that packs its type (``symbol``, the packed
    form of sf_qlinear_q32 or, for the K-quants with their bsums, of sf_qlinear_q256, on
    sf_qlinear_pack's copy); None on a build that does not."""
    n, k, b = inputs["n"], inputs["k"], inputs["batch"]
    size = lib.sf_qlinear_pack_bytes(int(qt), n, k)
    if size <= 0:
        return None
    w = np.ascontiguousarray(inputs["w"])
    pack = np.empty(size, np.uint8)
    assert lib.sf_qlinear_pack(int(qt), w.ctypes.data, n, w.size // n, k, pack.ctypes.data) == 0
    y = np.full((b, n), np.nan, np.float32)
    args = [np.ascontiguousarray(inputs[a]) for a in arrays]
    assert getattr(lib, symbol)(int(qt), pack.ctypes.data, *(a.ctypes.data for a in args), y.ctypes.data,
                                n, k, b) == 0
    return y


def call(kernel_call, p, fn, inputs: dict) -> np.ndarray:
    return kernel_call(p, fn, inputs, {"n": inputs["n"], "k": inputs["k"], "batch": inputs["batch"]})["y"]


def inputs_for(p, n: int, k: int, batch: int, seed: int, dist: str = "normal") -> dict:
    return p.case_inputs(Case({"n": n, "k": k, "batch": batch}, seed=seed, dist=dist))


# every value of every knob over the five types (test_every_knob_value_is_sampled); "wide" ones
# (mt=16, vec=512) also run emulated
SAMPLES = {
    QT.Q4_0: [{"mt": 1, "group": 1, "dot": "maddubs"}, {"mt": 16, "vec": "512", "scales": "per_block"}],
    QT.Q4_1: [{"mt": 2, "group": 4, "dot": "madd16"}, {"mt": 8, "vec": "512", "dot": "madd16", "group": 32}],
    QT.Q5_0: [{"mt": 4, "group": 8, "scales": "per_block"}, {"mt": 2, "vec": "512", "dot": "maddubs"}],
    QT.Q5_1: [{"dot": "portable", "group": 32}, {"mt": 16, "vec": "512", "dot": "madd16", "group": 1}],
    QT.Q8_0: [{"mt": 16, "dot": "madd16", "scales": "per_block"}, {"mt": 4, "vec": "512", "group": 4},
              {"mt": 1, "vec": "512", "scales": "per_block", "dot": "maddubs"}],
}


def wide(knobs: dict) -> bool:
    return knobs.get("mt") == 16 or knobs.get("vec") == "512"


def test_the_names_are_registered_and_not_in_all():
    from swarmfactory.problems.suites.cpu.qengine_k import TYPES as K_TYPES

    assert ENGINE_NAMES[:8] == tuple(problem_name(t) for t in TYPES + K_TYPES)
    assert not set(ENGINE_NAMES) & set(list_problems())
    from swarmfactory.problems import _derived_name

    assert _derived_name("q8_0_engine_matmul.SmolLM2-135M")


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_problem_is_well_formed(qt):
    from swarmfactory.backends.cstatic import check_source

    p = problem(qt)
    check_problem(p)
    assert p.name == problem_name(qt) and p.family == "quantized_matvec" and p.version == 1
    assert set(p.knob_aspects) == set(p.knobs) and all(len(v) >= 2 for v in p.knobs.values())
    assert p.valid_knobs(p.knob_defaults) and all(p.valid_knobs({**p.knob_defaults, **s}) for s in SAMPLES[qt])
    assert p.render().count(p.c_signature) == 1 and check_source(p.render()) is None
    assert "threads" not in p.knobs and "#pragma omp" not in p.render()  # the engine owns the threads
    for shape in (*p.edge_shapes, *p.stress_shapes, *p.workload, *p.model_shapes, *(s for _, s in p.model_draws)):
        assert p.valid_shape(shape), dict(shape)
    assert not p.valid_shape({"n": 4, "k": 48, "batch": 1})
    # the engine's own kernel is the first yardstick, at its own (full) precision
    assert list(p.baselines) == ["engine_qnative", "dequant_F.linear"]
    assert not any(lower_precision(b) for b in p.baselines)
    assert {"n": 4096, "k": 640, "batch": 64} in [dict(s) for s in p.workload]


def assert_every_knob_value_sampled(p, samples: dict) -> None:
    """Every value of every knob of ``p`` is in its defaults or in one of ``samples`` (per type)."""
    seen = {k: set() for k in p.knobs}
    for settings in samples.values():
        for knobs in [{}, *settings]:
            for k, v in {**p.knob_defaults, **knobs}.items():
                seen[k].add(v)
    assert seen == {k: set(v) for k, v in p.knobs.items()}


def test_every_knob_value_is_sampled():
    assert_every_knob_value_sampled(problem(QT.Q8_0), SAMPLES)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_decode_is_gguf_dequantiser(qt):
    """The weights the reference multiplies by: dw * u + mw is gguf-py's own dequantisation of
    the stored blocks, special blocks included."""
    from gguf.quants import dequantize as gguf_dequantize

    p = problem(qt)
    for dist in ("normal", "special"):
        inputs = inputs_for(p, 9, 96, 2, 5, dist)
        u, d, m = decode(qt, inputs["w"], 9, 96)
        ours = (u.reshape(9, 3, 32) * d[..., None] + m[..., None]).reshape(9, 96).astype(np.float32)
        assert np.array_equal(ours, gguf_dequantize(inputs["w"].reshape(9, -1), qt).reshape(9, 96)), dist


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_default_is_the_engines_kernel_bitwise(qt, compiler, kernel_call):
    """The seed is qlinear.c's own code: the same bits as sf_qlinear_q32; the baseline is what the
    engine runs (called once, and in its C loop): that kernel, or where this build packs the type
    its packed kernel, which agrees with it to fp32 rounding."""
    lib = same_path_lib()
    p = problem(qt)
    fn = compiler.load(p, p.render())
    for i, (n, k, batch) in enumerate(((1, 32, 1), (1, 352, 5), (37, 352, 5), (13, 96, 17), (67, 640, 9),
                                       (300, 288, 64))):
        for dist in ("normal", "special"):
            inputs = inputs_for(p, n, k, batch, 10 + i, dist)
            want = engine_call(lib, qt, inputs)
            got = call(kernel_call, p, fn, inputs)
            assert np.array_equal(got, want, equal_nan=True), (n, k, batch, dist)
    base = p.baselines["engine_qnative"](to_torch(inputs))
    packed = engine_packed_call(lib, qt, inputs)
    if packed is not None:
        assert base.symbol == "sf_qlinear_q32_packed"
        assert np.allclose(packed, want, rtol=1e-4, atol=1e-4 * np.nanmax(np.abs(want)), equal_nan=True), "packed"
        want = packed
    assert np.array_equal(base().numpy(), want, equal_nan=True)
    base.y.fill_(0.0)
    base.loop(3)
    assert np.array_equal(base.y.numpy(), want, equal_nan=True)


def test_portable_code_is_the_engines_portable_build(kernel_call):
    """Built without AVX2 (or with dot=portable), the template is qlinear.c's portable kernel:
    the same bits as the engine's portable build of sf_qlinear_q32."""
    from swarmfactory.backends.c import CBackend
    from swarmfactory.engine.native import qlinear
    from swarmfactory.engine.native.isa import BASE_FLAGS, path_named

    try:
        path = path_named("portable")
        lib = qlinear.load_library(path)
    except Exception as e:  # noqa: BLE001 - no portable build on this machine
        pytest.skip(f"no portable build of the engine here: {e}")
    flags = (*path.flags, *BASE_FLAGS)
    for qt in TYPES:
        p = problem(qt)
        art = CBackend().build(p.render(), p.name, flags, prototype=p.c_prototype)
        fn = getattr(ctypes.CDLL(art.path, mode=ctypes.RTLD_LOCAL), p.name)
        for dist in ("normal", "special"):
            inputs = inputs_for(p, 19, 352, 6, 3, dist)
            assert np.array_equal(call(kernel_call, p, fn, inputs), engine_call(lib, qt, inputs), equal_nan=True)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_reference_is_the_engines_numerics(qt, assert_close):
    """The float64 reference and the engine's kernel agree to fp32 rounding (a few 1e-7 of the
    block terms' magnitude), and the problem's torch fp32 path to the same; both pass the
    harness's comparison."""
    lib = engine_lib()
    p = problem(qt)
    for i, (n, k, batch) in enumerate(((40, 640, 3), (17, 2048, 16), (3, 16384, 2))):
        inputs = inputs_for(p, n, k, batch, 40 + i)
        ref = p.reference(to_torch(inputs))
        assert ref["y"].dtype == torch.float64
        u, d, m = decode(qt, inputs["w"], n, k)
        dots = np.einsum("njt,bjt->bnj", u.reshape(n, -1, 32).astype(np.float64),
                         inputs["xq"].reshape(batch, -1, 32).astype(np.float64))
        mag = (np.abs(dots * d[None] * inputs["xd"][:, None, :]) + np.abs(m[None] * inputs["xs"][:, None, :])).sum(-1)
        for got in (engine_call(lib, qt, inputs), p.fp32_torch(to_torch(inputs))().numpy()):
            assert np.abs(got - ref["y"].numpy()).max() / mag.max() < 1e-6
            assert_close(p, {"y": got}, ref, f"{qt.name} {n}x{k}x{batch}", inputs)


def test_the_bound_from_torchs_error_admits_the_engines_kernel(assert_close):
    """Torch's fp32 answer in the op's own form (the min terms cancel the unsigned quants' offset
    there too) bounds the engine's kernel on long sums and many outputs; a case of fewer than 4
    finite outputs has no such bound (one output's error against torch's is a ratio of two
    roundings): Q5_0, n = 1, k = 53248, a seed case where the engine's kernel is 22x the error of
    torch's dequantised fp32 matmul, passes on the tolerance alone."""
    from swarmfactory.harness.accuracy import torch_errors
    from swarmfactory.harness.verify import case_tolerance

    lib = engine_lib()
    for qt in (QT.Q5_0, QT.Q8_0):
        p = problem(qt)
        for shape in ({"n": 7, "k": 16384, "batch": 3}, {"n": 1, "k": 53248, "batch": 1},
                      {"n": 3, "k": 36864, "batch": 2}):
            case = next(c for c in p.seed_cases() if dict(c.shape) == shape)
            inputs = p.case_inputs(case)
            ref = p.reference(to_torch(inputs))
            expected = {"y": ref["y"].numpy()}
            bounded = torch_errors(p, inputs, expected, case_tolerance(p, expected, inputs)[0])
            assert bool(bounded) == (shape["n"] * shape["batch"] >= 4), (qt.name, shape)
            assert_close(p, {"y": engine_call(lib, qt, inputs)}, ref, f"{qt.name} {shape}", inputs)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_knob_settings_pass_verification(qt, compiler, case_data, kernel_call, assert_close):
    """The defaults and the sample, as the harness compares them, on the edge shapes under every
    distribution (the wide settings also emulated) and a workload shape."""
    p = problem(qt)
    settings = [(s, "") for s in [{}, *SAMPLES[qt]]] + [(s, EMULATE) for s in SAMPLES[qt] if wide(s)]
    sources = [pre + p.render(s) for s, pre in settings]
    compiler.build_many(sources)
    cases = [Case(dict(s), seed=50 + i, dist=d) for i, s in enumerate(p.edge_shapes) for d in p.dists]
    cases.append(Case({"n": 333, "k": 640, "batch": 19}, seed=7, dist="special"))
    for (knobs, pre), src in zip(settings, sources):
        fn = compiler.load(p, src)
        for case in cases:
            inputs, ref = case_data.get(p, case)
            got = kernel_call(p, fn, inputs, case.shape)
            assert_close(p, got, ref, f"{qt.name} {knobs} {'emulated' if pre else ''} {case.key()}", inputs)


def test_wide_settings_build_for_avx512(tmp_path):
    """What cannot run here builds for AVX-512, with and without VNNI: each type's
    wide samples, and for Q8_0 (the sign trick) every dot with 512-bit vectors."""
    from concurrent.futures import ThreadPoolExecutor

    sources = []
    for qt in TYPES:
        p = problem(qt)
        extra = [{"vec": "512", "mt": 16, "dot": d} for d in ("auto", "maddubs", "madd16")] if qt == QT.Q8_0 else []
        for knobs in [s for s in SAMPLES[qt] if wide(s)] + extra:
            src = tmp_path / f"{p.name}_{len(sources)}.c"
            src.write_text(p.render(knobs))
            sources.append(src)

    def build(job):
        src, flags = job
        return subprocess.run(["gcc", "-O1", "-std=gnu11", *flags, "-c", str(src), "-o",
                               "/dev/null"], capture_output=True, text=True)

    jobs = [(src, flags) for src in sources for flags in (("-march=x86-64-v4", "-mavx512vnni"), ("-march=x86-64-v4",))]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for (src, flags), res in zip(jobs, pool.map(build, jobs)):
            assert res.returncode == 0, f"{src.name} {flags}: {res.stderr[:2000]}"


@pytest.mark.parametrize("knobs,pre", [({}, ""), ({"mt": 4, "scales": "per_block", "group": 1}, ""),
                                       ({"mt": 16, "vec": "512", "dot": "madd16"}, EMULATE),
                                       ({"mt": 2, "vec": "512", "group": 4}, EMULATE), ({"dot": "portable"}, "")],
                         ids=["defaults", "mt4-per_block", "mt16-512-madd16-emulated", "mt2-512-emulated", "portable"])
def test_results_do_not_depend_on_batch_or_rows_in_the_call(knobs, pre, compiler, kernel_call):
    """The batch invariance the engine relies on: a row alone, in a batch (across the passes of
    16/8/4/2/1 rows) or with only part of the matrix in the call gives the same bits."""
    for qt in (QT.Q8_0, QT.Q5_1) if knobs else TYPES:
        p = problem(qt)
        fn = compiler.load(p, pre + p.render(knobs))
        n, k, batch = 67, 352, 31
        full_in = inputs_for(p, n, k, batch, 9)
        full = call(kernel_call, p, fn, full_in)

        def rows(b0, b1, r0=0, r1=n):
            sub = {**full_in, "xq": full_in["xq"][b0:b1], "xd": full_in["xd"][b0:b1], "xs": full_in["xs"][b0:b1],
                   "batch": b1 - b0, "n": r1 - r0,
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
    """The engine gives a block with a non-finite activation xd = xs = NaN (xq = 0): every output
    of its row is NaN, in the reference and the kernel; the other rows (special weights, zero
    activation blocks) stay finite."""
    p = problem(qt)
    fn = compiler.load(p, p.render())
    inputs = inputs_for(p, 21, 352, 6, 11, "special")
    bad = np.isnan(inputs["xd"]).any(-1)
    assert bad.tolist() == [False] * 5 + [True] and (inputs["xd"] == 0).any()
    for y in (call(kernel_call, p, fn, inputs), p.reference(to_torch(inputs))["y"].numpy()):
        assert np.isnan(y[bad]).all() and np.isfinite(y[~bad]).all()


def _wrong(qt: QT, slip: str) -> str:
    p = problem(qt)
    src = p.render()
    if slip == "scales 5% off":
        src, count = re.subn(r"_mm256_mul_ps\(dw, ", "_mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(1.05f)), ", src)
        src, c2 = re.subn(r"_mm256_set1_ps\(dw \* xd", "_mm256_set1_ps(1.05f * dw * xd", src)
        count += c2
    else:  # the min terms dropped
        src, count = re.subn(r"acc\[mm\] = _mm256_fmadd_ps\((mw|_mm256_set1_ps\(0\.125f \* mw\)), [^;]*;", "", src)
    assert count >= 2, f"{qt.name}: the slip {slip!r} was not planted"
    return src


@pytest.mark.parametrize("qt,slip", [(QT.Q8_0, "scales 5% off"), (QT.Q4_0, "scales 5% off"),
                                     (QT.Q4_1, "min dropped"), (QT.Q5_0, "min dropped")],
                         ids=["q8_0-scales", "q4_0-scales", "q4_1-min", "q5_0-min"])
def test_a_wrong_kernel_fails_verification(qt, slip, compiler, case_data, kernel_call, assert_close):
    p = problem(qt)
    fn = compiler.load(p, _wrong(qt, slip))
    for case in [Case(dict(s), seed=60 + i) for i, s in enumerate(p.edge_shapes)] + \
            [Case(dict(p.workload[0]), seed=61)]:
        inputs, ref = case_data.get(p, case)
        got = kernel_call(p, fn, inputs, case.shape)
        with pytest.raises(AssertionError, match="outside|torch"):
            assert_close(p, got, ref, f"{qt.name} {slip} {case.key()}", inputs)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_fp32_baseline_and_eager_match_reference(qt, assert_close):
    p = problem(qt)
    for i, (n, k, batch) in enumerate(((67, 288, 3), (17, 640, 9))):
        for dist in ("normal", "special"):
            inputs = inputs_for(p, n, k, batch, 300 + i, dist)
            ref = p.reference(to_torch(inputs))
            for name, setup in (("dequant_F.linear", p.baselines["dequant_F.linear"]), ("eager", p.eager)):
                got = {"y": setup(to_torch(inputs))().numpy()}
                assert_close(p, got, ref, f"{qt.name} {name} {n}x{k}x{batch} {dist}", inputs)


def test_rendered_sources_pass_the_c_backends_checks():
    """What the harness asks of a candidate's build (the source, preprocessed and assembly checks,
    no code run at load): the defaults and a 512-bit setting."""
    from swarmfactory.backends.c import CBackend

    p = problem(QT.Q5_1)
    for knobs in ({}, {"vec": "512", "mt": 16, "dot": "madd16"}):
        assert CBackend().build(p.render(knobs), p.name, prototype=p.c_prototype, checks=True).path


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_every_dot_computes_the_stated_function_of_inputs_the_timing_run_mixes(qt, compiler, kernel_call):
    """The harness's timing runs replace input units from other draws (xq blocks, xd and xs
    values each on their own), so xs need not equal xd * sum(xq) there, and a NaN xs may sit
    beside a finite xd: a kernel must compute the stated function with xs as given (Q8_0 never
    reads it). The engine's portable code once took Q4_0/Q5_0's offset from xq and added 0 * xs
    for Q8_0: the harness judged its timing outputs wrong ("cheated")."""
    from swarmfactory.harness.verify import compare

    p = problem(qt)
    settings = [(s, "") for s in [{}, {"dot": "portable"}, {"dot": "madd16", "scales": "per_block"}, *SAMPLES[qt]]]
    settings += [(s, EMULATE) for s in SAMPLES[qt] if wide(s)]
    sources = [pre + p.render(s) for s, pre in settings]
    compiler.build_many(sources)
    rng = np.random.default_rng(5)
    inputs = inputs_for(p, 37, 352, 9, seed=3)
    inputs["xs"] = (rng.standard_normal(inputs["xs"].shape) * 4).astype(np.float32)  # unrelated to xq
    inputs["xs"][2, 3] = np.nan
    inputs["xd"][4, 1] = np.nan  # a NaN scale with a finite xs: row 4 is NaN
    want = p.reference(to_torch(inputs))["y"].numpy()
    assert np.isnan(want[4]).all() and np.isnan(want[2]).all() == (qt != QT.Q8_0)
    lib = engine_lib()
    for (knobs, pre), src in zip(settings, sources):
        got = kernel_call(p, compiler.load(p, src), inputs, {"n": 37, "k": 352, "batch": 9})
        assert compare(p, {"y": want}, got, f"{qt.name} {knobs}") is None, (knobs, pre)
    assert compare(p, {"y": want}, {"y": engine_call(lib, qt, inputs)}, "engine") is None
