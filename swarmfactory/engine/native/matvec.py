"""The kernel factory's q4_1_packed_matvec inside the native decoder (``EngineConfig.native_matvec``).

``champion:q4_1_packed_matvec`` names the evidence store's current champion of that problem for
this hardware; ``champion:q4_1_packed_matvec@ID`` pins candidate ID, which must have a correct
evaluation (not_faster, faster, verified or inconclusive) of the current problem on this
hardware, and no later failing one. Either is refused when the candidate's confirmation (its
latest ``faster`` measurement holding the title, ``swarm/succession.py``) was measured on a busy
machine. The store is ``$SWARMFACTORY_STORE``, else ``.swarmfactory/evidence.db``.

The candidate's source passes the harness's static check and is built exactly as the harness
built it (default flags, the ABI declared ahead, the checks on what the compiler produced: the
same cached shared object). The decoder, one build per ISA path whatever the kernel, calls it
through a function pointer (``library.Ext``); it is a separate shared object, so the kernel
cannot name anything of the decoder's. Before the engine uses it, the decoder with the kernel
must pass the decoder's probe (``library.probe``) and the batch-invariance check
(``probe_matvec``), run on the kernel's raw outputs. While it serves, its calls are audited
(decode.c, ``engine/audit.py``): at the first wrong output it is dropped for good and reported.
Any failure at load is an error naming the candidate: a config that asks for a kernel never
silently runs another.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from swarmfactory.harness.outcome import CORRECT

from ..config import NATIVE_MATVEC_PROBLEM as PROBLEM
from ..config import parse_native_matvec as parse
from ..kernels import Weight
from .isa import IsaPath
from .library import Ext, NativeUnavailable, linear, load_library, probe, random_tensor

SIGNATURE = ("void q4_1_packed_matvec(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, "
             "float *y, int64_t n, int64_t k, int64_t batch)")


@dataclass(frozen=True)
class Matvec:
    """One candidate of q4_1_packed_matvec, ready to compile into the decoder."""

    spec: str  # as the config names it
    candidate: str
    source: str
    origin: str  # the store
    path: str  # the shared object the harness's build made of it
    rtol: float  # the problem's tolerance
    atol: float
    speedup: float | None = None

    @property
    def label(self) -> str:
        return f"{PROBLEM} candidate {self.candidate}"

    def describe(self) -> dict:
        d = {"spec": self.spec, "candidate": self.candidate, "origin": self.origin}
        if self.speedup is not None:
            d["speedup"] = self.speedup
        return d


def resolve(spec: str) -> Matvec:
    """Look the candidate up in the evidence store and build it as the harness did."""
    from swarmfactory.backends.base import BuildError, CheatError
    from swarmfactory.backends.c import CBackend
    from swarmfactory.evidence.store import Store, StoreError
    from swarmfactory.harness.static import check_source
    from swarmfactory.problems import load_problem
    from swarmfactory.swarm.succession import busy_refusal

    pin = parse(spec)
    problem = load_problem(PROBLEM)
    if problem.c_signature != SIGNATURE:
        raise NativeUnavailable(f"{spec}: the problem's ABI is now {problem.c_signature}, the decoder calls {SIGNATURE}")
    try:
        store = Store(None, create=False)
    except StoreError as e:
        raise NativeUnavailable(f"{spec}: {e}") from None
    try:
        where = store.shown
        if pin is None:
            champ = store.champion(problem)
            if champ is None:
                raise NativeUnavailable(f"{spec}: no champion of {PROBLEM} for this hardware (and this version of "
                                        f"the problem) in {where}; run the kernel factory on it first "
                                        f"(`swarmfactory run --problems {PROBLEM}`)")
            cand_id, speedup = champ["candidate_id"], champ.get("speedup")
        else:
            cand_id = pin
            evs = [e for e in store.evaluations(problem=PROBLEM, candidate_id=pin, this_hardware=True)
                   if e["problem_spec"] == problem.spec_hash()]
            if not any(e["outcome"] in CORRECT for e in evs):
                raise NativeUnavailable(f"{spec}: candidate {pin} has no correct evaluation ({', '.join(CORRECT)}) "
                                        f"of this version of {PROBLEM} on this hardware in {where}")
            if evs[-1]["outcome"] not in CORRECT:  # a case found later broke it
                raise NativeUnavailable(f"{spec}: candidate {pin} no longer passes the harness on this hardware "
                                        f"(latest: {evs[-1]['outcome']}) in {where}")
            speedup = evs[-1]["speedup"]
        why = busy_refusal(store, problem, cand_id)  # a champion confirmed on a busy machine is not taken
        if why:
            raise NativeUnavailable(f"{spec}: {why}; in {where}")
        cand = store.candidate(cand_id)
    finally:
        store.engine.dispose()
    if cand is None or cand["problem"] != PROBLEM:
        raise NativeUnavailable(f"{spec}: candidate {cand_id} of {PROBLEM} is missing from the candidates of {where}")
    if cand["backend"] != "c" or cand["flags"]:
        raise NativeUnavailable(f"{spec}: candidate {cand_id} is not a plain C kernel (backend {cand['backend']!r}, "
                                f"flags {cand['flags']}); the decoder compiles C source only")
    reason = check_source(cand["source"])
    if reason:
        raise NativeUnavailable(f"{spec}: candidate {cand_id} fails the static check: {reason}")
    try:  # as the harness built it: its cache entry, the same checks
        art = CBackend().build(cand["source"], PROBLEM, prototype=problem.c_prototype, checks=True)
    except (BuildError, CheatError) as e:
        raise NativeUnavailable(f"{spec}: candidate {cand_id} did not build: {e}") from None
    tol = problem.tolerance
    return Matvec(spec, cand_id, cand["source"], where, art.path, tol.rtol, tol.atol, speedup)


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

    def __init__(self, lib, mv: Matvec, kernel, audit: bool = True):
        self.lib, self.matvec, self._kernel = lib, mv, kernel  # the handle keeps the kernel loaded
        self.fn = ctypes.cast(getattr(kernel, PROBLEM), ctypes.c_void_p).value
        self.ext = self.new_ext(audit)
        self.reported: str | None = None  # what audit.report said, once the kernel was dropped

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
            from ..audit import report

            e = self.ext
            self.reported = report(PROBLEM, self.matvec.candidate, {"n": e.n, "k": e.k, "batch": e.batch},
                                   e.mismatch())
        return self.reported



def load(mv: Matvec, path: IsaPath) -> External:
    """The decoder for ``path`` with ``mv``'s kernel, checked; NativeUnavailable naming the
    candidate where it does not load or fails a check."""
    lib = load_library(path)
    try:
        kernel = ctypes.CDLL(mv.path, mode=ctypes.RTLD_LOCAL)
        getattr(kernel, PROBLEM)
    except (OSError, AttributeError) as e:
        raise NativeUnavailable(f"{mv.spec}: cannot load {mv.label} ({mv.path}): {e}") from None
    out = External(lib, mv, kernel)
    raw = out.new_ext(audit=False)  # the checks judge the kernel's own outputs
    bad = probe(lib, raw) or probe_matvec(lib, raw)
    if bad is None and raw.calls == 0:
        bad = "the decoder never called it"
    if bad is not None:
        raise NativeUnavailable(f"{mv.spec}: the native decoder with {mv.label} ({path.name} path) failed its "
                                f"check ({bad}); it is not used")
    return out


__all__ = ["CORRECT", "PROBLEM", "SIGNATURE", "External", "Matvec", "load", "parse", "probe_matvec", "resolve"]
