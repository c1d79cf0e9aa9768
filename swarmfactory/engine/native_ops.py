"""Kernel-factory kernels for the engine's non-linear ops: the norms, the residual add fused with
the norm after it, and the gated activation.

A config names them as it names the linear ops' kernels (``EngineConfig.kernels``), under the
op keys of ``config.ELEMENT_OPS``: ``so:PATH`` (a shared object exporting the function) or
``champion:PROBLEM[@ID]`` (the store's champion of that problem or of one derived from a model,
``problems/derive.py``, handed built by the engine's ``KernelSupply``). Each calls the C ABI of
the kernel factory's problem, so one source serves the harness and the engine:

========  ====================  ==================================================================
op        problem               what the engine calls it for
========  ====================  ==================================================================
norm      ``rmsnorm``           the first layer's input norm, Gemma's post-attention and post-FFN
                                norms, and the q/k head norms (one call for the q heads and one
                                for the k heads, rows = tokens x heads, cols = head size)
add_norm  ``add_rmsnorm``       the residual add with the norm that follows it: the pre-FFN norm,
                                the next layer's input norm, the final norm (h, the new residual,
                                and y, the norm's output)
act       ``swiglu``/``geglu``  the gated FFN activation, the one the model's FFN uses (gate and
                                up copied out of the fused gate|up output as flat vectors)
========  ====================  ==================================================================

Activations are fp32 in these ABIs: a bf16 engine's are converted in and the outputs back.

Trust, as for the linear ops (``native_seam.py``): only a library the user names or a champion
that passed the harness is loaded; at load it is run on the model's own sizes (one row and an
odd few, random inputs) and every output is compared with an fp64 reference (``RTOL``: ten times
the problem's own tolerance), with guard zones around its outputs and its inputs (the norm
weight included) checked unchanged; a library that fails is not served (``KernelError``). While
serving, the first call at each size and a random ``AUDIT_SHARE`` of the others recompute
``AUDIT_ROWS`` random rows in fp64: at the first mismatch the kernel is dropped, that call and
every later one run the engine's own code, and the finding goes to the supply's ``on_wrong``
(a champion's: a validation case, a ``wrong`` evaluation, the title taken away).
"""

from __future__ import annotations

import ctypes
import math
import os
import random
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from swarmfactory.kernelref import KernelRef

from .config import ELEMENT_OPS, element_family
from .kernels import KernelError
from .native_seam import (_GUARD, _SENTINEL, AUDIT_ROWS, AUDIT_SHARE, Library, _checks_on, _guards_intact, _load,
                          _sha256, cached_copy, reported, so_path)
from .supply import KernelSupply, NoSupply, UnavailableKernel

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
SQRT_2_OVER_PI, KAPPA = math.sqrt(2.0 / math.pi), 0.044715


def _rmsnorm_ref(ins, params, eps):
    x, w = ins[0].double(), params[0].double()
    return [x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w]


def _add_rmsnorm_ref(ins, params, eps):
    h = ins[0].double() + ins[1].double()
    return [h, h / (h.pow(2).mean(-1, keepdim=True) + eps).sqrt() * params[0].double()]


def _swiglu_ref(ins, params, eps):
    g, u = ins[0].double(), ins[1].double()
    return [g * torch.sigmoid(g) * u]


def _geglu_ref(ins, params, eps):
    g, u = ins[0].double(), ins[1].double()
    return [0.5 * g * (1.0 + torch.tanh(SQRT_2_OVER_PI * (g + KAPPA * g.pow(3)))) * u]


def _norm_slack(ins, ref):
    return torch.full_like(ref, 1e-3)  # 10x the norms' atol (rmsnorm, add_rmsnorm: 1e-4)


def _act_slack(ins, ref):
    # geglu's atol_for, 10x: 1 + tanh(z) cancels for gate < 0 in fp32 (swiglu needs none of it)
    g = torch.nan_to_num(ins[0].double().abs(), nan=0.0, posinf=0.0)
    u = torch.nan_to_num(ins[1].double().abs(), nan=0.0, posinf=0.0)
    return 1e-30 + 1e-6 * u * torch.clamp(g, max=8.0)


@dataclass(frozen=True)
class Abi:
    """One problem's C function as the engine calls it: ``ins`` activation inputs of [rows, cols]
    fp32, ``params`` weight vectors of [cols], ``outs`` outputs of [rows, cols], then
    (rows, cols, eps) for a norm or (rows * cols) for a flat elementwise op."""

    declaration: str
    argtypes: tuple
    ins: int
    params: int
    outs: int
    flat: bool
    reference: Callable
    slack: Callable
    rtol: float  # ten times the problem's own

    def shape(self, rows: int, cols: int) -> dict:
        """The problem's shape of a call (what a wrong output is reported at)."""
        return {"n": rows * cols} if self.flat else {"rows": rows, "cols": cols}


ABI: dict[str, Abi] = {
    "rmsnorm": Abi("void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps)",
                   (_P, _P, _P, _I, _I, _F), 1, 1, 1, False, _rmsnorm_ref, _norm_slack, 1e-3),
    "add_rmsnorm": Abi("void add_rmsnorm(const float *x, const float *r, const float *w, float *h, float *y, "
                       "int64_t rows, int64_t cols, float eps)",
                       (_P, _P, _P, _P, _P, _I, _I, _F), 2, 1, 2, False, _add_rmsnorm_ref, _norm_slack, 1e-3),
    "swiglu": Abi("void swiglu(const float *gate, const float *up, float *y, int64_t n)",
                  (_P, _P, _P, _I), 2, 0, 1, True, _swiglu_ref, _act_slack, 1e-4),
    "geglu": Abi("void geglu(const float *gate, const float *up, float *y, int64_t n)",
                 (_P, _P, _P, _I), 2, 0, 1, True, _geglu_ref, _act_slack, 1e-4),
}
assert {f for fams in ELEMENT_OPS.values() for f in fams} == set(ABI)
CHECK_ROWS = (1, 5)  # rows per load-check call: one, and an odd few for a kernel's row blocking
ACTIVATIONS = {"silu": "swiglu", "gelu_tanh": "geglu"}  # the decoder's activation_name -> its problem


def _abi_table(symbols) -> dict:
    return {s: (s, list(ABI[s].argtypes), ABI[s].declaration) for s in symbols}


class ElementKernel:
    """One non-linear op of the engine run by a library's function for ``family``. Subclasses made
    by ``resolve_elements`` carry the library; an instance serves one decoder (its sizes are
    checked when it is made)."""

    op: ClassVar[str]
    name: ClassVar[str]
    library: ClassVar[Library]
    check: ClassVar[bool] = True
    audit_state: ClassVar[dict]  # calls, audited, dropped (what was reported), rng
    on_wrong: ClassVar[object]

    def __init__(self, family: str, sizes: list[tuple[int, int]], eps: float):
        if family not in self.library.fns:
            have = ", ".join(sorted(self.library.fns))
            raise KernelError(f"kernels.{self.op}: {self.name!r} runs {have}, but this model's {self.op} op is "
                              f"{family} (the engine calls {ABI[family].declaration})")
        self.family, self.abi, self.fn = family, ABI[family], self.library.fns[family]
        self._seen: set = set()
        self._params: dict = {}
        if self.check:
            self.verify(sizes, eps)

    def param(self, w: torch.Tensor) -> torch.Tensor:
        """An fp32 contiguous copy of a norm weight, made once per weight."""
        key = (w.data_ptr(), w.numel(), w.dtype)
        if key not in self._params:
            self._params[key] = w.detach().to(torch.float32).contiguous().clone()
        return self._params[key]

    def _invoke(self, ins, params, outs, rows: int, cols: int, eps: float | None) -> None:
        ptrs = [t.data_ptr() for t in (*ins, *params, *outs)]
        if self.abi.flat:
            self.fn(*ptrs, rows * cols)
        else:
            self.fn(*ptrs, rows, cols, eps)

    @staticmethod
    def _buffers(n: int, k: int) -> tuple[list, list]:
        bufs = [torch.full((_GUARD + n + _GUARD,), _SENTINEL, dtype=torch.float32) for _ in range(k)]
        return [b[_GUARD:_GUARD + n] for b in bufs], bufs

    def run(self, ins: list[torch.Tensor], params: list[torch.Tensor], eps: float | None = None
            ) -> list[torch.Tensor] | None:
        """The outputs ([rows, cols] fp32) for inputs [rows, cols] (any dtype) and fp32 params
        (``param``); None once the kernel is dropped (this call's finding included): the caller
        then runs the engine's own code."""
        st = self.audit_state
        if st["dropped"] is not None:
            return None
        rows, cols = ins[0].shape
        if not rows:
            return [torch.empty(0, cols) for _ in range(self.abi.outs)]
        ins = [t.to(torch.float32).contiguous() for t in ins]
        key = (rows, cols)
        audit = self.check and (key not in self._seen or st["rng"].random() < AUDIT_SHARE)
        st["calls"] += 1
        if not audit:
            outs = [torch.empty(rows, cols) for _ in range(self.abi.outs)]
            self._invoke(ins, params, outs, rows, cols, eps)
            return outs
        self._seen.add(key)
        st["audited"] += 1
        before = [t.clone() for t in (*ins, *params)]
        flat, bufs = self._buffers(rows * cols, self.abi.outs)
        self._invoke(ins, params, flat, rows, cols, eps)
        outs = [o.view(rows, cols) for o in flat]
        what = self._fault(ins, params, before, bufs, outs, eps,
                           sorted(st["rng"].sample(range(rows), min(AUDIT_ROWS, rows))))
        if what is None:
            return outs
        if st["dropped"] is None:
            shape = self.abi.shape(rows, cols)
            detail = f"{self.family} {' '.join(f'{k}={v}' for k, v in shape.items())}: {what}"
            st["dropped"] = reported(self.on_wrong, self.library.problem or self.family, self.library.candidate,
                                     shape, detail)
        return None

    def _fault(self, ins, params, before, bufs, outs, eps, rows: list[int]) -> str | None:
        """What is wrong with a call (inputs changed, a write outside an output, a row off the
        fp64 reference), or None."""
        if not all(torch.equal(a, b) for a, b in zip((*ins, *params), before)):
            return "the call changed its inputs"
        if not all(_guards_intact(b) for b in bufs):
            return "the call wrote outside its outputs"
        sub = [t[rows] for t in ins]
        refs = self.abi.reference(sub, params, eps)
        for i, (got, ref) in enumerate(zip((o[rows] for o in outs), refs)):
            err = (got.double() - ref).abs()
            bad = ~(err <= self.abi.rtol * ref.abs() + self.abi.slack(sub, ref))  # NaN counts as bad
            if bool(bad.any()):
                r, c = (int(v) for v in bad.nonzero()[0])
                out = f"output {i} " if len(refs) > 1 else "output "
                return (f"{out}[{rows[r]}, {c}] was {got[r, c].item():.6g}, the fp64 reference gives "
                        f"{ref[r, c].item():.6g} (allowed {self.abi.rtol:g} relative)")
        return None

    def verify(self, sizes: list[tuple[int, int]], eps: float) -> None:
        """Run the kernel on each (rows, cols) of the model's with random inputs; KernelError
        naming the first fault."""
        g = torch.Generator().manual_seed(20261205)
        for rows, cols in sizes:
            ins = [torch.randn(rows, cols, generator=g) for _ in range(self.abi.ins)]
            params = [1.0 + 0.1 * torch.randn(cols, generator=g) for _ in range(self.abi.params)]
            before = [t.clone() for t in (*ins, *params)]
            flat, bufs = self._buffers(rows * cols, self.abi.outs)
            for o in flat:
                o.fill_(float("nan"))  # an output never written stays NaN and fails
            self._invoke(ins, params, flat, rows, cols, eps)
            what = self._fault(ins, params, before, bufs, [o.view(rows, cols) for o in flat], eps, list(range(rows)))
            if what is not None:
                raise KernelError(f"kernel {self.name!r} for the {self.op} op failed its check on {rows} x {cols} "
                                  f"random inputs: {what}; a library that fails it is not served")


class ElementOps:
    """What the decoder calls for its non-linear ops: the kernel a config names for an op, else
    (and once that kernel is dropped) the engine's own code, ``own`` (the decoder's ``TorchOps``)."""

    def __init__(self, own, kernels: dict[str, ElementKernel] | None = None):
        self.own = own
        self.kernels = kernels or {}

    def norm(self, x: torch.Tensor, w2: torch.Tensor, eps: float) -> torch.Tensor:
        k = self.kernels.get("norm")
        if k is not None:
            d = x.shape[-1]
            out = k.run([x.reshape(-1, d)], [k.param(w2[:d])], eps)
            if out is not None:
                return out[0].view(x.shape).to(x.dtype)
        return self.own.norm(x, w2, eps)

    def head_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float, n_q: int) -> torch.Tensor:
        """x [tokens, heads, D], the first ``n_q`` heads q's, the rest k's; w [heads, D]."""
        k = self.kernels.get("norm")
        if k is not None:
            n, heads, d = x.shape
            q = k.run([x[:, :n_q].reshape(-1, d)], [k.param(w[0])], eps)
            kk = k.run([x[:, n_q:].reshape(-1, d)], [k.param(w[n_q])], eps) if q is not None else None
            if kk is not None:
                return torch.cat([q[0].view(n, n_q, d), kk[0].view(n, heads - n_q, d)], dim=1).to(x.dtype)
        return self.own.head_norm(x, w, eps, n_q)

    def add_norm(self, x: torch.Tensor, r: torch.Tensor, w2: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.kernels.get("add_norm")
        if k is not None:
            out = k.run([x, r], [k.param(w2[: x.shape[-1]])], eps)
            if out is not None:
                return out[0].to(x.dtype), out[1].to(x.dtype)
        return self.own.add_norm(x, r, w2, eps)

    def act(self, gu: torch.Tensor, fn) -> torch.Tensor:
        k = self.kernels.get("act")
        if k is not None:
            f = gu.shape[-1] // 2
            out = k.run([gu[:, :f], gu[:, f:]], [])
            if out is not None:
                return out[0].to(gu.dtype)
        return self.own.act(gu, fn)


def _class(op: str, lib: Library, check: bool, on_wrong) -> type[ElementKernel]:
    state = {"calls": 0, "audited": 0, "dropped": None, "rng": random.Random(os.urandom(16))}
    return type(f"ElementKernel_{op}_{lib.sha256[:12]}", (ElementKernel,),
                {"op": op, "name": lib.spec, "library": lib, "check": check, "audit_state": state,
                 "on_wrong": staticmethod(on_wrong)})


def resolve_one(op: str, spec: str, supply: KernelSupply | None = None) -> type[ElementKernel]:
    """The kernel class for ``op`` a kernel name stands for; KernelError naming it."""
    supply = supply or NoSupply()
    try:
        ref = KernelRef.parse(spec)
    except ValueError as e:
        raise KernelError(str(e)) from None
    families = ELEMENT_OPS[op]
    abi = _abi_table(families)
    if ref.kind == "so":
        p = so_path(spec, ref.target)
        copy, sha = cached_copy(p)
        lib = _load(copy, spec, sha, families, abi=abi, origin=str(p.resolve()))
    else:
        family = element_family(op, ref.target)
        if family is None:
            raise KernelError(f"{spec}: only champions of {', '.join(families)} (or of a problem derived from them) "
                              f"run the {op} op")
        try:
            built = supply.build(spec, ABI[family].declaration)
        except UnavailableKernel as e:
            raise KernelError(str(e)) from None
        lib = _load(built.path, spec, _sha256(built.path), (family,), abi=_abi_table((family,)), origin=built.origin,
                    candidate=built.candidate, speedup=built.speedup, problem=ref.target)
    return _class(op, lib, _checks_on(), supply.on_wrong)


def resolve_elements(kernels: dict[str, str], supply: KernelSupply | None = None) -> dict[str, type[ElementKernel]]:
    """op -> kernel class for every non-linear op ``kernels`` names (looked up afresh at each
    engine load); errors name the op."""
    out = {}
    for op, spec in kernels.items():
        if op in ELEMENT_OPS:
            try:
                out[op] = resolve_one(op, spec, supply)
            except KernelError as e:
                raise KernelError(f"kernels.{op}: {e}") from None
    return out
