"""Linear layers on GGUF block weights, natively: the ``qnative`` kernel (``qlinear.c``).

Weights stay in their stored blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; parts of
one weight may differ in type); activations are quantised to 8 bits per call and every block
product is exact in integers (qlinear.c's header states the numerics and the error bound,
``Reference.bound`` computes it). Each ISA path this CPU runs (as masked by
SWARMFACTORY_CPU_MASK) is built with explicit flags through the C backend and checked against
an fp64 emulation of those numerics (``Reference``) on small random matrices of every type;
the first path that passes, in the fixed order of ``PATHS`` (best first), serves. A fixed
order, not a timing race at load: the choice must not change from run to run on a busy machine.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize

from swarmfactory.hardware import cpu_features, cpu_mask

from ..capabilities import fallback
from ..gguf_loader import QuantTensor
from ..kernels import KernelError, LinearKernel, Weight, register_kernel
from .isa import BASE_FLAGS, IsaPath, path_named
from .isa import PATHS as DECODER_PATHS
from .library import NativeUnavailable, first_passing

SYMBOL = "sf_qlinear"
QTYPES = frozenset({QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K})
K_QUANTS = frozenset({QT.Q4_K, QT.Q5_K, QT.Q6_K})
log = logging.getLogger("swarmfactory.engine")


def _paths() -> tuple[IsaPath, ...]:
    """The decoder's paths plus plain AVX-512 (BW/VL, no VNNI: its 32 registers hold more
    activation rows per pass), best first."""
    names = [p.name for p in DECODER_PATHS]
    if "avx512vnni" not in names:
        return DECODER_PATHS
    vnni = path_named("avx512vnni")
    avx512 = IsaPath("avx512", vnni.needs - {"avx512_vnni"}, ("-march=x86-64-v4",))
    return (vnni, avx512, *DECODER_PATHS[1:])


PATHS = _paths()


def runnable_paths(features: frozenset[str] | None = None) -> list[IsaPath]:
    """The paths this CPU (as masked) can execute, best first."""
    features = cpu_features() if features is None else features
    return [p for p in PATHS if not p.missing(features)]


class _Part(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int64), ("rows", ctypes.c_int64), ("row_bytes", ctypes.c_int64),
                ("data", ctypes.c_void_p), ("ext", ctypes.c_void_p), ("pack", ctypes.c_void_p)]


def source() -> str:
    """qlinear.c after the helpers it shares with decode.c (common.c), and the block step
    (qstep.c, which calls its kernels) after it: one translation unit, one library."""
    here = files(__package__)
    return (here.joinpath("common.c").read_text() + '#line 1 "qlinear.c"\n' + here.joinpath("qlinear.c").read_text()
            + '\n#line 1 "qstep.c"\n' + here.joinpath("qstep.c").read_text())


def load_library(path: IsaPath | tuple[str, ...]):
    """Build (or reuse) qlinear.c for one ISA path (a tuple is taken as raw compiler flags) and
    load it. Does not check it: see ``probe``."""
    from swarmfactory.backends.base import BuildError
    from swarmfactory.backends.c import CBackend

    flags = path if isinstance(path, tuple) else (*path.flags, *BASE_FLAGS)
    try:
        art = CBackend().build(source(), SYMBOL, tuple(flags))
    except BuildError as e:
        raise NativeUnavailable(f"native linear kernel did not build: {e}") from None
    lib = ctypes.CDLL(art.path, mode=ctypes.RTLD_LOCAL)
    i64, p, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.sf_qlinear.restype = c_int
    lib.sf_qlinear.argtypes = [p, i64, i64, i64, p, c_int, p, c_int, c_int]
    lib.sf_qlinear_isa.restype = ctypes.c_char_p
    lib.sf_qlinear_q32.restype = c_int
    lib.sf_qlinear_q32.argtypes = [i64, p, p, p, p, p, i64, i64, i64]
    lib.sf_qlinear_q32_packed.restype = c_int
    lib.sf_qlinear_q32_packed.argtypes = [i64, p, p, p, p, p, i64, i64, i64]
    lib.sf_qlinear_q256_packed.restype = c_int
    lib.sf_qlinear_q256_packed.argtypes = [i64, p, p, p, p, p, i64, i64, i64]
    lib.sf_qlinear_pack_bytes.restype = i64
    lib.sf_qlinear_pack_bytes.argtypes = [i64, i64, i64]
    lib.sf_qlinear_pack.restype = c_int
    lib.sf_qlinear_pack.argtypes = [i64, p, i64, i64, i64, p]
    lib.sf_qlinear_q256.restype = c_int
    lib.sf_qlinear_q256.argtypes = [i64, p, p, p, p, p, i64, i64, i64]
    f32 = ctypes.c_float  # the block step (qstep.c, native/qstep.py)
    lib.sf_qstep_new.restype = p
    lib.sf_qstep_new.argtypes = [i64, i64, i64, i64, i64, i64, i64, f32, f32, c_int, i64, i64, i64, i64, p, p, p,
                                 p, p, c_int]
    lib.sf_qstep.restype = c_int
    lib.sf_qstep.argtypes = [p, i64, p, p, p, i64, p, p]
    lib.sf_qstep_free.restype = None
    lib.sf_qstep_free.argtypes = [p]
    return lib


class Packed:
    """A weight's parts as the kernel reads them (the stored blocks, row-major) and the call."""

    def __init__(self, weight: Weight):
        for p in weight.parts:
            if p.qtype not in QTYPES:
                raise NativeUnavailable(f"{p.name} is {p.qtype.name}; the native linear kernel runs "
                                        f"{', '.join(sorted(q.name for q in QTYPES))}")
            block = GGML_QUANT_SIZES[p.qtype][0]
            if p.cols % block:
                raise NativeUnavailable(f"{p.name}: {p.cols} columns is not a multiple of {p.qtype.name}'s "
                                        f"block of {block}")
        self.blocks = [p.blocks().contiguous() for p in weight.parts]
        self.parts = (_Part * len(self.blocks))(*[_Part(int(p.qtype), p.rows, b.shape[1], b.data_ptr())
                                                  for p, b in zip(weight.parts, self.blocks)])
        self.n_parts, self.rows, self.cols = len(self.blocks), weight.rows, weight.cols
        self.exts = None  # the factory's kernels its parts point at (native/qext.py ``Exts.attach``)
        self.packs: list[torch.Tensor | None] = [None] * self.n_parts
        self.pack = True  # False: make no packed copies (``unpack``)

    def use(self, lib) -> "Packed":
        """Give each part the packed copy ``lib``'s kernel runs it on, where it runs one
        (qlinear.c ``sf_qlinear_pack``: every type but Q6_K on a build with vpdpbusd), made once; the stored
        blocks stay (the factory's kernels, the audit and the other builds read them). The layout
        is the same on every build that packs, so a copy made for one serves them all."""
        for i, (part, blocks) in enumerate(zip(self.parts, self.blocks)):
            if not self.pack or self.packs[i] is not None:
                continue
            size = lib.sf_qlinear_pack_bytes(part.type, part.rows, self.cols)
            if size <= 0:
                continue
            pack = torch.empty(size, dtype=torch.uint8)
            if lib.sf_qlinear_pack(part.type, blocks.data_ptr(), part.rows, part.row_bytes, self.cols,
                                   pack.data_ptr()):
                raise ValueError(f"sf_qlinear_pack refused part {i} ({part.rows} x {self.cols})")
            self.packs[i] = pack
            part.pack = pack.data_ptr()
        return self

    def unpack(self) -> "Packed":
        """Drop the packed copies and make no more: every part runs on its stored blocks (the
        kernel of a build without vpdpbusd; benchmarks compare the two)."""
        self.pack = False
        for part in self.parts:
            part.pack = None
        self.packs = [None] * self.n_parts
        return self

    @property
    def pack_bytes(self) -> int:
        """Bytes held by packed copies (beside the stored blocks)."""
        return sum(p.numel() for p in self.packs if p is not None)

    def __call__(self, lib, x: torch.Tensor, threads: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """y [M, rows] = x [M, cols] @ W.T; x fp32 or bf16, y in ``out_dtype`` (default x's)."""
        x = x.contiguous()
        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.float()
        out_dtype = out_dtype or x.dtype
        self.use(lib)
        y = torch.empty(x.shape[0], self.rows, dtype=out_dtype)
        rc = lib.sf_qlinear(self.parts, self.n_parts, self.cols, x.shape[0], x.data_ptr(),
                            x.dtype == torch.bfloat16, y.data_ptr(), out_dtype == torch.bfloat16, threads)
        if rc < 0:
            raise ValueError(f"sf_qlinear rejected its arguments ({rc}): x {tuple(x.shape)}, {self.n_parts} parts")
        if rc == 1 and self.exts is not None:  # a factory kernel failed its audit: y is the engine's own result
            self.exts.poll()
        return y


# --- the reference: gguf's dequantisation and an fp64 emulation of the kernel's numerics ---------

def dequantize(part: QuantTensor) -> torch.Tensor:
    """fp32 [rows, cols] by gguf-py's reference decoder (every block type)."""
    w = gguf_dequantize(part.blocks().contiguous().numpy(), part.qtype)
    return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).reshape(part.rows, part.cols)


def quantized_activations(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What the kernel multiplies by: (xq = d * q per element, d per element) in fp64, for
    activation blocks of ``block`` (32 or 256), computed in fp32 exactly as qlinear.c does."""
    M, K = x.shape
    xb = x.float().reshape(M, K // block, block)
    amax = xb.abs().amax(-1, keepdim=True)
    finite = torch.isfinite(xb).all(-1, keepdim=True)
    inv = torch.where((amax > 0) & finite, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round((xb * inv).clamp(-127, 127))
    d = torch.where(finite, amax / 127.0, torch.full_like(amax, float("nan")))
    return (q.double() * d.double()).reshape(M, K), d.double().expand_as(xb).reshape(M, K)


class Reference:
    """A weight dequantised by gguf-py (fp32 values, held in fp64) and what the kernel's result
    is checked against, per output [M, rows] in fp64."""

    def __init__(self, weight: Weight):
        self.parts = [(256 if p.qtype in K_QUANTS else 32, dequantize(p).double()) for p in weight.parts]

    def _each(self, x: torch.Tensor, fn) -> torch.Tensor:
        return torch.cat([fn(w, block) for block, w in self.parts], dim=1)

    def exact(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T (x as given, the fp32 weights)."""
        return self._each(x, lambda w, block: x.double() @ w.T)

    def emulate(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel's result in exact arithmetic: sum_i w_i xq_i."""
        return self._each(x, lambda w, block: quantized_activations(x, block)[0] @ w.T)

    def magnitude(self, x: torch.Tensor) -> torch.Tensor:
        """S = sum_i |w_i| |x_i|: the scale of fp32 rounding errors."""
        return self._each(x, lambda w, block: x.double().abs() @ w.abs().T)

    def bound(self, x: torch.Tensor, rel: float = 1e-5) -> torch.Tensor:
        """The documented bound of |y - x @ W.T| (qlinear.c's header): sum_i |w_i| d(i) / 2 (the
        activation rounding) + ``rel`` * S (fp32 arithmetic, a generous allowance)."""
        rounding = self._each(x, lambda w, block: (quantized_activations(x, block)[1] / 2) @ w.abs().T)
        return rounding * (1 + 1e-6) + rel * self.magnitude(x) + 1e-30


def error_bound(weight: Weight, x: torch.Tensor, rel: float = 1e-5) -> torch.Tensor:
    """``Reference(weight).bound(x, rel)``: the most |y - x @ W.T| may be, per output."""
    return Reference(weight).bound(x, rel)


# --- random blocks: for the probe, tests and benchmarks ------------------------------------------

# fp16 fields of each block: (byte offset, low, high, random sign); all other bytes are random
_SCALES = {
    QT.Q4_0: [(0, 1e-3, 5e-2, True)],
    QT.Q4_1: [(0, 1e-3, 5e-2, False), (2, -0.4, 0.0, False)],
    QT.Q5_0: [(0, 1e-3, 3e-2, True)],
    QT.Q5_1: [(0, 1e-3, 3e-2, False), (2, -0.5, 0.0, False)],
    QT.Q8_0: [(0, 1e-3, 1e-2, True)],
    QT.Q4_K: [(0, 1e-4, 2e-3, False), (2, 1e-4, 2e-3, False)],
    QT.Q5_K: [(0, 1e-4, 1e-3, False), (2, 1e-4, 2e-3, False)],
    QT.Q6_K: [(208, 1e-4, 2e-3, True)],
}


def random_part(qtype: QT, rows: int, cols: int, seed: int, name: str = "w") -> QuantTensor:
    """Random blocks of ``qtype`` (every quant bit pattern possible) with realistic finite scales."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    nb = cols // block
    raw = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)
    for off, lo, hi, signed in _SCALES[qtype]:
        v = rng.uniform(lo, hi, (rows, nb))
        if signed:
            v = v * rng.choice([-1.0, 1.0], (rows, nb))
        raw[..., off:off + 2] = v.astype(np.float16)[..., None].view(np.uint8)
    return QuantTensor(name, qtype, rows, cols, raw.reshape(rows, nb * size))


# --- the check at load, and the choice of path ---------------------------------------------------

PROBE_TOLERANCE = 1e-5  # of S per output: fp32 rounding only (a wrong term is far larger)


def check(lib, weight: Weight, x: torch.Tensor, threads: int = 1, out_dtype=None) -> float:
    """Largest |y - emulate| / S of one call (0 up to fp32 rounding for a correct build)."""
    got = Packed(weight)(lib, x, threads, out_dtype).double()
    if not torch.isfinite(got).all():
        return float("inf")
    ref, x = Reference(weight), x.float()
    return ((got - ref.emulate(x)).abs() / (ref.magnitude(x) + 1e-30)).max().item()


def probe(lib) -> str | None:
    """Every type (with an odd block count and passes of every size), a mixed-type weight, one
    shared by two threads, and bf16 activations, against ``Reference.emulate``: None if all
    match, else what did not."""
    gen = torch.Generator().manual_seed(7)
    cases = []
    for i, qt in enumerate(sorted(QTYPES)):
        cols = 512 if qt in K_QUANTS else 352
        cases.append((qt.name, Weight([random_part(qt, 13, cols, seed=i)]), cols, (1, 11)))
    mixed = Weight([random_part(QT.Q5_0, 9, 512, 20), random_part(QT.Q8_0, 5, 512, 21),
                    random_part(QT.Q6_K, 3, 512, 22)])
    cases.append(("Q5_0|Q8_0|Q6_K", mixed, 512, (1, 11)))
    # enough work for two threads (qlinear.c's MIN_WORK), the rows cut in chunks across parts
    pooled = Weight([random_part(QT.Q4_1, 100, 512, 23), random_part(QT.Q5_K, 60, 512, 24)])
    for name, weight, cols, Ms in cases + [("Q4_1|Q5_K, two threads", pooled, 512, (9,))]:
        for M in Ms:
            x = torch.randn(M, cols, generator=gen) * 3
            x[0, :32] = 0  # an all-zero block
            err = check(lib, weight, x, threads=2)
            if not err <= PROBE_TOLERANCE:
                return f"{name} M={M}: error {err:.2e} of sum |w||x| against the reference"
    x = torch.randn(3, 512, generator=gen).bfloat16()
    err = check(lib, mixed, x, 2, torch.bfloat16)
    if not err <= 1e-2:  # the bf16 result's rounding
        return f"bf16 activations: error {err:.2e} against the reference"
    return None


def load_checked(paths: list[IsaPath] | None = None):
    """The first of ``paths`` (default: those this CPU runs) that builds and passes ``probe``,
    with one log line for each that did not. Returns (lib, path, fallbacks); raises
    NativeUnavailable when none works."""
    return first_passing("native linear kernel", runnable_paths() if paths is None else paths, load_library, probe)


@dataclass(frozen=True)
class Loaded:
    lib: object = None
    isa: str = ""
    fallbacks: list[str] = field(default_factory=list)
    reason: str = ""  # why there is no library ("" when there is one)


@cache
def _loaded(mask: str | None) -> Loaded:
    try:
        lib, path, fallbacks = load_checked()
    except NativeUnavailable as e:
        fallback("native linear kernel", str(e), "the other kernels")
        return Loaded(reason=str(e))
    return Loaded(lib, path.name, fallbacks)


def loaded() -> Loaded:
    """This process's checked library for the current mask level (built and probed once)."""
    return _loaded(cpu_mask())


def packs(qtype: QT, lib=None) -> bool:
    """Whether ``lib`` (default: this process's checked build) runs ``qtype`` on packed copies
    (``sf_qlinear_pack``: every type but Q6_K where the CPU has vpdpbusd)."""
    lib = lib if lib is not None else loaded().lib
    return lib is not None and lib.sf_qlinear_pack_bytes(int(qtype), 8, 256) > 0


def engine_matmul_families(qtype: str) -> list[str]:
    """The ``<type>_engine_matmul`` problem families of GGUF type ``qtype`` (its name) whose kernels
    can run the engine's weights of that type here, best first: the one on the packed copies where
    this build packs the type (the stored one's yardstick is then the packed kernel), then the one
    on the stored blocks."""
    from ..config import ENGINE_MATMUL_FAMILIES, PACKED_MATMUL_FAMILIES

    mine = [f for f, t in ENGINE_MATMUL_FAMILIES.items() if t == qtype]
    return ([f for f in mine if f in PACKED_MATMUL_FAMILIES and packs(QT[qtype])]
            + [f for f in mine if f not in PACKED_MATMUL_FAMILIES])


def reset() -> None:
    """Forget the checked library (tests that change the mask or the probe)."""
    _loaded.cache_clear()


def default_for(weights: str, weight: Weight) -> str | None:
    """``"qnative"`` where the engine keeps weights quantised (``weights`` q4_1) and torch's int4
    kernel does not run this weight (any type but Q4_1, mixed types, or int4pack failing its
    probe here), every part is of ``QTYPES`` and this machine has a checked build; else None
    (``kernels.default_kernel`` decides as before: dense where nothing else runs). A Q8_0
    weight stays on torch's two int4 planes (int4x2, bf16 activations), although this kernel
    runs it 2.5-3.9x faster at 1-64 rows on an AVX2 core (benchmarks/qlinear.py): on the output
    head, its 8-bit activations flipped near-tied greedy tokens that int4x2 keeps (a top-two gap
    of 0.375 on SmolLM2). ``--kernel lm_head=qnative`` opts in."""
    from ..capabilities import check as capability

    if weights != "q4_1" or not weight.qtypes <= QTYPES:
        return None
    if any(p.cols % (256 if p.qtype in K_QUANTS else 32) for p in weight.parts):
        return None
    if capability("int4pack").ok and (weight.qtypes == {QT.Q4_1} or weight.qtypes == {QT.Q8_0}):
        return None
    return "qnative" if loaded().lib is not None else None


@register_kernel
class QNative(LinearKernel):
    """GGUF blocks of any of ``QTYPES`` (parts may differ) run by qlinear.c on the best checked
    ISA path, on torch's intra-op thread count. The stored blocks are kept (copied once, as
    stored); activations fp32 or bf16, results in the same dtype. Thread-safe: a call shares
    nothing with another."""

    name = "qnative"
    qtypes = QTYPES

    def __init__(self, weight: Weight, act_dtype: torch.dtype):
        super().__init__(weight, act_dtype)
        lib = loaded()
        if lib.lib is None:
            raise KernelError(f"kernel 'qnative' is unavailable here: {lib.reason}")
        try:
            self.packed = Packed(weight).use(lib.lib)
        except NativeUnavailable as e:
            raise KernelError(f"kernel 'qnative' cannot run {weight.name}: {e}") from None
        self.lib, self.isa = lib.lib, lib.isa
        # the call's constant arguments, bound once: at decode sizes the Python around the C
        # call is a good part of the time
        p = self.packed
        self._fn, self._parts, self._n = lib.lib.sf_qlinear, p.parts, p.n_parts
        self._bf16 = act_dtype == torch.bfloat16

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return self(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        if x.dtype != self.act_dtype or not x.is_contiguous():
            x = x.to(self.act_dtype).contiguous()
        y = torch.empty(x.shape[0], self.out_features, dtype=self.act_dtype)
        rc = self._fn(self._parts, self._n, self.in_features, x.shape[0], x.data_ptr(), self._bf16, y.data_ptr(),
                      self._bf16, torch.get_num_threads())
        if rc < 0:
            raise ValueError(f"sf_qlinear rejected x of shape {tuple(x.shape)}")
        if rc == 1:  # a factory kernel (native/qext.py) failed its audit: y is the engine's own result
            self.packed.exts.poll()
        return y
