"""The native seam: shared objects built by the kernel factory run the engine's linear ops.

A config names one per op (``EngineConfig.kernels``):

- ``so:PATH``: a shared object on disk that exports ``q4_1_matmul`` with the factory's ABI;
- ``champion:q4_1_matmul``: the current champion of that problem for this hardware, and
  ``champion:q4_1_matmul@ID``: candidate ``ID`` pinned. The engine's ``KernelSupply``
  (``engine/supply.py``; the corridor ``swarmfactory/champions.py`` with its one rule on which
  candidate may run here) hands it built, then it is loaded. Engine designs name kernels this
  way, so a design's identity (and its verification) covers the exact kernel; when the champion
  moves on, the design that names the new one is another design, verified and measured afresh.

The ABI is the problem's (``problems/suites/cpu/q4_1_matmul.py``)::

    void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch);

``wq``: the weight W [n, k] as GGUF Q4_1 blocks, row after row (n * k / 32 blocks of 20 bytes:
fp16 d, fp16 m, 16 bytes of nibbles; ``Weight.blocks()``); ``x``: fp32 [batch, k]; ``y``: fp32
[batch, n], written. Each op call is one ctypes call on the raw data pointers of contiguous
tensors (bf16 activations are converted to fp32 and the result back).

Trust: the library runs inside the engine's process with all its rights, unlike in the
harness's sandbox. Only libraries a user names and champions that passed the harness are
loaded, and before serving every weight is checked once (``CHECK_ROWS`` rows of random
activations against the dequantised reference, guard zones around the output, inputs
unchanged): a broken library fails the load with its error instead of serving wrong tokens.
A library can still be wrong where those rows never look (another batch size, a position), so
while serving its calls are audited (``NativeLinear.audit``): the first call at each batch size
and a random ``AUDIT_SHARE`` of the others have ``AUDIT_ROWS`` random output rows recomputed
from the dequantised weight. At the first mismatch the library is dropped for every op that runs
it, the call is computed again by the op's built-in kernel (as are all later ones) and the
finding goes to the supply's ``on_wrong`` (``engine/audit.py``).
Tests that must show a broken kernel caught elsewhere (the engine factory's end-to-end
verifier) skip the checks and the audit with ``kernel_class(path, check=False)`` in their own
process, or, for an engine loaded in a child process, ``SWARMFACTORY_TEST_UNCHECKED_KERNELS=1``
in its environment (logged as a warning, and shown as ``checked: false`` in the engine's
paths). No config key or CLI option reaches either.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from gguf import GGMLQuantizationType as QT

from swarmfactory.kernelref import KernelRef

from .config import NATIVE_PROBLEMS
from .kernels import KernelError, LinearKernel, Weight
from .supply import KernelSupply, NoSupply, UnavailableKernel

PROBLEM = "q4_1_matmul"
SYMBOL = "q4_1_matmul"
SIGNATURE = ("void q4_1_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, "
             "int64_t batch)")
_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]

# The load-time check: rows of random activations per weight (one, and an odd few for the tails
# of a kernel's batch blocking), and the allowed error, |y - ref| <= TOL * (1 + |ref|) against
# the dequantised weight in fp64. TOL is 10x the harness's tolerance for q4_1_matmul: a kernel
# that passed the harness is far inside it, a wrong layout, scale or tail far outside.
CHECK_ROWS = (1, 5)
CHECK_TOL = 1e-3
# The audit while serving: output rows recomputed per audited call, and the share of calls at an
# already-audited batch size that are audited (each a fresh random draw the library cannot
# foresee); an audited call costs about AUDIT_ROWS / out_features of the call plus ~50 us.
AUDIT_ROWS = 8
AUDIT_SHARE = 1 / 16
AUDIT_SCALE = 1e-5  # of sum |x||w| per output, on top of the load check's tolerance (as decode.c's audit)
_GUARD = 64  # floats of sentinel on each side of the output
_SENTINEL = 1234.5
UNCHECKED_ENV = "SWARMFACTORY_TEST_UNCHECKED_KERNELS"


def _guards_intact(buf: torch.Tensor) -> bool:
    """The _GUARD floats each side of an output placed in ``buf`` still hold the sentinel."""
    return bool((buf[:_GUARD] == _SENTINEL).all()) and bool((buf[-_GUARD:] == _SENTINEL).all())  # tests only: see the module docstring

log = logging.getLogger("swarmfactory.engine")


@dataclass(frozen=True)
class Library:
    """One loaded shared object and where it came from."""

    spec: str  # as the config names it ("so:..." or "champion:...")
    path: str  # the file loaded
    sha256: str
    origin: str | None = None  # the file the user named (so:) or where the supply took it from (champion:)
    candidate: str | None = None  # champion: the candidate's id in the store
    speedup: float | None = None  # champion: its recorded speedup
    fn: object = field(default=None, repr=False, compare=False)  # the ctypes function

    def describe(self) -> dict:
        d = {"spec": self.spec, "path": self.path, "sha256": self.sha256[:16]}
        if self.origin:
            d["origin"] = self.origin
        if self.candidate:
            d["candidate"] = self.candidate
        if self.speedup is not None:
            d["speedup"] = self.speedup
        return d

    def short(self) -> str:
        """For the paths line: the file and, for a champion, its candidate id."""
        if self.candidate:
            return f"champion {self.candidate} ({self.path})"
        return f"{self.origin or self.path} (sha256 {self.sha256[:12]})"


class NativeLinear(LinearKernel):
    """A linear op run by a shared object with the q4_1_matmul ABI (see the module docstring).

    Subclasses made by ``kernel_class`` carry the library; ``check`` says whether each weight
    is checked at construction (on by default)."""

    qtypes = frozenset({QT.Q4_1})
    library: ClassVar[Library]
    check: ClassVar[bool] = True
    audit_state: ClassVar[dict]  # per library: calls, audited, dropped (what was reported), rng
    on_wrong: ClassVar[object]  # the supply's on_wrong (engine/supply.py)

    def __init__(self, weight: Weight, act_dtype: torch.dtype):
        if not weight.qtypes <= self.qtypes:
            got = ", ".join(sorted(q.name for q in weight.qtypes))
            raise KernelError(f"kernel {self.name!r} takes Q4_1 blocks (the {PROBLEM} ABI), but {weight.name} "
                              f"is stored as {got}; name it for ops stored as Q4_1 only")
        super().__init__(weight, act_dtype)
        self.weight = weight
        self.wq = weight.blocks().reshape(-1).contiguous()
        self._wq_ptr = self.wq.data_ptr()
        self._fn = self.library.fn
        self._seen: set[int] = set()  # batch sizes audited at least once
        self._fallback: LinearKernel | None = None
        if self.check:
            self.verify(weight)

    def _run(self, xf: torch.Tensor, y: torch.Tensor) -> None:
        self._fn(self._wq_ptr, xf.data_ptr(), y.data_ptr(), self.out_features, self.in_features, xf.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        st = self.audit_state
        if st["dropped"] is not None:
            return self.fallback()(x)
        xf = x.to(torch.float32).contiguous()  # no copy for contiguous fp32
        m, n = x.shape[0], self.out_features
        if not m:
            return torch.empty(0, n, dtype=self.act_dtype)
        audit = self.check and (m not in self._seen or st["rng"].random() < AUDIT_SHARE)
        if audit:  # inputs kept, a guard zone each side of the output
            self._seen.add(m)
            x_before = xf.clone()
            buf = torch.full((_GUARD + m * n + _GUARD,), _SENTINEL, dtype=torch.float32)
            y = buf[_GUARD:_GUARD + m * n].view(m, n)
        else:
            y = torch.empty(m, n, dtype=torch.float32)
        self._run(xf, y)
        st["calls"] += 1
        if audit and not self.audit(xf, y, x_before, buf):
            return self.fallback()(x_before.to(x.dtype))
        return y if self.act_dtype == torch.float32 else y.to(self.act_dtype)

    def audit(self, xf: torch.Tensor, y: torch.Tensor, x_before: torch.Tensor, buf: torch.Tensor) -> bool:
        """The call left its inputs and the memory around its output as they were, and
        AUDIT_ROWS random output rows recomputed from the dequantised weight agree; False (and
        the library dropped, the finding reported) if not."""
        st = self.audit_state
        st["audited"] += 1
        n, k, m = self.out_features, self.in_features, xf.shape[0]
        if not torch.equal(xf, x_before):
            return self._drop(m, "the call changed its inputs (the activations)")
        if not _guards_intact(buf):
            return self._drop(m, "the call wrote outside its outputs")
        rows = torch.tensor(sorted(st["rng"].sample(range(n), min(AUDIT_ROWS, n))))
        blocks = self.wq.view(n, k // 32, 20)[rows]  # GGUF Q4_1: fp16 d, fp16 m, 16 bytes of nibbles
        d = blocks[..., 0:2].contiguous().view(torch.float16).float()
        mn = blocks[..., 2:4].contiguous().view(torch.float16).float()
        q = blocks[..., 4:].to(torch.int16)
        w = (torch.cat([q & 0x0F, q >> 4], -1).float() * d + mn).reshape(len(rows), k)  # exact in fp32
        ref = xf @ w.T  # fp32 sums in another order than the library's: ~1e-6 of sum |x||w|
        got = y[:, rows]
        err = (got - ref).abs()
        bad = ~(err <= CHECK_TOL * (1 + ref.abs()) + AUDIT_SCALE * (xf.abs() @ w.abs().T))  # NaN counts as bad
        if not bool(bad.any()):
            return True
        b, r = (int(i) for i in bad.nonzero()[0])
        return self._drop(m, f"output [{b}, {int(rows[r])}] was {got[b, r].item():.6g}, the dequantised "
                                 f"weight gives {ref[b, r].item():.6g} (allowed {CHECK_TOL:g} * (1 + |that|) + "
                                 f"{AUDIT_SCALE:g} of the size of its terms)")

    def _drop(self, m: int, what: str) -> bool:
        """Drop the library (for every op on it) and report what a call of ``m`` rows did, once."""
        st = self.audit_state
        if st["dropped"] is None:
            n, k = self.out_features, self.in_features
            st["dropped"] = reported(self.on_wrong, PROBLEM, self.library.candidate, {"n": n, "k": k, "batch": m},
                                     f"n={n} k={k} batch={m}: {what}")
        return False

    def fallback(self) -> LinearKernel:
        """The kernel this op runs once the library is dropped: the engine's default for it."""
        if self._fallback is None:
            from .kernels import Dense, default_kernel, kernel_class

            cls = kernel_class(default_kernel("q4_1", "", self.weight))
            if self.act_dtype not in cls.act_dtypes or not self.weight.qtypes <= (cls.qtypes or self.weight.qtypes):
                cls = Dense
            self._fallback = cls(self.weight, self.act_dtype)
        return self._fallback

    def verify(self, weight: Weight) -> None:
        """Run the library on ``weight`` and random activations; KernelError if it is wrong."""
        n, k = self.out_features, self.in_features
        ref_w = weight.dequantize().double()
        wq_before = self.wq.clone()
        g = torch.Generator().manual_seed(20261203)
        for m in CHECK_ROWS:
            x = torch.randn(m, k, generator=g).to(self.act_dtype).float()  # values the engine feeds
            x_before = x.clone()
            buf = torch.full((_GUARD + m * n + _GUARD,), _SENTINEL, dtype=torch.float32)
            y = buf[_GUARD:_GUARD + m * n]
            y.fill_(float("nan"))  # outputs never written stay NaN and fail
            self._fn(self._wq_ptr, x.data_ptr(), y.data_ptr(), n, k, m)
            where = f"{weight.name} [{n} x {k}], {m} row(s) of random activations"
            if not _guards_intact(buf):
                raise KernelError(f"kernel {self.name!r} failed its check on {where}: it wrote outside its output")
            if not torch.equal(x, x_before) or not torch.equal(self.wq, wq_before):
                raise KernelError(f"kernel {self.name!r} failed its check on {where}: it modified its inputs")
            ref = x.double() @ ref_w.T
            err = (y.view(m, n).double() - ref).abs()
            bad = ~(err <= CHECK_TOL * (1 + ref.abs()))  # NaN counts as bad
            if bool(bad.any()):
                worst = torch.nan_to_num(err, nan=float("inf")).max().item()
                raise KernelError(
                    f"kernel {self.name!r} failed its check on {where} against the dequantised reference: "
                    f"max abs error {worst:.4g} (allowed {CHECK_TOL:g} * (1 + |ref|)), {int(bad.sum())} of "
                    f"{m * n} outputs wrong; a library that fails it is not served")


# -- loading ---------------------------------------------------------------------------------

_LOADED: dict[str, Library] = {}  # sha256 of the file loaded -> library
_FILES: dict[tuple, type[NativeLinear]] = {}  # (realpath, size, mtime_ns, check) -> class


def _checks_on() -> bool:
    return os.environ.get(UNCHECKED_ENV) != "1"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _load(path: Path, spec: str, sha: str, **info) -> Library:
    if sha in _LOADED:
        lib = _LOADED[sha]
        return Library(spec, lib.path, sha, fn=lib.fn, **info)
    try:
        cdll = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        raise KernelError(f"{spec}: cannot load {path}: {e}") from None
    try:
        fn = getattr(cdll, SYMBOL)
    except AttributeError:
        raise KernelError(f"{spec}: {path} does not export `{SYMBOL}` (the engine calls {SIGNATURE})") from None
    fn.argtypes, fn.restype = _ARGTYPES, None
    lib = Library(spec, str(path), sha, fn=fn, **info)
    _LOADED[sha] = lib
    return lib


def _class(lib: Library, check: bool, name: str | None = None, on_wrong=None) -> type[NativeLinear]:
    state = {"calls": 0, "audited": 0, "dropped": None, "rng": random.Random(os.urandom(16))}
    return type(f"NativeLinear_{lib.sha256[:12]}", (NativeLinear,),
                {"name": name or lib.spec, "library": lib, "check": check, "audit_state": state,
                 "on_wrong": staticmethod(on_wrong or NoSupply().on_wrong)})


def reported(on_wrong, problem: str, candidate: str | None, shape: dict, detail: str) -> str:
    """What the engine says of a factory kernel it just dropped: the supply records a candidate's
    finding (``on_wrong``); a user's ``so:`` file, which no store knows, is logged only."""
    if candidate:
        return on_wrong(problem, candidate, shape, detail)
    msg = (f"{problem} kernel (not from the store) gave a wrong output while serving ({detail}); dropped, the "
           "engine's own code runs instead")
    log.error("%s", msg)
    return msg


def kernel_class(path: str | os.PathLike, *, name: str | None = None, check: bool = True) -> type[NativeLinear]:
    """A kernel class for the shared object at ``path`` (the q4_1_matmul ABI).

    The file is copied into the build cache under its content hash and loaded from there, so
    rewriting ``path`` later never changes (or crashes) a running engine, and a new file at the
    same path is a new library. ``check=False`` skips the load-time check of every weight: only
    for tests that must show a broken kernel caught elsewhere; register the class under a name
    (``register_kernel``) and name that in a config."""
    p = Path(path).expanduser()
    spec = f"so:{path}"
    try:
        st = p.stat()
    except OSError as e:
        raise KernelError(f"{spec}: no such shared object ({e.strerror})") from None
    if not p.is_file():
        raise KernelError(f"{spec}: {p} is not a file")
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, check, name)
    if key not in _FILES:
        from swarmfactory.backends.c import cache_dir

        sha = _sha256(p)
        copy = cache_dir() / f"engine-so-{sha[:24]}.so"
        if not copy.exists():
            tmp = copy.with_suffix(f".tmp{os.getpid()}")
            shutil.copyfile(p, tmp)
            os.replace(tmp, copy)
        _FILES[key] = _class(_load(copy, spec, sha, origin=str(p.resolve())), check, name)
    return _FILES[key]


def champion_class(spec: str, supply: KernelSupply, check: bool) -> type[NativeLinear]:
    """The kernel class of ``champion:q4_1_matmul[@ID]``, built by ``supply``; KernelError naming it."""
    ref = KernelRef.parse(spec)
    if ref.target not in NATIVE_PROBLEMS:
        raise KernelError(f"{spec}: only champions of {', '.join(NATIVE_PROBLEMS)} plug into linear ops")
    try:
        built = supply.build(spec, SIGNATURE)
    except UnavailableKernel as e:
        raise KernelError(str(e)) from None
    path = Path(built.path)
    lib = _load(path, spec, _sha256(path), origin=built.origin, candidate=built.candidate, speedup=built.speedup)
    return _class(lib, check, on_wrong=supply.on_wrong)


def resolve(spec: str, supply: KernelSupply | None = None) -> type[NativeLinear]:
    """The kernel class a prefixed kernel name (``so:PATH``, ``champion:PROBLEM[@ID]``) stands
    for; a champion comes from ``supply`` (built afresh at each engine load, so a new champion is
    picked up by the next engine)."""
    try:
        ref = KernelRef.parse(spec)
    except ValueError as e:
        raise KernelError(str(e)) from None
    check = _checks_on()
    if ref.kind == "so":
        return kernel_class(ref.target, check=check)
    return champion_class(spec, supply or NoSupply(), check)


def resolve_all(kernels: dict[str, str], supply: KernelSupply | None = None) -> dict[str, type[NativeLinear]]:
    """Look up every prefixed kernel a config names, afresh: op -> kernel class. Errors name
    the op."""
    out: dict[str, type[NativeLinear]] = {}
    seen: dict[str, type[NativeLinear]] = {}
    for op, name in kernels.items():
        if not KernelRef.names_one(name):
            continue
        if name not in seen:
            try:
                seen[name] = resolve(name, supply)
            except KernelError as e:
                raise KernelError(f"kernels.{op}: {e}") from None
        out[op] = seen[name]
    if out and not _checks_on():
        log.warning("%s=1: the native kernels (%s) are NOT checked before use (tests only)", UNCHECKED_ENV,
                    ", ".join(f"{op}={name}" for op, name in kernels.items() if op in out))
    return out


def describe(classes: dict[str, type[NativeLinear]]) -> dict[str, dict]:
    """The kernels ``resolve_all`` gave, as the engine reports them (paths): op -> where its
    library came from."""
    return {op: {**cls.library.describe(), "checked": cls.check,
                 "short": cls.library.short() + ("" if cls.check else " UNCHECKED")}
            for op, cls in classes.items()}
