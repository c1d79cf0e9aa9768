"""The native seam: shared objects built by the kernel factory run the engine's linear ops.

A config names one per op (``EngineConfig.kernels``):

- ``so:PATH``: a shared object on disk that exports one or more of the block-type matmuls
  (``q4_1_matmul``, ``q4_k_matmul``, ``q6_k_matmul``...: ``FAMILIES``) with the factory's ABI;
- ``champion:q4_k_matmul``: the current champion of that problem for this hardware (or of a
  problem derived from a model, ``champion:q4_k_matmul.MODEL``, ``problems/derive.py``), and
  ``champion:PROBLEM@ID``: candidate ``ID`` pinned. The engine's ``KernelSupply``
  (``engine/supply.py``; the corridor ``swarmfactory/champions.py`` with its one rule on which
  candidate may run here) hands it built, then it is loaded. Engine designs name kernels this
  way, so a design's identity (and its verification) covers the exact kernel; when the champion
  moves on, the design that names the new one is another design, verified and measured afresh.

The ABI is the problems' (``problems/suites/cpu/q4_1_matmul.py``, ``qblock.py``), one function
per GGUF block type, named after its problem::

    void q4_k_matmul(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch);

``wq``: the weight W [n, k] as stored GGUF blocks of that type, row after row
(``Weight.blocks()``); ``x``: fp32 [batch, k]; ``y``: fp32 [batch, n], written. A weight's parts
(q|k|v, gate|up) are cut into runs of one block type: a run in a type the library has a function
for is one ctypes call on the raw data pointers of contiguous tensors (bf16 activations are
converted to fp32 and the result back); the other runs run the engine's default kernel for them,
so a Q4_K_M file's Q6_K layers keep theirs while a ``q4_k_matmul`` champion runs the Q4_K ones.

Trust: the library runs inside the engine's process with all its rights, unlike in the
harness's sandbox. Only libraries a user names and champions that passed the harness are
loaded, and before serving every weight is checked once (``CHECK_ROWS`` rows of random
activations against the dequantised reference, guard zones around the output, inputs
unchanged): a broken library fails the load with its error instead of serving wrong tokens.
A library can still be wrong where those rows never look (another batch size, a position), so
while serving its calls are audited (``NativeLinear.audit``): the first call at each batch size
and a random ``AUDIT_SHARE`` of the others have ``AUDIT_ROWS`` random output rows recomputed
from the dequantised weight. Every call, audited or not, writes between guard zones of random
values (``guarded``), so a kernel cannot tell a checked call by what lies next to its output.
At the first mismatch the library is dropped for every op that runs
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
import itertools
import logging
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from gguf import GGMLQuantizationType as QT

from swarmfactory import kernelref
from swarmfactory.kernelref import KernelRef

from .config import ELEMENT_OPS, NATIVE_FAMILIES, NATIVE_PROBLEMS, native_family
from .kernels import KernelError, LinearKernel, Weight
from .supply import KernelSupply, NoSupply, UnavailableKernel

# The block-type matmul problems whose ABI the engine's linear ops call, and the block type each takes.
FAMILIES: dict[str, QT] = {problem: QT[qtype] for problem, qtype in NATIVE_FAMILIES.items()}


def signature(symbol: str) -> str:
    """The C declaration the engine calls for the family problem ``symbol``."""
    return f"void {symbol}(const uint8_t *wq, const float *x, float *y, int64_t n, int64_t k, int64_t batch)"


_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]

# The load-time check: rows of random activations per weight (one, and an odd few for the tails
# of a kernel's batch blocking), and the allowed error, |y - ref| <= TOL * (1 + |ref|) against
# the dequantised weight in fp64. TOL is 10x the harness's tolerance for q4_1_matmul: a kernel
# that passed the harness is far inside it, a wrong layout, scale or tail far outside.
CHECK_ROWS = (1, 5)
CHECK_TOL = 1e-3
CHECK_CHUNK = 4096  # weight rows dequantised at a time by the load check (every row is checked)
# The audit while serving: output rows recomputed per audited call, and the share of calls at an
# already-audited batch size that are audited (each a fresh random draw the library cannot
# foresee); an audited call costs about AUDIT_ROWS / out_features of the call plus ~50 us.
AUDIT_ROWS = 8
AUDIT_SHARE = 1 / 16
AUDIT_SCALE = 1e-5  # of sum |x||w| per output, on top of the load check's tolerance (as decode.c's audit)
_GUARD = 64  # floats of guard zone on each side of an output
UNCHECKED_ENV = "SWARMFACTORY_TEST_UNCHECKED_KERNELS"
# Every call's output (audited or not) lies between two guard zones copied from this pool of
# random floats at random offsets: what a kernel finds next to its output never tells it whether
# this call is checked (a fixed sentinel would: a kernel could behave only when it sees one).
_POOL = torch.randn(1 << 14, generator=torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))) * 64


_POOL_PTR = _POOL.data_ptr()
_OFFSET_BITS = 13  # guard offsets in [0, 8192): within the pool with room for a zone


def guarded(n: int, rng: random.Random, shape: tuple | None = None) -> tuple[torch.Tensor, tuple]:
    """An output of ``n`` fp32 (viewed as ``shape``, rows x cols, where given) between guard
    zones from the pool: (the output, its guard, which ``_guards_intact`` checks after the call).
    A few microseconds: it runs on every call."""
    buf = torch.empty(_GUARD + n + _GUARD, dtype=torch.float32)
    lo, hi = rng.getrandbits(_OFFSET_BITS), rng.getrandbits(_OFFSET_BITS)
    base = buf.data_ptr()
    ctypes.memmove(base, _POOL_PTR + 4 * lo, 4 * _GUARD)
    ctypes.memmove(base + 4 * (_GUARD + n), _POOL_PTR + 4 * hi, 4 * _GUARD)
    out = buf.as_strided(shape, (shape[1], 1), _GUARD) if shape else buf[_GUARD:_GUARD + n]
    return out, (buf, lo, hi)


def _guards_intact(guard: tuple) -> bool:
    """Both guard zones of an output from ``guarded`` still hold what was copied there."""
    buf, lo, hi = guard
    return (torch.equal(buf[:_GUARD], _POOL[lo:lo + _GUARD])
            and torch.equal(buf[buf.numel() - _GUARD:], _POOL[hi:hi + _GUARD]))

log = logging.getLogger("swarmfactory.engine")


@dataclass(frozen=True)
class Library:
    """One loaded shared object, where it came from, and its kernel per block type."""

    spec: str  # as the config names it ("so:..." or "champion:...")
    path: str  # the file loaded
    sha256: str
    origin: str | None = None  # the file the user named (so:) or where the supply took it from (champion:)
    candidate: str | None = None  # champion: the candidate's id in the store
    speedup: float | None = None  # champion: its recorded speedup
    problem: str | None = None  # champion: the problem it is a candidate of (FAMILY or FAMILY.MODEL)
    fns: dict = field(default=None, repr=False, compare=False)  # block type -> the ctypes function
    # block type -> (problem, candidate) where the kernels of a joined name come from several
    # champions (``join``); else every type is this library's problem and candidate
    owners: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def qtypes(self) -> frozenset:
        return frozenset(self.fns)

    def problem_of(self, qtype: QT) -> str:
        """The problem whose kernel runs ``qtype`` (what a wrong output is reported against)."""
        if qtype in self.owners:
            return self.owners[qtype][0]
        return self.problem or next(f for f, t in FAMILIES.items() if t == qtype)

    def candidate_of(self, qtype: QT) -> str | None:
        return self.owners[qtype][1] if qtype in self.owners else self.candidate

    @staticmethod
    def join(spec: str, libs: list["Library"]) -> "Library":
        """One library of the kernels of ``libs`` (a joined name): for each block type, the first
        that has one."""
        fns, owners = {}, {}
        for lib in libs:
            for qt, fn in lib.fns.items():
                if qt not in fns:
                    fns[qt], owners[qt] = fn, (lib.problem_of(qt), lib.candidate_of(qt))
        first = libs[0]
        return Library(spec, "+".join(lib.path for lib in libs), "+".join(lib.sha256 for lib in libs),
                       origin="+".join(lib.origin or lib.path for lib in libs), candidate=first.candidate,
                       speedup=first.speedup, problem=first.problem, fns=fns, owners=owners)

    def describe(self) -> dict:
        d = {"spec": self.spec, "path": self.path, "sha256": self.sha256[:16],
             "types": sorted(getattr(q, "name", q) for q in self.fns)}
        if self.origin:
            d["origin"] = self.origin
        if self.candidate:
            d["candidate"] = self.candidate
        if self.speedup is not None:
            d["speedup"] = self.speedup
        if self.owners:  # a joined name: where each type's kernel comes from
            d["by_type"] = {qt.name: {"problem": p, "candidate": c} for qt, (p, c) in self.owners.items()}
        return d

    def short(self) -> str:
        """For the paths line: the file and, for a champion, its candidate id."""
        if self.candidate:
            return f"champion {self.candidate} ({self.path})"
        return f"{self.origin or self.path} (sha256 {self.sha256[:12]})"


@dataclass
class _Run:
    """Consecutive parts of a weight in one block type: rows r0..r0+rows of the op's output, run by
    the library (``fn``, on the run's stored blocks) or, in a type it has no kernel for, by the
    engine's default kernel (``kernel``)."""

    r0: int
    rows: int
    qtype: QT
    parts: list
    fn: object = None
    wq: torch.Tensor | None = None
    kernel: LinearKernel | None = None

    def dequantize_rows(self, rows: list[int]) -> torch.Tensor:
        """fp32 [len(rows), cols] of the run's weight rows ``rows`` (run-relative)."""
        out, base = [], 0
        want = torch.tensor(rows)
        for p in self.parts:
            mine = want[(want >= base) & (want < base + p.rows)] - base
            if len(mine):
                out.append(p.take(mine.numpy()).dequantize())
            base += p.rows
        return torch.cat(out).float()


class NativeLinear(LinearKernel):
    """A linear op run by a shared object with the block-type matmul ABI (module docstring).

    Subclasses made by ``kernel_class`` / ``champion_class`` carry the library; ``check`` says
    whether each weight is checked at construction (on by default). The weight's parts are cut
    into runs of one block type: the library runs those of its types, the engine's default
    kernel the others; ``library_rows`` counts the rows the library computes (0: none here, the
    op's other layers may have some)."""

    qtypes = None  # any: the parts the library has no kernel for run the default kernel
    library: ClassVar[Library]
    check: ClassVar[bool] = True
    audit_state: ClassVar[dict]  # per library: calls, audited, dropped (what was reported), rng
    on_wrong: ClassVar[object]  # the supply's on_wrong (engine/supply.py)

    def __init__(self, weight: Weight, act_dtype: torch.dtype):
        super().__init__(weight, act_dtype)
        self.weight = weight
        self.runs: list[_Run] = []
        r0 = 0
        for qtype, group in itertools.groupby(weight.parts, key=lambda p: p.qtype):
            parts = list(group)
            run = _Run(r0, sum(p.rows for p in parts), qtype, parts)
            run.fn = self.library.fns.get(qtype)
            if run.fn is not None:
                run.wq = Weight(parts).blocks().reshape(-1).contiguous()
            else:
                run.kernel = _default(Weight(parts), act_dtype)
            self.runs.append(run)
            r0 += run.rows
        self.library_rows = sum(r.rows for r in self.runs if r.fn is not None)
        self._seen: set[int] = set()  # batch sizes audited at least once
        self._fallback: LinearKernel | None = None
        if self.check and self.library_rows:
            self.verify()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        st = self.audit_state
        if st["dropped"] is not None:
            return self.fallback()(x)
        xf = x.to(torch.float32).contiguous()  # no copy for contiguous fp32
        m, n = x.shape[0], self.out_features
        if not m:
            return torch.empty(0, n, dtype=self.act_dtype)
        audit = self.check and self.library_rows and (m not in self._seen or st["rng"].random() < AUDIT_SHARE)
        if audit:
            self._seen.add(m)
            x_before = xf.clone()
        if self.library_rows:
            st["calls"] += 1
        outs = []
        for run in self.runs:
            if run.fn is None:
                outs.append(run.kernel(x).float())
                continue
            y, guard = guarded(m * run.rows, st["rng"], (m, run.rows))  # audited or not, the call looks the same
            run.fn(run.wq.data_ptr(), xf.data_ptr(), y.data_ptr(), run.rows, self.in_features, m)
            if audit and not self.audit(run, xf, y, x_before, guard):
                return self.fallback()(x_before.to(x.dtype))
            outs.append(y)
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return y if self.act_dtype == torch.float32 else y.to(self.act_dtype)

    def audit(self, run: _Run, xf: torch.Tensor, y: torch.Tensor, x_before: torch.Tensor, guard: tuple) -> bool:
        """The call left its inputs and the memory around its output as they were, and
        AUDIT_ROWS random output rows recomputed from the dequantised weight agree; False (and
        the library dropped, the finding reported) if not."""
        st = self.audit_state
        st["audited"] += 1
        m = xf.shape[0]
        if not torch.equal(xf, x_before):
            return self._drop(run, m, "the call changed its inputs (the activations)")
        if not _guards_intact(guard):
            return self._drop(run, m, "the call wrote outside its outputs")
        rows = sorted(st["rng"].sample(range(run.rows), min(AUDIT_ROWS, run.rows)))
        w = run.dequantize_rows(rows)  # exact in fp32 for every block type
        ref = xf @ w.T  # fp32 sums in another order than the library's: ~1e-6 of sum |x||w|
        got = y[:, rows]
        err = (got - ref).abs()
        bad = ~(err <= CHECK_TOL * (1 + ref.abs()) + AUDIT_SCALE * (xf.abs() @ w.abs().T))  # NaN counts as bad
        if not bool(bad.any()):
            return True
        b, r = (int(i) for i in bad.nonzero()[0])
        return self._drop(run, m, f"output [{b}, {run.r0 + rows[r]}] was {got[b, r].item():.6g}, the dequantised "
                                  f"weight gives {ref[b, r].item():.6g} (allowed {CHECK_TOL:g} * (1 + |that|) + "
                                  f"{AUDIT_SCALE:g} of the size of its terms)")

    def _drop(self, run: _Run, m: int, what: str) -> bool:
        """Drop the library (for every op on it) and report what a call of ``m`` rows did, once."""
        st = self.audit_state
        if st["dropped"] is None:
            n, k = run.rows, self.in_features
            st["dropped"] = reported(self.on_wrong, self.library.problem_of(run.qtype),
                                     self.library.candidate_of(run.qtype),
                                     {"n": n, "k": k, "batch": m}, f"{run.qtype.name} n={n} k={k} batch={m}: {what}")
        return False

    def fallback(self) -> LinearKernel:
        """The kernel this op runs once the library is dropped: the engine's default for it."""
        if self._fallback is None:
            self._fallback = _default(self.weight, self.act_dtype)
        return self._fallback

    def verify(self) -> None:
        """Run the library on each of its runs with random activations; KernelError if it is
        wrong. Every output row is checked against the dequantised reference, CHECK_CHUNK rows of
        the weight at a time (a 262144-row output head is never dequantised whole)."""
        k = self.in_features
        g = torch.Generator().manual_seed(20261203)
        for run in (r for r in self.runs if r.fn is not None):
            n = run.rows
            wq_before = run.wq.clone()
            calls = []
            for m in CHECK_ROWS:
                x = torch.randn(m, k, generator=g).to(self.act_dtype).float()  # values the engine feeds
                x_before = x.clone()
                y, guard = guarded(m * n, self.audit_state["rng"])
                y.fill_(float("nan"))  # outputs never written stay NaN and fail
                run.fn(run.wq.data_ptr(), x.data_ptr(), y.data_ptr(), n, k, m)
                where = f"{self.weight.name} [{n} x {k}] ({run.qtype.name}), {m} row(s) of random activations"
                if not _guards_intact(guard):
                    raise KernelError(f"kernel {self.name!r} failed its check on {where}: it wrote outside its output")
                if not torch.equal(x, x_before) or not torch.equal(run.wq, wq_before):
                    raise KernelError(f"kernel {self.name!r} failed its check on {where}: it modified its inputs")
                calls.append((where, x.double(), y.view(m, n).double()))
            for r0 in range(0, n, CHECK_CHUNK):
                rows = list(range(r0, min(n, r0 + CHECK_CHUNK)))
                ref_w = run.dequantize_rows(rows).double()
                for where, x, got in calls:
                    ref = x @ ref_w.T
                    err = (got[:, r0:r0 + len(rows)] - ref).abs()
                    bad = ~(err <= CHECK_TOL * (1 + ref.abs()))  # NaN (and a row never written) counts as bad
                    if bool(bad.any()):
                        worst = torch.nan_to_num(err, nan=float("inf")).max().item()
                        b, i = (int(v) for v in bad.nonzero()[0])
                        raise KernelError(
                            f"kernel {self.name!r} failed its check on {where} against the dequantised reference: "
                            f"max abs error {worst:.4g} (allowed {CHECK_TOL:g} * (1 + |ref|)), first at output "
                            f"[{b}, {r0 + i}]; a library that fails it is not served")


def _default(weight: Weight, act_dtype: torch.dtype) -> LinearKernel:
    """The engine's default kernel for ``weight`` (dense where that kernel cannot take it)."""
    from .kernels import Dense, default_kernel, kernel_class

    cls = kernel_class(default_kernel("q4_1", "", weight))
    if act_dtype not in cls.act_dtypes or not weight.qtypes <= (cls.qtypes or weight.qtypes):
        cls = Dense
    return cls(weight, act_dtype)


def check_used(layers_by_op: dict[str, list], classes: dict[str, type]) -> None:
    """KernelError for an op whose named library runs none of its layers' rows: no weight of that
    op has a part in the library's block types (a config that names a kernel for the wrong op)."""
    for op, cls in classes.items():
        kernels = [lin.kernel for lin in layers_by_op.get(op, [])]
        mine = [k for k in kernels if isinstance(k, NativeLinear)]
        if mine and not any(k.library_rows for k in mine):
            stored = sorted({p.qtype.name for k in mine for p in k.weight.parts})
            takes = ", ".join(sorted(q.name for q in cls.library.qtypes))
            raise KernelError(f"kernels.{op}: kernel {cls.name!r} takes {takes} blocks, but no {op} weight has a "
                              f"part stored so (they are {', '.join(stored)}); name it for ops stored as {takes}")


# -- loading ---------------------------------------------------------------------------------

_LOADED: dict[str, ctypes.CDLL] = {}  # sha256 of the file loaded -> the loaded object
_FILES: dict[tuple, type[NativeLinear]] = {}  # (realpath, size, mtime_ns, check) -> class


def _checks_on() -> bool:
    return os.environ.get(UNCHECKED_ENV) != "1"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _load(path: Path, spec: str, sha: str, symbols: tuple[str, ...], abi=None, **info) -> Library:
    """The library at ``path`` with its kernel for each of ``symbols`` it exports (at least one).
    ``abi``: symbol -> (the key its function is kept under, ctypes argtypes, C declaration); the
    block-type matmuls' by default (keyed by block type)."""
    abi = abi or {sym: (FAMILIES[sym], _ARGTYPES, signature(sym)) for sym in FAMILIES}
    if sha in _LOADED:
        cdll = _LOADED[sha]
    else:
        try:
            cdll = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise KernelError(f"{spec}: cannot load {path}: {e}") from None
        _LOADED[sha] = cdll
    fns = {}
    for sym in symbols:
        fn = getattr(cdll, sym, None)
        if fn is not None:
            key, fn.argtypes, _ = abi[sym]
            fn.restype = None
            fns[key] = fn
    if not fns:
        if len(symbols) == 1:
            raise KernelError(f"{spec}: {path} does not export `{symbols[0]}` (the engine calls {abi[symbols[0]][2]})")
        if not set(symbols) <= set(FAMILIES):
            calls = "; ".join(abi[s][2] for s in symbols)
            raise KernelError(f"{spec}: {path} exports none of {', '.join(f'`{s}`' for s in symbols)} (the engine "
                              f"calls one of: {calls})")
        raise KernelError(f"{spec}: {path} exports none of {', '.join(f'`{s}`' for s in symbols)} (the engine "
                          f"calls {signature('<type>_matmul')}, one function per GGUF block type)")
    return Library(spec, str(path), sha, fns=fns, **info)


def cached_copy(p: Path) -> tuple[Path, str]:
    """The shared object at ``p`` copied into the build cache under its content hash (what is
    loaded, so rewriting ``p`` later never changes a running engine), and that hash."""
    from swarmfactory.backends.c import cache_dir

    sha = _sha256(p)
    copy = cache_dir() / f"engine-so-{sha[:24]}.so"
    if not copy.exists():
        tmp = copy.with_suffix(f".tmp{os.getpid()}")
        shutil.copyfile(p, tmp)
        os.replace(tmp, copy)
    return copy, sha


def so_path(spec: str, path: str | os.PathLike) -> Path:
    """The file a ``so:`` name gives; KernelError naming it if there is none."""
    p = Path(path).expanduser()
    try:
        p.stat()
    except OSError as e:
        raise KernelError(f"{spec}: no such shared object ({e.strerror})") from None
    if not p.is_file():
        raise KernelError(f"{spec}: {p} is not a file")
    return p


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
    """A kernel class for the shared object at ``path`` (the block-type matmuls it exports).

    The file is copied into the build cache under its content hash and loaded from there, so
    rewriting ``path`` later never changes (or crashes) a running engine, and a new file at the
    same path is a new library. ``check=False`` skips the load-time check of every weight: only
    for tests that must show a broken kernel caught elsewhere; register the class under a name
    (``register_kernel``) and name that in a config."""
    spec = f"so:{path}"
    p = so_path(spec, path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, check, name)
    if key not in _FILES:
        copy, sha = cached_copy(p)
        _FILES[key] = _class(_load(copy, spec, sha, tuple(FAMILIES), origin=str(p.resolve())), check, name)
    return _FILES[key]


def champion_class(spec: str, supply: KernelSupply, check: bool) -> type[NativeLinear]:
    """The kernel class of ``champion:PROBLEM[@ID]`` (a block-type matmul or a problem derived
    from one), built by ``supply``; KernelError naming it."""
    ref = KernelRef.parse(spec)
    family = native_family(ref.target)
    if family is None:
        raise KernelError(f"{spec}: only champions of {', '.join(NATIVE_PROBLEMS)} (or of a problem derived from "
                          "them) plug into linear ops")
    try:
        built = supply.build(spec, signature(family))
    except UnavailableKernel as e:
        raise KernelError(str(e)) from None
    path = Path(built.path)
    lib = _load(path, spec, _sha256(path), (family,), origin=built.origin, candidate=built.candidate,
                speedup=built.speedup, problem=ref.target)
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


def resolve_joined(spec: str, supply: KernelSupply | None = None) -> type[NativeLinear]:
    """``resolve`` for a name that may join several (``kernelref.JOIN``: one op's kernels for
    different block types): one class whose library runs each type by the first that has it."""
    names = kernelref.pieces(spec)
    if len(names) == 1:
        return resolve(spec, supply)
    classes = [resolve(n, supply) for n in names]
    lib = Library.join(spec, [c.library for c in classes])
    return _class(lib, _checks_on(), on_wrong=(supply or NoSupply()).on_wrong)


def resolve_all(kernels: dict[str, str], supply: KernelSupply | None = None) -> dict[str, type[NativeLinear]]:
    """Look up every prefixed kernel a config names, afresh: op -> kernel class. Errors name
    the op."""
    out: dict[str, type[NativeLinear]] = {}
    seen: dict[str, type[NativeLinear]] = {}
    for op, name in kernels.items():
        if not KernelRef.names_one(name) or op in ELEMENT_OPS:  # the non-linear ops: engine/native_ops.py
            continue
        if name not in seen:
            try:
                seen[name] = resolve_joined(name, supply)
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
