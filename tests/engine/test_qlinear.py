"""The native linear kernel on GGUF blocks (engine/native/qlinear): every type on every ISA path
this CPU runs, against the fp32-dequantised reference within the documented bound and against
an exact emulation of its numerics; mixed-type weights; thread and batch invariance; the check
at load and its fallback; the ``qnative`` kernel behind the engine's kernel seam."""

import ctypes
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize as gguf_quantize

from swarmfactory.engine.gguf_loader import QuantTensor
from swarmfactory.engine.kernels import KernelError, Weight, kernel_class
from swarmfactory.engine.native import qlinear as ql
from swarmfactory.engine.native.isa import BASE_FLAGS
from swarmfactory.hardware import MASK_ENV, cpu_features

# Paths are tested on what the host can execute, whatever SWARMFACTORY_CPU_MASK says.
HOST = cpu_features(mask=None)
# The VNNI paths' arithmetic with vpdpbusd emulated exactly by AVX2: checked on any AVX2 host.
EMULATED_VNNI = ("-march=x86-64-v3", "-DSF_EMULATE_VNNI", *BASE_FLAGS)
TYPES = sorted(ql.QTYPES)


def _runnable():
    params = [pytest.param(p, id=p.name, marks=[pytest.mark.skip(reason=f"{p.name} needs {', '.join(p.missing(HOST))}")]
                           if p.missing(HOST) else []) for p in ql.PATHS]
    avx2 = [p for p in ql.PATHS if p.name == "avx2"]
    if avx2:
        skip = [pytest.mark.skip(reason="needs AVX2")] if avx2[0].missing(HOST) else []
        params.append(pytest.param(EMULATED_VNNI, id="avx2-emulated-vnni", marks=skip))
    return params


@pytest.fixture(scope="module", params=_runnable())
def lib(request):
    return ql.load_library(request.param)


def _x(M: int, K: int, seed: int) -> torch.Tensor:
    """Activations of one of several distributions (normal, uniform, huge, tiny, outliers)."""
    g = torch.Generator().manual_seed(seed)
    kind = seed % 5
    if kind == 0:
        x = torch.randn(M, K, generator=g) * 3
    elif kind == 1:
        x = torch.rand(M, K, generator=g) * 2 - 1
    elif kind == 2:
        x = torch.randn(M, K, generator=g) * 1e4
    elif kind == 3:
        x = torch.randn(M, K, generator=g) * 1e-6
    else:
        x = torch.randn(M, K, generator=g)
        x[:, ::97] *= 50  # a few large activations, as real hidden states have
    x[0, :32] = 0  # an all-zero block
    return x


def _assert_within_bound(weight: Weight, x: torch.Tensor, y: torch.Tensor, what: str, ref=None) -> None:
    ref = ref or ql.Reference(weight)
    bound = ref.bound(x)
    err = (y.double() - ref.exact(x)).abs()
    assert (err <= bound).all(), f"{what}: error {(err / bound).max():.3g} x the bound"
    w = torch.cat([w for _, w in ref.parts]).float()
    fp32 = F.linear(x, w).double()  # the fp32 reference itself: its own error is far inside the bound
    assert ((y.double() - fp32).abs() <= bound).all(), what
    tight = ((y.double() - ref.emulate(x)).abs() / (ref.magnitude(x) + 1e-30)).max().item()
    assert tight <= ql.PROBE_TOLERANCE, f"{what}: {tight:.2e} of S from the emulated numerics"


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in ql.PATHS]
                         + [pytest.param(EMULATED_VNNI, id="avx2-emulated-vnni")])
def test_every_isa_path_builds_here_even_where_it_cannot_run(path):
    """Compiling needs no CPU support (asking the ISA name runs no path-specific instruction)."""
    lib = ql.load_library(path)
    assert lib.sf_qlinear_isa().decode() == (path.name if isinstance(path, ql.IsaPath) else "avx2-emulated-vnni")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_type_is_within_the_documented_bound(lib, qtype):
    Ks = (256, 768) if qtype in ql.K_QUANTS else (32, 96, 640)  # one block, an odd count, Gemma's width
    for i, K in enumerate(Ks):
        weight = Weight([ql.random_part(qtype, 37, K, seed=i)])
        ref = ql.Reference(weight)
        for M in (1, 3, 17, 64):
            x = _x(M, K, seed=M + K)
            y = ql.Packed(weight)(lib, x, threads=2)
            assert y.shape == (M, 37) and y.dtype == torch.float32
            _assert_within_bound(weight, x, y, f"{qtype.name} K={K} M={M}", ref)


def test_quantised_gaussian_weights_are_within_the_bound(lib):
    """Blocks as gguf-py quantises real-looking weights (the symmetric types' scales negative)."""
    g = torch.Generator().manual_seed(5)
    for qtype in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0):
        w = (torch.randn(29, 320, generator=g) * 0.05).numpy()
        part = QuantTensor("w", qtype, 29, 320, gguf_quantize(w, qtype))
        x = _x(9, 320, seed=int(qtype))
        _assert_within_bound(Weight([part]), x, ql.Packed(Weight([part]))(lib, x, 1), qtype.name)


def test_mixed_type_parts_run_as_one_weight(lib):
    """A fused q|k|v as Gemma's Q4_K_M file stores it (Q5_0, Q5_0, Q8_0), and 32-element types
    beside K-quants: each part's rows are exactly what it gives alone."""
    for types, K in (((QT.Q5_0, QT.Q5_0, QT.Q8_0), 640), ((QT.Q4_K, QT.Q8_0, QT.Q6_K, QT.Q4_1), 512)):
        parts = [ql.random_part(t, rows, K, seed=i, name=f"p{i}")
                 for i, (t, rows) in enumerate(zip(types, (24, 8, 11, 5)))]
        weight = Weight(parts)
        x = _x(10, K, seed=K)
        y = ql.Packed(weight)(lib, x, threads=2)
        assert y.shape == (10, weight.rows)
        alone = torch.cat([ql.Packed(Weight([p]))(lib, x, threads=1) for p in parts], dim=1)
        assert torch.equal(y, alone)
        _assert_within_bound(weight, x, y, "+".join(t.name for t in types))


def test_results_do_not_depend_on_threads_or_on_the_other_rows(lib):
    # 310 rows x 16 blocks x 17 rows of x: work for 5 threads (qlinear.c's MIN_WORK), in chunks
    # that cross from one part to the next
    weight = Weight([ql.random_part(QT.Q5_1, 157, 512, 1), ql.random_part(QT.Q5_K, 153, 512, 2)])
    x = _x(17, 512, seed=3)
    packed = ql.Packed(weight)
    one = packed(lib, x, threads=1)
    for threads in (2, 3, 4):
        assert torch.equal(packed(lib, x, threads=threads), one)
    for m in (0, 8, 16):  # a row alone gives what it gave inside a batch of 17
        assert torch.equal(packed(lib, x[m:m + 1], threads=2), one[m:m + 1])
    assert torch.equal(packed(lib, x, threads=2), one)  # and again: no state carried over


def test_the_thread_pool_under_back_to_back_and_concurrent_calls(lib):
    """Hundreds of pooled calls in a row (helpers asleep, spinning or still finishing the last
    one), into poisoned outputs, and two callers at once (one gets the pool, the other runs
    alone): every output is the single-threaded one."""
    import threading

    packed = ql.Packed(Weight([ql.random_part(QT.Q8_0, 200, 640, 1), ql.random_part(QT.Q4_0, 56, 640, 2)]))
    xs = [_x(M, 640, seed=M) for M in (2, 5, 9)]  # 2 x 256 x 20 = 10k..46k products: 1 to 2 threads
    want = [packed(lib, x, threads=1) for x in xs]
    for i in range(300):
        x = xs[i % 3]
        y = torch.full((x.shape[0], 256), float("nan"))
        assert lib.sf_qlinear(packed.parts, packed.n_parts, 640, x.shape[0], x.data_ptr(), 0, y.data_ptr(), 0, 2) == 0
        assert torch.equal(y, want[i % 3]), i
    bad = []

    def caller(k: int) -> None:
        for i in range(100):
            if not torch.equal(packed(lib, xs[(i + k) % 3], threads=2), want[(i + k) % 3]):
                bad.append((k, i))

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_bf16_activations_give_the_fp32_result_rounded(lib):
    weight = Weight([ql.random_part(QT.Q6_K, 19, 512, 4), ql.random_part(QT.Q8_0, 7, 512, 5)])
    x = _x(5, 512, seed=0).bfloat16()
    y = ql.Packed(weight)(lib, x, threads=2)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, ql.Packed(weight)(lib, x.float(), threads=2).bfloat16())


def test_every_output_is_written_and_inputs_are_left_alone(lib):
    packed = ql.Packed(Weight([ql.random_part(QT.Q4_K, 9, 256, 6), ql.random_part(QT.Q4_0, 4, 256, 7)]))
    x = _x(6, 256, seed=1)
    x_before, blocks_before = x.clone(), [b.clone() for b in packed.blocks]
    y = torch.full((6 + 1, 13), float("nan"))  # poisoned, one spare row after the outputs
    rc = lib.sf_qlinear(packed.parts, packed.n_parts, 256, 6, x.data_ptr(), 0, y.data_ptr(), 0, 2)
    assert rc == 0
    assert torch.isfinite(y[:6]).all() and torch.isnan(y[6]).all()
    assert torch.equal(x, x_before) and all(torch.equal(a, b) for a, b in zip(packed.blocks, blocks_before))


def test_a_non_finite_activation_makes_its_outputs_nan(lib):
    packed = ql.Packed(Weight([ql.random_part(QT.Q5_0, 6, 256, 8), ql.random_part(QT.Q6_K, 6, 256, 9)]))
    x = _x(3, 256, seed=0)
    x[1, 40] = float("inf")
    x[2, 200] = float("nan")
    y = packed(lib, x, threads=1)
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1:]).all()


def test_bad_shapes_are_refused():
    with pytest.raises(ql.NativeUnavailable, match="block of 256"):
        ql.Packed(Weight([QuantTensor("w", QT.Q4_K, 4, 640, np.zeros((4, 360), np.uint8))]))
    with pytest.raises(ql.NativeUnavailable, match="F32"):
        ql.Packed(Weight([QuantTensor("w", QT.F32, 2, 32, np.zeros((2, 32), np.float32))]))
    lib = ql.load_library(ql.path_named("portable"))
    packed = ql.Packed(Weight([ql.random_part(QT.Q8_0, 4, 64, 0)]))
    x, y = torch.zeros(1, 96), torch.zeros(1, 4)  # K = 96: a row of the weight holds 64
    assert lib.sf_qlinear(packed.parts, 1, 96, 1, x.data_ptr(), 0, y.data_ptr(), 0, 1) == -1


def test_a_path_that_fails_its_check_falls_back_and_says_so(monkeypatch, caplog):
    paths = ql.runnable_paths(HOST)
    if len(paths) < 2:
        pytest.skip("this CPU runs only one native path")
    real = ql.probe
    monkeypatch.setattr(ql, "probe", lambda lib: "simulated wrong result"
                        if lib.sf_qlinear_isa().decode() == paths[0].name else real(lib))
    with caplog.at_level(logging.WARNING, logger="swarmfactory.engine"):
        lib, chosen, fallbacks = ql.load_checked(paths)
    assert chosen == paths[1] and lib.sf_qlinear_isa().decode() == paths[1].name
    assert caplog.text.count("failed its check") == 1
    assert f"{paths[0].name} path failed its check (simulated wrong result)" in caplog.text
    assert len(fallbacks) == 1


def test_the_probe_catches_a_wrong_build():
    """A build that drops Q5_0's fifth bit, and one that skips a row's blocks after its last
    whole group of 8."""
    from swarmfactory.backends.c import CBackend

    if ql.path_named("avx2").missing(HOST):
        pytest.skip("needs AVX2")
    five = "_mm256_or_si256(nibbles32(b + 6), bits32(b + 2))"
    for old, new in ((five, "nibbles32(b + 6)"),
                     ("for (; j < nb; j++) {", "for (; j < nb && 0; j++) {")):
        assert old in ql.source()
        art = CBackend().build(ql.source().replace(old, new), ql.SYMBOL, ("-march=x86-64-v3", *BASE_FLAGS))
        bad = ctypes.CDLL(art.path, mode=ctypes.RTLD_LOCAL)
        bad.sf_qlinear.restype = ctypes.c_int
        bad.sf_qlinear.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                   ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        assert ql.probe(bad) is not None


@pytest.mark.parametrize("level", ["portable", "avx2"])
def test_the_mask_forces_a_path(monkeypatch, level):
    if any(p.name == level and p.missing(HOST) for p in ql.PATHS):
        pytest.skip(f"this CPU cannot run {level}")
    monkeypatch.setenv(MASK_ENV, level)
    ql.reset()
    try:
        got = ql.loaded()
        assert got.isa == level and got.lib.sf_qlinear_isa().decode() == level and not got.fallbacks
        k = kernel_class("qnative")(Weight([ql.random_part(QT.Q4_K, 8, 256, 1)]), torch.float32)
        assert k.isa == level
    finally:
        monkeypatch.delenv(MASK_ENV)
        ql.reset()


def test_the_qnative_kernel_behind_the_seam():
    cls = kernel_class("qnative")
    weight = Weight([ql.random_part(QT.Q5_0, 16, 640, 1), ql.random_part(QT.Q8_0, 8, 640, 2)])
    for dtype in (torch.float32, torch.bfloat16):
        k = cls(weight, dtype)
        x = _x(4, 640, seed=0).to(dtype)
        before = x.clone()
        y = k(x)
        assert y.shape == (4, 24) and y.dtype == dtype and torch.equal(x, before)
        assert torch.equal(k(x.reshape(2, 2, 640)), y.reshape(2, 2, 24))
    with pytest.raises(KernelError, match="cannot run"):
        cls(Weight([QuantTensor("w", QT.F16, 2, 32, np.zeros((2, 32), np.float16))]), torch.float32)


def test_the_default_for_quantised_weights_torch_cannot_run():
    q4k = Weight([ql.random_part(QT.Q4_K, 8, 256, 1)])
    qkv = Weight([ql.random_part(QT.Q5_0, 8, 640, 2), ql.random_part(QT.Q8_0, 4, 640, 3)])
    assert ql.default_for("q4_1", q4k) == ql.default_for("q4_1", qkv) == "qnative"
    assert ql.default_for("fp32", q4k) is None and ql.default_for("bf16", qkv) is None  # dense stays dense
    q41, q80 = Weight([ql.random_part(QT.Q4_1, 8, 64, 4)]), Weight([ql.random_part(QT.Q8_0, 8, 64, 5)])
    from swarmfactory.engine.capabilities import check

    if check("int4pack").ok:  # torch's int4 kernels keep the types they run
        assert ql.default_for("q4_1", q41) is None and ql.default_for("q4_1", q80) is None
    assert ql.default_for("q4_1", Weight([QuantTensor("w", QT.F16, 2, 32, np.zeros((2, 32), np.float16))])) is None


def test_real_gemma_layers_are_within_the_bound(gemma_path):
    """Gemma 3 270M's Q4_K_M tensors: fused q|k|v (Q5_0, Q5_0, Q8_0 or Q5_0), attn_output (Q4_K),
    ffn_down (Q6_K or Q4_K) and a spread of the Q8_0 embedding's rows (the tied output head),
    on the best checked path, with real-looking activations."""
    from swarmfactory.engine.gguf_loader import load_gguf

    tensor = load_gguf(gemma_path).tensor

    lib = ql.loaded().lib
    weights = [Weight([tensor("token_embd.weight").take(np.arange(3, 262144, 331))])]
    for layer in (0, 1):  # between them every type of the file
        p = f"blk.{layer}."
        weights += [Weight([tensor(p + "attn_q.weight"), tensor(p + "attn_k.weight"), tensor(p + "attn_v.weight")]),
                    Weight([tensor(p + "attn_output.weight")]), Weight([tensor(p + "ffn_down.weight")])]
    assert set().union(*(w.qtypes for w in weights)) == {QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q6_K}
    for i, weight in enumerate(weights):
        x = _x(5, weight.cols, seed=4 + 5 * i)  # with outliers
        _assert_within_bound(weight, x, ql.Packed(weight)(lib, x, threads=2), weight.name)


# bytes of the packed copy per group of 8 rows and block: the 32-element types' stored bytes, Q4_K's
# and Q5_K's with their scales as bytes; Q6_K has none (it runs the stored layout)
PACK_BLOCK = {QT.Q4_0: 144, QT.Q4_1: 160, QT.Q5_0: 176, QT.Q5_1: 192, QT.Q8_0: 272,
              QT.Q4_K: 1184, QT.Q5_K: 1440, QT.Q6_K: 0}


def _mixed_for_packing() -> Weight:
    """Parts of every type, none of them a whole number of 8-row groups, so part boundaries fall
    inside groups; 304 rows of 512 columns: work for 4 threads at 17 rows of x (qlinear.c's
    MIN_WORK), in chunks that cross from one part to the next."""
    rows = {QT.Q4_0: 21, QT.Q8_0: 61, QT.Q4_K: 30, QT.Q5_1: 13, QT.Q5_0: 53, QT.Q6_K: 43, QT.Q4_1: 45, QT.Q5_K: 38}
    return Weight([ql.random_part(t, n, 512, 40 + i, f"w{i}") for i, (t, n) in enumerate(rows.items())])


def test_the_vnni_builds_pack_every_block_type_but_q6_k(lib):
    """A build with vpdpbusd (or its exact emulation) keeps a packed copy of every part but Q6_K's:
    groups of 8 rows (the last padded), PACK_BLOCK bytes a group and block; a build without keeps
    none."""
    vnni = "vnni" in lib.sf_qlinear_isa().decode()
    for qt in TYPES:
        blocks = 1536 // GGML_QUANT_SIZES[qt][0]
        assert lib.sf_qlinear_pack_bytes(int(qt), 13, 1536) == (2 * blocks * PACK_BLOCK[qt] if vnni else 0), qt.name
    weight = _mixed_for_packing()
    packed = ql.Packed(weight).use(lib)
    assert packed.pack_bytes == (sum(-(-p.rows // 8) * (512 // GGML_QUANT_SIZES[p.qtype][0]) * PACK_BLOCK[p.qtype]
                                     for p in weight.parts) if vnni else 0)


def test_packed_parts_are_within_the_bound_and_invariant_across_batches_and_threads(lib):
    weight = _mixed_for_packing()
    packed = ql.Packed(weight)
    ref = ql.Reference(weight)
    x = _x(17, 512, 4)
    one = packed(lib, x, threads=1)
    _assert_within_bound(weight, x, one, "mixed packed parts", ref)
    for threads in (2, 4):
        assert torch.equal(packed(lib, x, threads=threads), one)
    for M in (1, 2, 3, 5, 8, 9):
        y = packed(lib, x[:M], threads=2)
        _assert_within_bound(weight, x[:M], y, f"mixed packed parts, {M} rows", ref)
        assert torch.equal(y, one[:M]), M
    for m in (0, 7, 16):
        assert torch.equal(packed(lib, x[m:m + 1], threads=1), one[m:m + 1]), m


def test_the_packed_copy_is_what_a_vnni_build_reads(lib):
    """Zeroing one part's packed copy zeroes exactly that part's outputs: the kernel runs on the
    copies (the stored blocks, unchanged, serve the factory's kernels, the audit and Q6_K)."""
    if "vnni" not in lib.sf_qlinear_isa().decode():
        pytest.skip(f"the {lib.sf_qlinear_isa().decode()} build packs nothing")
    weight = _mixed_for_packing()
    packed = ql.Packed(weight)
    x = _x(9, 512, 0)
    before = packed(lib, x, threads=2)
    cols = [0]
    for part in weight.parts:
        cols.append(cols[-1] + part.rows)
    assert [p is None for p in packed.packs] == [part.qtype == QT.Q6_K for part in weight.parts]
    for i, part in enumerate(weight.parts):
        if packed.packs[i] is None:
            continue
        packed.packs[i].zero_()
        after = packed(lib, x, threads=2)
        assert (after[:, cols[i]:cols[i + 1]] == 0).all() and (before[:, cols[i]:cols[i + 1]] != 0).any(), part.name
        assert torch.equal(after[:, cols[i + 1]:], before[:, cols[i + 1]:]), part.name
        before = after


def test_unpack_runs_the_stored_blocks(lib):
    """``Packed.unpack`` drops the copies for good: the stored layout's kernel then serves every
    part (what benchmarks/qlinear.py compares), within the same bound."""
    weight = _mixed_for_packing()
    packed = ql.Packed(weight)
    x = _x(5, 512, 2)
    packed(lib, x, threads=2)
    packed.unpack()
    assert packed.pack_bytes == 0 and all(part.pack is None for part in packed.parts)
    y = packed(lib, x, threads=2)
    assert packed.pack_bytes == 0  # and no copy was made again
    _assert_within_bound(weight, x, y, "stored blocks after unpack")
    stored = ql.Packed(weight)
    stored.pack = False
    assert torch.equal(y, stored(lib, x, threads=2))
