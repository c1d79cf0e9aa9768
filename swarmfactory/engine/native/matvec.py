"""The kernel factory's q4_1_packed_matvec inside the native decoder (``EngineConfig.native_matvec``).

``champion:q4_1_packed_matvec`` names the current champion of that problem for this hardware,
``champion:q4_1_packed_matvec@ID`` pins candidate ID. The engine's ``KernelSupply``
(``engine/supply.py``; the corridor ``swarmfactory/champions.py``, with its one rule on which
candidate may run here) hands the candidate built as the harness built it. The decoder, one
build per ISA path whatever the kernel, calls it through a function pointer (``library.Ext``);
it is a separate shared object, so the kernel cannot name anything of the decoder's. Before the
engine uses it, the decoder with the kernel must pass the decoder's probe (``library.probe``)
and the batch-invariance check (``probe_matvec``), run on the kernel's raw outputs. While it
serves, its calls are audited (decode.c, ``engine/audit.py``): at the first wrong output it is
dropped for good and reported to the supply. Any failure at load is an error naming the
candidate: a config that asks for a kernel never silently runs another.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from ..config import NATIVE_MATVEC_PROBLEM as PROBLEM
from ..config import parse_native_matvec as parse
from ..kernels import Weight
from ..supply import BuiltKernel, KernelSupply, NoSupply, UnavailableKernel
from .isa import IsaPath
from .library import Ext, NativeUnavailable, linear, load_library, probe, random_tensor

SIGNATURE = ("void q4_1_packed_matvec(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, "
             "float *y, int64_t n, int64_t k, int64_t batch)")


def label(mv: BuiltKernel) -> str:
    return f"{PROBLEM} candidate {mv.candidate}"


def describe(mv: BuiltKernel) -> dict:
    """The kernel as the engine's paths report it."""
    d = {"spec": mv.spec, "candidate": mv.candidate, "origin": mv.origin}
    if mv.speedup is not None:
        d["speedup"] = mv.speedup
    return d


def resolve(spec: str, supply: KernelSupply | None) -> BuiltKernel:
    """The candidate ``spec`` names, built by ``supply``; NativeUnavailable naming it if not."""
    parse(spec)
    try:
        return (supply or NoSupply()).build(spec, SIGNATURE)
    except UnavailableKernel as e:
        raise NativeUnavailable(str(e)) from None


def probe_matvec(lib, ext: Ext) -> str | None:
    """The decoder's batch invariance with ``ext``'s kernel: each row's outputs bitwise the same
    alone, in a batch (across any batch tiling) and on 1 or 3 threads (other row splits). None
    if so, else what differed."""
    for rows, cols in ((10, 96), (67, 288)):
        weight = Weight([random_tensor(QT.Q4_1, rows, cols, seed=rows)])
        x = torch.randn(19, cols, generator=torch.Generator().manual_seed(cols)) * 3
        full = linear(lib, weight, x, threads=3, ext=ext).numpy()
        if not np.array_equal(linear(lib, weight, x, threads=1, ext=ext).numpy(), full):
            return f"Q4_1 [{rows} x {cols}]: outputs differ between 1 and 3 threads"
        for b in (0, 7, 18):
            if not np.array_equal(linear(lib, weight, x[b:b + 1], threads=3, ext=ext).numpy()[0], full[b]):
                return f"Q4_1 [{rows} x {cols}]: row {b} alone differs from the same row in a batch of 19"
    return None


# The audit checks the first call at each batch size and 1 in AUDIT_SHARE of the others: a
# decode step makes ~240 calls on SmolLM2 (2 threads), so a kernel wrong in some of them is
# still caught in the first step it is wrong in with near certainty; every call (1) cost
# 2-6% of a step on this kernel, 1 in 4 costs about a quarter of that (benchmarks/kernel_audit.py).
AUDIT_SHARE = 4


class External:
    """The decoder library for one ISA path with a factory kernel: what ``NativeDecoder`` takes
    as ``lib``. ``ext`` is the kernel and its audit state for the models built on it (one per
    load: a kernel dropped by one engine's audit is dropped for that engine)."""

    def __init__(self, lib, mv: BuiltKernel, kernel, on_wrong, audit: bool = True):
        self.lib, self.matvec, self._kernel = lib, mv, kernel  # the handle keeps the kernel loaded
        self.on_wrong = on_wrong
        self.fn = ctypes.cast(getattr(kernel, PROBLEM), ctypes.c_void_p).value
        self.ext = self.new_ext(audit)
        self.reported: str | None = None  # what on_wrong said, once the kernel was dropped

    def new_ext(self, audit: bool, share: int = AUDIT_SHARE) -> Ext:
        # the audit's tolerance: the kernel and the built-in loop are each within the problem's
        # tolerance of the exact result, so within twice that of each other (decode.c adds a
        # term for the size of an output's terms)
        return Ext(fn=self.fn, rtol=2 * self.matvec.rtol, atol=2 * self.matvec.atol,
                   seed=int.from_bytes(os.urandom(8), "little"), audit=int(audit), share=share)

    def __getattr__(self, name):  # the library's functions
        return getattr(self.lib, name)

    def dropped(self) -> str | None:
        """None while the kernel runs; once the audit caught it, what was reported (once)."""
        if not self.ext.bad:
            return None
        if self.reported is None:
            e = self.ext
            self.reported = self.on_wrong(PROBLEM, self.matvec.candidate, {"n": e.n, "k": e.k, "batch": e.batch},
                                          e.mismatch())
        return self.reported



def load(mv: BuiltKernel, path: IsaPath, on_wrong) -> External:
    """The decoder for ``path`` with ``mv``'s kernel, checked; NativeUnavailable naming the
    candidate where it does not load or fails a check. ``on_wrong``: the supply's, called once
    if the audit catches the kernel while serving."""
    lib = load_library(path)
    try:
        kernel = ctypes.CDLL(mv.path, mode=ctypes.RTLD_LOCAL)
        getattr(kernel, PROBLEM)
    except (OSError, AttributeError) as e:
        raise NativeUnavailable(f"{mv.spec}: cannot load {label(mv)} ({mv.path}): {e}") from None
    out = External(lib, mv, kernel, on_wrong)
    raw = out.new_ext(audit=False)  # the checks judge the kernel's own outputs
    bad = probe(lib, raw) or probe_matvec(lib, raw)
    if bad is None and raw.calls == 0:
        bad = "the decoder never called it"
    if bad is not None:
        raise NativeUnavailable(f"{mv.spec}: the native decoder with {label(mv)} ({path.name} path) failed its "
                                f"check ({bad}); it is not used")
    return out


__all__ = ["PROBLEM", "SIGNATURE", "External", "describe", "label", "load", "parse", "probe_matvec", "resolve"]
