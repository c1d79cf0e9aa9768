"""Build, load and check decode.c, and pack weights into its layout."""

from __future__ import annotations

import ctypes
import logging
from importlib.resources import files

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from ..gguf_loader import QuantTensor
from ..kernels import Weight
from swarmfactory.layouts import pack_records
from .isa import BASE_FLAGS, IsaPath, runnable_paths

SYMBOL = "sf_decode"
_TYPES = {QT.Q4_1: 0, QT.Q8_0: 1}
log = logging.getLogger("swarmfactory.engine")


class NativeUnavailable(RuntimeError):
    """The native decoder cannot run this model or machine; the message says why."""


class _Mat(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int64), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
                ("data", ctypes.c_void_p)]


def source() -> str:
    """decode.c after the helpers it shares with qlinear.c (common.c): one translation unit."""
    here = files(__package__)
    return (here.joinpath("common.c").read_text() + '#line 1 "decode.c"\n'
            + here.joinpath("decode.c").read_text())


class Ext(ctypes.Structure):
    """decode.c's Ext: an external q4_1_packed_matvec kernel and its audit (see decode.c)."""

    _fields_ = [("fn", ctypes.c_void_p), ("rtol", ctypes.c_float), ("atol", ctypes.c_float),
                ("seed", ctypes.c_uint64), ("bad", ctypes.c_int32), ("audit", ctypes.c_int32),
                ("share", ctypes.c_int64), ("seen", ctypes.c_uint64 * 16), ("calls", ctypes.c_int64), ("audited", ctypes.c_int64),
                ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("batch", ctypes.c_int64),
                ("row", ctypes.c_int64), ("b", ctypes.c_int64), ("got", ctypes.c_float), ("want", ctypes.c_float),
                ("bound", ctypes.c_float), ("why", ctypes.c_int32),
                ("packed", ctypes.c_int32)]

    def mismatch(self) -> str:
        """The first failure the audit found, in words ('' if none)."""
        if not self.bad:
            return ""
        if self.why == 2:
            return f"n={self.n} k={self.k} batch={self.batch}: the call changed its inputs (the activations)"
        if self.why == 3:
            return f"n={self.n} k={self.k} batch={self.batch}: the call wrote past its outputs"
        return (f"n={self.n} k={self.k} batch={self.batch}: output [{self.b}, {self.row}] was {self.got:.6g}, "
                f"the decoder's own loop gives {self.want:.6g} (allowed {self.atol:g} + {self.rtol:g} * |that| + "
                f"{self.bound:.3g} for the size of its terms)")


def load_library(path: IsaPath | tuple[str, ...] | None = None):
    """Build (or reuse) decode.c for one ISA path (default: the best this CPU runs; a tuple is
    taken as raw compiler flags) and load it with ctypes. Does not check it: see ``probe``."""
    from swarmfactory.backends.base import BuildError
    from swarmfactory.backends.c import CBackend

    if path is None:
        path = runnable_paths()[0]
    flags = path if isinstance(path, tuple) else (*path.flags, *BASE_FLAGS)
    try:
        art = CBackend().build(source(), SYMBOL, tuple(flags))
    except BuildError as e:
        raise NativeUnavailable(f"native decoder did not build: {e}") from None
    lib = ctypes.CDLL(art.path, mode=ctypes.RTLD_LOCAL)
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.sf_model_new.restype = p
    lib.sf_model_new.argtypes = [i64] * 7 + [ctypes.c_float] + [i64] * 3 + [p, p, p, p, ctypes.c_int, p]
    lib.sf_decode.restype = ctypes.c_int
    lib.sf_decode.argtypes = [p, i64, p, p, p, i64, p, p]
    lib.sf_model_free.restype = None
    lib.sf_model_free.argtypes = [p]
    lib.sf_isa.restype = ctypes.c_char_p
    lib.sf_linear.restype = ctypes.c_int
    lib.sf_linear.argtypes = [p, i64, p, p, ctypes.c_int, p]
    return lib


def random_tensor(qtype: QT, rows: int, cols: int, seed: int) -> QuantTensor:
    """Random Q4_1 or Q8_0 blocks with realistic scales: for probes and tests."""
    rng = np.random.default_rng(seed)
    nb = cols // 32
    if qtype == QT.Q4_1:
        blocks = np.zeros((rows, nb, 20), np.uint8)
        blocks[..., 0:2] = rng.uniform(0.001, 0.05, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
        blocks[..., 2:4] = rng.uniform(-0.4, 0.0, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
        blocks[..., 4:] = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    else:
        blocks = np.zeros((rows, nb, 34), np.uint8)
        blocks[..., 0:2] = rng.uniform(0.001, 0.01, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
        blocks[..., 2:] = rng.integers(-128, 128, (rows, nb, 32), dtype=np.int8).view(np.uint8)
    return QuantTensor("w", qtype, rows, cols, blocks.reshape(rows, -1))


def reference_linear(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """What sf_linear computes, in fp64: x quantised to int8 per block of 32, then x @ w.T."""
    xb = x.view(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    q = torch.where(amax > 0, torch.round(xb * (127.0 / amax)), torch.zeros_like(xb)).clamp(-127, 127)
    xq = (q.double() * (amax.double() / 127.0)).view_as(x)
    return xq @ w.double().T


def linear_error(lib, qtype: QT, rows: int, cols: int, batch: int, seed: int, threads: int = 1,
                 ext: Ext | None = None) -> float:
    """Largest error of sf_linear against ``reference_linear`` on random blocks, relative to
    sum |w||x| per output (0 up to fp32 rounding for a correct build)."""
    t = random_tensor(qtype, rows, cols, seed)
    x = torch.randn(batch, cols, generator=torch.Generator().manual_seed(seed)) * 3
    x[0, :32] = 0  # an all-zero block
    w = t.dequantize()
    got = linear(lib, Weight([t]), x, threads, ext).double()
    scale = (w.abs().double() @ x.abs().double().T).T + 1e-3
    return ((got - reference_linear(w, x)).abs() / scale).max().item()


PROBE_TOLERANCE = 1e-5


def probe(lib, ext: Ext | None = None) -> str | None:
    """Run a build once on tiny matrices (Q4_1 and Q8_0, a padded row group, batches that fill
    and overflow a pass), with ``ext``'s kernel if given; None if it matches the reference,
    else what went wrong."""
    for qtype in (QT.Q4_1, QT.Q8_0):
        for batch in (1, 17):
            err = linear_error(lib, qtype, rows=10, cols=96, batch=batch, seed=batch + int(qtype), ext=ext)
            if not err <= PROBE_TOLERANCE:
                return f"{qtype.name} batch {batch}: error {err:.2e} against the reference"
    return None


def load_checked(paths: list[IsaPath] | None = None):
    """The best path that builds and passes ``probe``, falling back down the list with one log
    line per path that failed. Returns (lib, path, fallbacks); raises NativeUnavailable when
    none works."""
    return first_passing("native decoder", runnable_paths() if paths is None else paths, load_library, probe)


def first_passing(what: str, paths: list[IsaPath], load, probe):
    """The first of ``paths`` whose library ``load(path)`` builds and ``probe(lib)`` passes (None),
    with one log line naming ``what`` for each that did not: (lib, path, fallbacks). Raises
    NativeUnavailable when none works, or at once where there is no C compiler."""
    from swarmfactory.backends.c import CBackend

    backend = CBackend()
    if backend.versions()["cc_version"] == "missing":
        raise NativeUnavailable(f"{what} did not build: C compiler {backend.cc!r} not found "
                                "(install gcc or set CC)")
    fallbacks: list[str] = []
    for path in paths:
        try:
            lib = load(path)
            bad = probe(lib)
        except NativeUnavailable as e:
            bad = str(e)
        if bad is None:
            return lib, path, fallbacks
        msg = f"{what}: {path.name} path failed its check ({bad})"
        fallbacks.append(msg)
        log.warning("%s; trying the next path", msg)
    raise NativeUnavailable("; ".join(fallbacks) or "no native ISA path runs on this CPU")


def linear(lib, weight: Weight, x: torch.Tensor, threads: int = 1, ext: Ext | None = None) -> torch.Tensor:
    """x [B, K] fp32 @ weight.T with the decoder's numerics (int8 activations), on ``ext``'s
    kernel if given (its audit then runs as in a decode step): for tests and for checking a
    machine's build, or a kernel, against a reference."""
    mat, keep = pack(weight)
    x = x.float().contiguous()
    y = torch.empty(x.shape[0], weight.rows, dtype=torch.float32)
    rc = lib.sf_linear(ctypes.byref(mat), x.shape[0], x.data_ptr(), y.data_ptr(), threads,
                       ctypes.byref(ext) if ext is not None else None)
    if rc < 0:
        raise ValueError("sf_linear rejected its arguments")
    return y


def pack(weight: Weight) -> tuple[_Mat, torch.Tensor]:
    """The weight in decode.c's layout (``layouts.pack_records``, see its Mat comment):
    groups of 8 rows interleaved by quads of 4 elements, one record per block of 32 columns with
    the rows' fp16 scales after the quants (Q4_1: 128 + 16 + 16 bytes; Q8_0, w + 128 stored
    unsigned: 256 + 16 bytes)."""
    qt = weight.qtype
    if qt not in _TYPES:
        got = ", ".join(sorted(q.name for q in weight.qtypes))
        raise NativeUnavailable(f"native decoder needs Q4_1 or Q8_0 weights; {weight.name} is {got}")
    if weight.cols % 32:
        raise NativeUnavailable(f"{weight.name}: {weight.cols} columns is not a multiple of 32")
    blocks = weight.blocks().contiguous().numpy().reshape(weight.rows, weight.cols // 32, -1)
    rec = torch.from_numpy(pack_records(blocks, "q4_1" if qt == QT.Q4_1 else "q8_0"))
    return _Mat(_TYPES[qt], weight.rows, weight.cols, rec.data_ptr()), rec
