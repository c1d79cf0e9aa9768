"""The kernel factory's ``<type>_engine_matmul`` kernels inside the engine's native block kernels
(``EngineConfig.native_matmul``).

Those problems (problems/suites/cpu/qengine.py) have the engine's own numerics for a linear
layer on a GGUF block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; Q4_K, Q5_K, Q6_K): the stored blocks
and activations already quantised to 8 bits per block of 32 (per 256 with sums per 16 for the
K-quants), each block product exact in integers. qlinear.c's ``sf_qlinear_q32`` and
``sf_qlinear_q256`` are the engine's kernels with those ABIs (their yardsticks), so a
champion competes with what the engine runs and, named here, replaces it for every weight part of
its type: in ``qnative`` ops and in the block step (``qstep.c``), wherever qlinear.c's kernels run.

``champion:q8_0_engine_matmul`` (or ``champion:q8_0_engine_matmul.MODEL``, the problem derived
from a model; ``@ID`` pins a candidate) names one type's kernel; several types' are joined with
``+``. The corridor (``champions.py``, handed in as the engine's ``KernelSupply``) builds the
candidate as the harness built it. qlinear.c calls it through a pointer in each part (``QExt``),
in pieces of at most 256 weight rows, each thread's run of calls on its private copy of the
activations; a ``<type>_engine_packed_matmul`` kernel (qengine_packed.py) is called on the part's
packed copy instead of its stored blocks, in pieces from a group's first row, and is refused where
the engine's build keeps the type as stored. Before the
engine uses it: qlinear's probe cases of its type with the kernel against the fp64 emulation of
the numerics, and a batch-invariance check (each row alone and in a batch of 19, on 1 and 3
threads, rows split across calls), on the kernel's raw outputs. While it serves, every call's
guard floats and each thread's private activations after its run of calls are checked, and the
first call at each batch size and 1 in ``AUDIT_SHARE`` of the others have one random row
recomputed by the engine's own kernel; at the
first fault the kernel is dropped for good, the call (or the whole block step) runs again on the
engine's kernels and the supply is told once (``engine/audit.py``).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from ..config import ENGINE_MATMUL_FAMILIES, PACKED_MATMUL_FAMILIES, parse_native_matmul
from ..kernels import Weight
from ..supply import BuiltKernel, KernelSupply, NoSupply, UnavailableKernel
from .library import Ext, NativeUnavailable
from .qlinear import K_QUANTS, PROBE_TOLERANCE, Packed, Reference, packs, random_part

# The audit checks the first call at each batch size and 1 in AUDIT_SHARE of the others: each call
# is up to 256 weight rows (a Gemma 3 decode step makes ~1,400), the audit one row of it. 1 in 4
# (the decoder's matvec's share) cost 5% of a step of 16 or 64 sequences with the private copy
# per call (benchmarks: docs/engine.md); a kernel wrong at some shape is still caught in the
# first step that calls it there, with near certainty.
AUDIT_SHARE = 16


def signature(family: str) -> str:
    """The C declaration of ``family``'s kernel: activations per block of 32 with their offset
    terms, or (the K-quants) per block of 256 with their sums per 16."""
    if QT[ENGINE_MATMUL_FAMILIES[family]] in K_QUANTS:
        return (f"void {family}(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *bsums, "
                "float *y, int64_t n, int64_t k, int64_t batch)")
    return (f"void {family}(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, float *y, "
            "int64_t n, int64_t k, int64_t batch)")


class Kernel:
    """One type's external kernel: the built candidate, its loaded library and its ``Ext``."""

    def __init__(self, built: BuiltKernel, qtype: QT, family: str, audit: bool = True):
        self.built, self.qtype, self.family = built, qtype, family
        self.packed = family in PACKED_MATMUL_FAMILIES  # it takes a part's packed copy
        try:
            self._so = ctypes.CDLL(built.path, mode=ctypes.RTLD_LOCAL)
            fn = getattr(self._so, family)
        except (OSError, AttributeError) as e:
            raise NativeUnavailable(f"{built.spec}: cannot load {self.label} ({built.path}): {e}") from None
        self.fn = ctypes.cast(fn, ctypes.c_void_p).value
        self.ext = self.new_ext(audit)
        self.reported: str | None = None

    @property
    def label(self) -> str:
        return f"{self.built.problem} candidate {self.built.candidate}"

    def new_ext(self, audit: bool) -> Ext:
        # the kernel and the engine's own are each within the problem's tolerance of the exact
        # result, so within twice that of each other (plus qlinear.c's term for the size of the
        # output's terms)
        return Ext(fn=self.fn, rtol=2 * self.built.rtol, atol=2 * self.built.atol,
                   seed=int.from_bytes(os.urandom(8), "little"), audit=int(audit), share=AUDIT_SHARE,
                   packed=int(self.packed))

    def mismatch(self) -> str:
        """The first fault the audit found, in words ('' if none)."""
        e = self.ext
        if not e.bad:
            return ""
        if e.why in (2, 3):
            return (f"n={e.n} k={e.k} batch={e.batch}: the call "
                    + ("changed its inputs (the activations)" if e.why == 2 else "wrote past its outputs"))
        return (f"n={e.n} k={e.k} batch={e.batch}: output [{e.b}, {e.row}] was {e.got:.6g}, the engine's own "
                f"kernel gives {e.want:.6g} (allowed {e.atol:g} + {e.rtol:g} * |that| + {e.bound:.3g} for the size "
                "of its terms)")

    def describe(self) -> dict:
        d = {"spec": self.built.spec, "problem": self.built.problem, "candidate": self.built.candidate,
             "origin": self.built.origin}
        if self.built.speedup is not None:
            d["speedup"] = self.built.speedup
        return d


class Exts:
    """The external kernels of one engine, by block type; ``attach`` points weights at them."""

    def __init__(self, kernels: list[Kernel], on_wrong):
        self.kernels = {k.qtype: k for k in kernels}
        self.on_wrong = on_wrong

    def attach(self, packed: Packed) -> int:
        """Point every part of ``packed`` of a type with a kernel at it; returns how many."""
        n = 0
        for part in packed.parts:
            k = self.kernels.get(QT(part.type))
            if k is not None:
                part.ext = ctypes.addressof(k.ext)
                n += 1
        packed.exts = self  # the Ext structures live as long as the weights that point at them
        return n

    def poll(self) -> list[str]:
        """What was reported for each kernel dropped since the last poll (once per kernel)."""
        out = []
        for k in self.kernels.values():
            e = k.ext
            if e.bad and k.reported is None:
                k.reported = self.on_wrong(k.built.problem, k.built.candidate,
                                           {"n": e.n, "k": e.k, "batch": e.batch}, k.mismatch())
                out.append(k.reported)
        return out

    def audit_state(self) -> dict:
        self.poll()
        return {k.qtype.name: {"calls": k.ext.calls, "audited": k.ext.audited, "dropped": k.reported,
                               "audit": bool(k.ext.audit), "candidate": k.built.candidate}
                for k in self.kernels.values()}

    def describe(self) -> dict:
        return {k.qtype.name: k.describe() for k in self.kernels.values()}


def resolve(spec: str, supply: KernelSupply | None) -> list[tuple[BuiltKernel, QT, str]]:
    """The candidates ``spec`` names, built by ``supply``; NativeUnavailable naming one if not."""
    out = []
    for ref in parse_native_matmul(spec):
        family = ref.target.partition(".")[0]
        try:
            built = (supply or NoSupply()).build(ref.spec, signature(family))
        except UnavailableKernel as e:
            raise NativeUnavailable(str(e)) from None
        out.append((built, QT[ENGINE_MATMUL_FAMILIES[family]], family))
    return out


def _call(lib, packed: Packed, x: torch.Tensor, threads: int) -> torch.Tensor:
    y = torch.empty(x.shape[0], packed.rows, dtype=torch.float32)
    rc = lib.sf_qlinear(packed.parts, packed.n_parts, packed.cols, x.shape[0], x.data_ptr(), 0, y.data_ptr(), 0,
                        threads)
    if rc < 0:
        raise ValueError(f"sf_qlinear rejected its arguments ({rc})")
    return y


def check(lib, k: Kernel) -> str | None:
    """The kernel's raw outputs (audit off) against the fp64 emulation of the numerics, and its
    batch invariance; None if both hold, else what failed."""
    raw = k.new_ext(audit=False)
    gen = torch.Generator().manual_seed(11)
    qt = k.qtype

    if k.packed and not packs(qt, lib):
        return (f"this CPU's build of the engine keeps {qt.name} weights as stored (no packed copy): a kernel of "
                "the packed layout would run nowhere")

    def packed(rows: int | tuple[int, ...], cols: int, seed: int) -> tuple[Packed, Weight]:
        weight = Weight([random_part(qt, r, cols, seed=seed + i, name=f"w{i}")
                         for i, r in enumerate(rows if isinstance(rows, tuple) else (rows,))])
        p = Packed(weight).use(lib)  # the packed copies the engine makes at load, where it makes them
        for part in p.parts:
            part.ext = ctypes.addressof(raw)
        return p, weight

    # qlinear's probe cases of this type (an odd block count, passes of every size, an all-zero
    # block), two threads, a weight of more rows than one call takes (pieces of 256), and one of
    # three parts whose later ones start inside a group of 8 rows (a fused q|k|v)
    wide = qt in K_QUANTS  # k a multiple of 256
    for rows, cols, Ms in ((13, 512 if wide else 352, (1, 11)), (300, 256 if wide else 96, (1, 5)),
                           (67, 1024, (19,)), ((13, 270, 21), 256 if wide else 96, (6,))):
        p, weight = packed(rows, cols, sum(rows) + cols if isinstance(rows, tuple) else rows + cols)
        ref = Reference(weight)
        for M in Ms:
            x = torch.randn(M, cols, generator=gen) * 3
            x[0, :32] = 0
            got = _call(lib, p, x, 2).double()
            if not torch.isfinite(got).all():
                return f"{qt.name} [{rows} x {cols}], {M} rows: non-finite outputs"
            err = ((got - ref.emulate(x)).abs() / (ref.magnitude(x) + 1e-30)).max().item()
            if not err <= PROBE_TOLERANCE:
                return f"{qt.name} [{rows} x {cols}], {M} rows: error {err:.2e} of sum |w||x| against the reference"
    # batch invariance: the engine's calls cut rows and batches as threads and steps fall
    for rows, cols in ((10, 256 if wide else 96), (300, 512 if wide else 288)):
        p, _ = packed(rows, cols, rows)
        x = torch.randn(19, cols, generator=torch.Generator().manual_seed(cols)) * 3
        full = _call(lib, p, x, 3).numpy()
        if not np.array_equal(_call(lib, p, x, 1).numpy(), full):
            return f"{qt.name} [{rows} x {cols}]: outputs differ between 1 and 3 threads"
        for b in (0, 7, 18):
            if not np.array_equal(_call(lib, p, x[b:b + 1], 3).numpy()[0], full[b]):
                return f"{qt.name} [{rows} x {cols}]: row {b} alone differs from the same row in a batch of 19"
    if raw.calls == 0:
        return "the engine never called it"
    return None


def load(spec: str, lib, supply: KernelSupply | None) -> Exts:
    """The kernels ``spec`` names, loaded and checked against ``lib`` (qlinear's checked build);
    NativeUnavailable naming the candidate where one does not load or fails a check."""
    kernels = []
    for built, qt, family in resolve(spec, supply):
        k = Kernel(built, qt, family)
        bad = check(lib, k)
        if bad is not None:
            raise NativeUnavailable(f"{built.spec}: the native block kernels with {k.label} failed their check "
                                    f"({bad}); it is not used")
        kernels.append(k)
    return Exts(kernels, (supply or NoSupply()).on_wrong)


__all__ = ["AUDIT_SHARE", "Exts", "Kernel", "check", "load", "resolve", "signature"]
