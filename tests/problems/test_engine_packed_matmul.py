"""The <type>_engine_packed_matmul problems (problems/suites/cpu/qengine_packed.py): the engine's linear
layer on the 32-element block types in the packed layout it runs them in where the CPU has
vpdpbusd, with its numerics.

The layout written in numpy is qlinear.c's ``sf_qlinear_pack`` byte for byte and reads back to the
stored blocks; the template's defaults are the engine's packed kernel bit for bit
(``sf_qlinear_q32_packed``, also the problem's yardstick); every value of every knob gives those
same bits (each output's fp32 operations are fixed: the knobs change which outputs are computed
together and how the exact integer dots are added) and passes the harness's comparison; built
without AVX2 the template's plain C gives the same bits too. Real gcc, ctypes (conftest.py)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from swarmfactory.problems import Case, list_problems, load_problem
from swarmfactory.problems.spec import check_problem, lower_precision, to_torch
from swarmfactory.problems.suites.cpu import ENGINE_NAMES
from swarmfactory.problems.suites.cpu.qengine import BLOCK_BYTES, TYPES, make_weights
from swarmfactory.problems.suites.cpu.qengine_packed import pack, problem_name, unpack

from test_engine_matmul import assert_every_knob_value_sampled, call, engine_call, engine_lib


def problem(qt: QT):
    return load_problem(problem_name(qt))


def packing_lib(qt: QT):
    from swarmfactory.engine.native.qlinear import packs

    lib = engine_lib()
    if not packs(qt, lib):
        pytest.skip(f"this build of the engine keeps {qt.name} as stored (no vpdpbusd)")
    return lib


def inputs_for(p, n: int, k: int, batch: int, seed: int, dist: str = "normal") -> dict:
    return p.case_inputs(Case({"n": n, "k": k, "batch": batch}, seed=seed, dist=dist))


def stored_inputs(qt: QT, inputs: dict) -> dict:
    """The same case with the weights as GGUF stores them (what sf_qlinear_q32 takes)."""
    return {**inputs, "w": unpack(inputs["w"], qt, inputs["n"], inputs["k"])}


def engine_packed(lib, qt: QT, inputs: dict) -> np.ndarray:
    n, k, b = inputs["n"], inputs["k"], inputs["batch"]
    y = np.full((b, n), np.nan, np.float32)
    args = [np.ascontiguousarray(inputs[a]) for a in ("w", "xq", "xd", "xs")]
    assert lib.sf_qlinear_q32_packed(int(qt), *(a.ctypes.data for a in args), y.ctypes.data, n, k, b) == 0
    return y


SHAPES = ((1, 32, 1), (5, 64, 3), (13, 96, 17), (37, 352, 5), (67, 640, 9), (300, 288, 64), (8, 32, 2))

# every value of every knob over the five types (test_every_knob_value_is_sampled)
SAMPLES = {
    QT.Q4_0: [{"mt": 1, "slice": 8}, {"vec": "512", "chains": 2, "mt": 8}],
    QT.Q4_1: [{"mt": 2, "slice": 32, "chains": 2}, {"vec": "512", "slice": 64, "mt": 4}],
    QT.Q5_0: [{"mt": 4, "slice": 64}, {"vec": "512", "chains": 2, "mt": 1, "slice": 8}],
    QT.Q5_1: [{"mt": 8, "chains": 2}, {"vec": "512", "mt": 2, "slice": 32}],
    QT.Q8_0: [{"mt": 8, "slice": 64, "chains": 2}, {"vec": "512", "mt": 8, "slice": 32, "chains": 2},
              {"vec": "512", "mt": 1, "slice": 16}],
}


def test_the_names_are_registered_and_not_in_all():
    assert tuple(problem_name(t) for t in TYPES) == ENGINE_NAMES[-5:]
    assert not set(ENGINE_NAMES) & set(list_problems())


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_the_layout_is_sf_qlinear_packs_and_reads_back(qt):
    rng = np.random.default_rng(int(qt))
    for n, k in ((1, 32), (8, 64), (13, 96), (67, 640)):
        for special in (False, True):
            w = make_weights(rng, qt, n, k, special=special)
            packed = pack(w, qt, n, k)
            assert packed.size == -(-n // 8) * k // 32 * 8 * BLOCK_BYTES[qt]
            assert np.array_equal(unpack(packed, qt, n, k), w)
            lib = engine_lib()
            size = lib.sf_qlinear_pack_bytes(int(qt), n, k)
            if size > 0:
                theirs = np.empty(size, np.uint8)
                assert lib.sf_qlinear_pack(int(qt), w.ctypes.data, n, k // 32 * BLOCK_BYTES[qt], k,
                                           theirs.ctypes.data) == 0
                assert np.array_equal(theirs, packed), (n, k, special)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_problem_is_well_formed(qt):
    from swarmfactory.backends.cstatic import check_source

    p = problem(qt)
    check_problem(p)
    assert p.name == problem_name(qt) and p.family == "quantized_matvec"
    assert set(p.knob_aspects) == set(p.knobs) and all(len(v) >= 2 for v in p.knobs.values())
    assert all(p.valid_knobs({**p.knob_defaults, **s}) for s in SAMPLES[qt])
    assert p.render().count(p.c_signature) == 1 and check_source(p.render()) is None
    assert "#pragma omp" not in p.render()  # the engine owns the threads
    assert list(p.baselines) == ["engine_qnative", "dequant_F.linear"]
    assert not any(lower_precision(b) for b in p.baselines)
    assert {"n": 4096, "k": 640, "batch": 64} in [dict(s) for s in p.workload]
    # the stored problem's reference, from the blocks read back
    stored = load_problem(f"{qt.name.lower()}_engine_matmul")
    inputs = inputs_for(p, 13, 96, 3, 1, "special")
    assert np.array_equal(p.reference(to_torch(inputs))["y"].numpy(),
                          stored.reference(to_torch(stored_inputs(qt, inputs)))["y"].numpy(), equal_nan=True)


def test_every_knob_value_is_sampled():
    assert_every_knob_value_sampled(problem(QT.Q8_0), SAMPLES)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_default_is_the_engines_packed_kernel_bitwise_and_every_knob_keeps_its_bits(qt, compiler, kernel_call,
                                                                                  assert_close):
    lib = packing_lib(qt)
    p = problem(qt)
    fns = [(knobs, compiler.load(p, p.render({**p.knob_defaults, **knobs}))) for knobs in [{}, *SAMPLES[qt]]]
    for i, (n, k, batch) in enumerate(SHAPES):
        for dist in ("normal", "special"):
            inputs = inputs_for(p, n, k, batch, 10 + i, dist)
            want = engine_packed(lib, qt, inputs)
            # the packed kernel agrees with the stored layout's to fp32 rounding
            stored = engine_call(lib, qt, stored_inputs(qt, inputs))
            scale = np.abs(stored[np.isfinite(stored)]).max(initial=1.0)
            assert np.allclose(want, stored, rtol=1e-4, atol=1e-4 * scale, equal_nan=True)
            for knobs, fn in fns:
                got = call(kernel_call, p, fn, inputs)
                assert np.array_equal(got, want, equal_nan=True), (knobs, n, k, batch, dist)
            if dist == "normal" and n * batch >= 4:
                assert_close(p, {"y": got}, p.reference(to_torch(inputs)), f"{qt.name} {n}x{k}x{batch}", inputs)
    base = p.baselines["engine_qnative"](to_torch(inputs))
    assert base.symbol == "sf_qlinear_q32_packed"
    assert np.array_equal(base().numpy(), want, equal_nan=True)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_plain_c_gives_the_same_bits(qt, kernel_call):
    """Built for a CPU without AVX2, the template is plain C with the same operations per output."""
    from swarmfactory.backends.c import CBackend

    lib = packing_lib(qt)
    p = problem(qt)
    art = CBackend().build(p.render(), p.name, ("-O2", "-std=gnu11", "-march=x86-64"), prototype=p.c_prototype)
    fn = getattr(ctypes.CDLL(art.path, mode=ctypes.RTLD_LOCAL), p.name)
    for dist in ("normal", "special"):
        inputs = inputs_for(p, 19, 352, 6, 3, dist)
        assert np.array_equal(call(kernel_call, p, fn, inputs), engine_packed(lib, qt, inputs), equal_nan=True)
