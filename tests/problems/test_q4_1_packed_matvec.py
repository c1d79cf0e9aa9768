"""q4_1_packed_matvec is the native decoder's hot loop: the same layout as the engine's pack(),
the same activations as its quantize_row, and a seed that computes what decode.c computes.

The seed is compared with the decoder's own ``sf_linear`` bitwise, per ISA path this CPU runs:
both do the same integer block dot products and the same fp32 operations in the same order
(the template's defaults are decode.c's code), so any difference is a drift between the two.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from swarmfactory.engine.gguf_loader import QuantTensor
from swarmfactory.engine.kernels import Weight
from swarmfactory.engine.native import BASE_FLAGS, linear, load_library, pack, runnable_paths
from swarmfactory.layouts import quantize_rows, unpack_q4_1
from swarmfactory.problems import load_problem
from swarmfactory.problems.suites.cpu.q4_1_matmul import decode, make_blocks

NAME = "q4_1_packed_matvec"


@pytest.fixture(scope="module")
def problem():
    return load_problem(NAME)


def _weight(n: int, k: int, seed: int, special: bool = False) -> Weight:
    blocks = make_blocks(np.random.default_rng(seed), n, k, special=special)
    return Weight([QuantTensor("w", QT.Q4_1, n, k, blocks.reshape(n, -1))])


def _build(problem, source: str, flags: tuple[str, ...]):
    from swarmfactory.backends.c import CBackend

    art = CBackend().build(source, problem.name, flags, prototype=problem.c_prototype)
    fn = getattr(ctypes.CDLL(art.path, mode=ctypes.RTLD_LOCAL), problem.name)
    fn.restype = None
    return fn


def _call(fn, w: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    """The problem's ABI on fp32 activations x [B, K], quantised as the decoder does."""
    q, d, s, _ = quantize_rows(x)
    y = np.full((x.shape[0], n), np.nan, np.float32)
    args = [np.ascontiguousarray(a).ctypes.data_as(ctypes.c_void_p) for a in (w, q, d, s)]
    fn(*args, y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n), ctypes.c_int64(x.shape[1]),
       ctypes.c_int64(x.shape[0]))
    return y


def _activations(batch: int, k: int, seed: int) -> np.ndarray:
    x = torch.randn(batch, k, generator=torch.Generator().manual_seed(seed)).numpy() * 3
    x[0, :32] = 0.0  # an all-zero block
    if batch > 1:  # a block of exact ties for the rounding (127 / amax = 1): half to even
        x[1, :32] = np.array([127.0, 2.5, -3.5, 0.5, -0.5, 1.5] + [0.25] * 26, np.float32)
    return np.ascontiguousarray(x, np.float32)


@pytest.mark.parametrize("n", [1, 13, 64, 960])
def test_packed_inputs_are_the_engines_pack_of_the_same_blocks(problem, n):
    k = 96 if n < 960 else 576
    for dist in ("normal", "special"):
        inputs = problem.make_inputs({"n": n, "k": k, "batch": 2}, np.random.default_rng(n), dist)
        weight = _weight(n, k, n, special=dist == "special")  # make_inputs draws the blocks first
        assert np.array_equal(inputs["w"], pack(weight)[1].numpy().reshape(-1))
        q, d, m = unpack_q4_1(inputs["w"], n, k)  # the layout read back independently
        q0, d0, m0 = decode(weight.blocks().numpy().reshape(-1), n, k)
        assert np.array_equal(q, q0) and np.array_equal(d, d0) and np.array_equal(m, m0)


def test_quantised_activations_follow_quantize_row(problem):
    x = _activations(3, 96, 1)
    q, d, s, c = quantize_rows(x)
    assert q.dtype == np.int8 and d.dtype == s.dtype == np.float32
    assert not q[0, :32].any() and d[0, 0] == 0 and s[0, 0] == 0
    assert q[1, :6].tolist() == [127, 2, -4, 0, 0, 2]  # round half to even, like nearbyintf
    assert np.array_equal(s, d * q.reshape(3, 3, 32).sum(-1).astype(np.float32))
    assert np.array_equal(c, 128 * q.reshape(3, 3, 32).astype(np.int32).sum(-1))


@pytest.mark.parametrize("path", runnable_paths(), ids=lambda p: p.name)
def test_seed_equals_the_native_decoders_linear_bitwise(problem, path):
    """For each ISA path: decode.c's sf_linear (its own quantize_row and matmul_groups) and the
    seed built with the same flags on the ported quantisation give the same bits."""
    lib = load_library(path)
    fn = _build(problem, problem.render(), (*path.flags, *BASE_FLAGS))
    for n, k, batch in ((10, 96, 1), (10, 96, 17), (960, 576, 1), (960, 576, 4), (576, 1536, 16)):
        weight = _weight(n, k, seed=n + batch, special=batch == 17)
        x = _activations(batch, k, seed=batch)
        want = linear(lib, weight, torch.from_numpy(x), threads=3).numpy()
        got = _call(fn, pack(weight)[1].numpy(), x, n)
        assert np.array_equal(got, want), (path.name, n, k, batch, np.abs(got - want).max())


@pytest.mark.parametrize("knobs", [{}, {"bmax": 4, "offset": "fused", "unroll": 2},
                                   {"dot": "maddubs", "bmax": 1, "threads": "omp"}, {"dot": "portable"}],
                         ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "defaults")
def test_results_do_not_depend_on_batch_or_rows_in_the_call(problem, knobs):
    """The batch invariance the engine relies on: a row alone, in a batch (across the kernel's
    batch tiles) or with only part of the matrix in the call gives the same bits."""
    from swarmfactory.layouts import REC_Q4_1

    fn = _build(problem, problem.render(knobs), None)
    n, k, batch = 67, 288, 19
    w = pack(_weight(n, k, 5))[1].numpy()
    x = _activations(batch, k, 9)
    full = _call(fn, w, x, n)
    for b in (0, 5, batch - 1):
        assert np.array_equal(_call(fn, w, x[b:b + 1], n)[0], full[b])
    for b0, b1 in ((3, 7), (1, 18)):
        assert np.array_equal(_call(fn, w, x[b0:b1], n), full[b0:b1])
    g0, g1 = 2, 5  # row groups 2..4 alone: w offset to group 2, n its 24 rows
    part = _call(fn, np.ascontiguousarray(w.reshape(-1, k // 32 * REC_Q4_1)[g0:]), x, 8 * (g1 - g0))
    assert np.array_equal(part, full[:, 8 * g0:8 * g1])
