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
from .native_seam import (AUDIT_ROWS, AUDIT_SHARE, Library, _checks_on, _guards_intact, _load, _sha256, cached_copy,
                          guarded, reported, so_path)
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
ROPE = ("void rope(const float *x, const int64_t *pos, float *y, int64_t tokens, int64_t heads, int64_t head_dim, "
        "float theta)", (_P, _P, _P, _I, _I, _I, _F))
ATTENTION = ("void attention_decode(const float *q, const float *k, const float *v, float *out, int64_t batch, "
             "int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim, float scale)",
             (_P, _P, _P, _P, _I, _I, _I, _I, _I, _F))
# every problem's C function: symbol -> (declaration, argtypes)
DECLARATIONS = {**{f: (a.declaration, a.argtypes) for f, a in ABI.items()}, "rope": ROPE,
                "attention_decode": ATTENTION}
assert {f for fams in ELEMENT_OPS.values() for f in fams} == set(DECLARATIONS)
CHECK_ROWS = (1, 5)  # rows per load-check call: one, and an odd few for a kernel's row blocking
ACTIVATIONS = {"silu": "swiglu", "gelu_tanh": "geglu"}  # the decoder's activation_name -> its problem


def families(activation_name: str) -> dict[str, str]:
    """op -> the problem whose kernel runs it in a model whose FFN gates with ``activation_name``
    (no ``act`` for an activation no problem computes)."""
    act = ACTIVATIONS.get(activation_name)
    return {"norm": "rmsnorm", "add_norm": "add_rmsnorm", **({"act": act} if act else {}), "rope": "rope",
            "attention": "attention_decode"}
# The rope problem's domain (problems/suites/cpu/rope.py): positions below MAX_POS (an fp32 angle
# loses accuracy with the position, and its tolerance is set there), theta within THETA. A call
# outside it runs the engine's own code: not a fault of the kernel.
ROPE_MAX_POS, ROPE_THETA = 4096, (1e4, 1e6)
CHECK_SEQ = (1, 7, 300)  # keys per load-check call of the attention kernel


def _abi_table(symbols) -> dict:
    return {s: (s, list(DECLARATIONS[s][1]), DECLARATIONS[s][0]) for s in symbols}


class Audited:
    """What every kernel of a non-linear op shares: its library, whether it is checked, the audit
    state of its op (calls, audited, dropped: what was reported, rng) and whom to tell."""

    op: ClassVar[str]
    name: ClassVar[str]
    library: ClassVar[Library]
    check: ClassVar[bool] = True
    audit_state: ClassVar[dict]
    on_wrong: ClassVar[object]

    def _bind(self, family: str, declaration: str) -> None:
        if family not in self.library.fns:
            have = ", ".join(sorted(self.library.fns))
            raise KernelError(f"kernels.{self.op}: {self.name!r} runs {have}, but this model's {self.op} op is "
                              f"{family} (the engine calls {declaration})")
        self.family, self.fn = family, self.library.fns[family]
        self._seen: set = set()
        self._gap = self._draw()

    @property
    def dropped(self) -> bool:
        return self.audit_state["dropped"] is not None

    def _draw(self) -> int:
        """Calls until the next random audit: geometric with mean 1 / AUDIT_SHARE, from an rng seeded
        from os.urandom (a kernel cannot foresee it); one draw per audit, not one per call."""
        u = self.audit_state["rng"].random()
        return 1 + int(math.log1p(-u) / math.log1p(-AUDIT_SHARE))

    def _audit_now(self, key) -> bool:
        """Whether this call is audited (the first at ``key``, then a random AUDIT_SHARE); counts it."""
        st = self.audit_state
        st["calls"] += 1
        if not self.check:
            return False
        if key in self._seen:
            self._gap -= 1
            if self._gap > 0:
                return False
            self._gap = self._draw()
        else:
            self._seen.add(key)
        st["audited"] += 1
        return True

    def _report(self, shape: dict, what: str) -> None:
        """Drop the kernel (for every decoder on it) and report what a call at ``shape`` did, once."""
        st = self.audit_state
        if st["dropped"] is None:
            detail = f"{self.family} {' '.join(f'{k}={v}' for k, v in shape.items())}: {what}"
            st["dropped"] = reported(self.on_wrong, self.library.problem or self.family, self.library.candidate,
                                     shape, detail)

    def _refused(self, where: str, what: str) -> KernelError:
        return KernelError(f"kernel {self.name!r} for the {self.op} op failed its check on {where}: {what}; a "
                           "library that fails it is not served")

    def _call(self, invoke, inputs: list[torch.Tensor], n: int, k: int, shape: tuple, audit: bool,
              poison: bool = False, inputs_are: str = "its inputs") -> tuple[list[torch.Tensor], str | None]:
        """``invoke(outputs)`` on k fresh outputs of n floats viewed as ``shape``, each between guard
        zones (``native_seam.guarded``: on every call, audited or not, so a kernel cannot tell the
        two apart). Audited: ``inputs`` must come back unchanged and the guards intact; ``poison``
        fills the outputs with NaN first (a value never written fails). Returns (the outputs,
        what was wrong or None); the caller compares the values with its reference."""
        got = [guarded(n, self.audit_state["rng"], shape) for _ in range(k)]
        outs = [o for o, _ in got]
        if not audit:
            invoke(outs)
            return outs, None
        before = [t.clone() for t in inputs]
        if poison:
            for o in outs:
                o.fill_(float("nan"))
        invoke(outs)
        if not all(torch.equal(a, b) for a, b in zip(inputs, before)):
            return outs, f"the call changed {inputs_are}"
        if not all(_guards_intact(g) for _, g in got):
            return outs, "the call wrote outside its outputs"
        return outs, None


class ElementKernel(Audited):
    """One row-wise non-linear op of the engine (a norm, the add + norm, the activation) run by a
    library's function for ``family``. Subclasses made by ``resolve_elements`` carry the library;
    an instance serves one decoder (its sizes are checked when it is made)."""

    def __init__(self, family: str, sizes: list[tuple[int, int]], eps: float):
        self._bind(family, ABI[family].declaration)
        self.abi = ABI[family]
        self._params: dict = {}
        if self.check:
            self.verify(sizes, eps)

    def param(self, w: torch.Tensor, n: int | None = None, row: int | None = None) -> torch.Tensor:
        """An fp32 contiguous copy of a norm weight (``w[row]`` or ``w[:n]``), made once per weight:
        kept by the weight tensor's identity, with the tensor itself (so the identity is never
        another's), as the decoder's weights live as long as it does."""
        key = (id(w), n, row)
        got = self._params.get(key)
        if got is None:
            part = w[row] if row is not None else (w[:n] if n is not None else w)
            got = self._params[key] = (w, part.detach().to(torch.float32).contiguous().clone())
        return got[1]

    def _invoke(self, ins, params, outs, rows: int, cols: int, eps: float | None) -> None:
        ptrs = [t.data_ptr() for t in (*ins, *params, *outs)]
        if self.abi.flat:
            self.fn(*ptrs, rows * cols)
        else:
            self.fn(*ptrs, rows, cols, eps)

    def run(self, ins: list[torch.Tensor], params: list[torch.Tensor], eps: float | None = None
            ) -> list[torch.Tensor] | None:
        """The outputs ([rows, cols] fp32) for inputs [rows, cols] (any dtype) and fp32 params
        (``param``); None once the kernel is dropped (this call's finding included): the caller
        then runs the engine's own code."""
        if self.dropped:
            return None
        rows, cols = ins[0].shape
        if not rows:
            return [torch.empty(0, cols) for _ in range(self.abi.outs)]
        ins = [t if t.dtype == torch.float32 and t.is_contiguous() else t.to(torch.float32).contiguous() for t in ins]
        audit = self._audit_now((rows, cols))
        outs, what = self._checked(ins, params, rows, cols, eps, audit)
        if audit and what is None:
            what = self._wrong(ins, params, outs, eps,
                               sorted(self.audit_state["rng"].sample(range(rows), min(AUDIT_ROWS, rows))))
        if what is None:
            return outs
        self._report(self.abi.shape(rows, cols), what)
        return None

    def _checked(self, ins, params, rows: int, cols: int, eps, audit: bool, poison: bool = False):
        return self._call(lambda outs: self._invoke(ins, params, outs, rows, cols, eps), [*ins, *params],
                          rows * cols, self.abi.outs, (rows, cols), audit, poison)

    def _wrong(self, ins, params, outs, eps, rows: list[int]) -> str | None:
        """The first output of ``rows`` off the fp64 reference, or None."""
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
            outs, what = self._checked(ins, params, rows, cols, eps, audit=True, poison=True)
            what = what or self._wrong(ins, params, outs, eps, list(range(rows)))
            if what is not None:
                raise self._refused(f"{rows} x {cols} random inputs", what)


def _rope_ref(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    x = x.double()
    inv = float(theta) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None, None] * inv
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)


class RopeKernel(Audited):
    """RoPE of the q and k heads by a ``rope`` kernel, for the model's frequency sets the problem
    computes (plain ``theta`` frequencies: no per-dimension factors, no scaling, theta within
    ``ROPE_THETA``); ``thetas`` holds each set's base, or None where the engine's own tables run."""

    def __init__(self, family: str, heads: int, head_dim: int, thetas: list[float | None]):
        self._bind(family, ROPE[0])
        self.thetas = thetas
        if not any(t is not None for t in thetas):
            raise KernelError(f"kernels.{self.op}: {self.name!r} computes RoPE with plain theta frequencies "
                              f"(theta {ROPE_THETA[0]:g} .. {ROPE_THETA[1]:g}); this model's RoPE scales its "
                              "frequencies or lies outside that range, so no layer could run it")
        if self.check:
            g = torch.Generator().manual_seed(20261205)
            for tokens in CHECK_ROWS:
                x = torch.randn(tokens, heads, head_dim, generator=g)
                pos = torch.randint(0, ROPE_MAX_POS, (tokens,), generator=g)
                pos[0] = ROPE_MAX_POS - 1  # the largest angle
                for theta in {t for t in thetas if t is not None}:
                    y, what = self._rope(x, pos, theta, audit=True, poison=True)
                    if what is not None:
                        raise self._refused(f"{tokens} token(s) x {heads} heads x {head_dim}, theta {theta:g}", what)

    def _rope(self, x, pos, theta, audit: bool, poison: bool = False) -> tuple[torch.Tensor, str | None]:
        tokens, heads, d = x.shape
        [y], what = self._call(lambda o: self.fn(x.data_ptr(), pos.data_ptr(), o[0].data_ptr(), tokens, heads, d, theta),
                               [x, pos], tokens * heads * d, 1, (tokens, heads * d), audit, poison)
        y = y.view(tokens, heads, d)
        if not audit or what is not None:
            return y, what
        rows = sorted(self.audit_state["rng"].sample(range(tokens), min(AUDIT_ROWS, tokens))) if not poison \
            else list(range(tokens))
        ref = _rope_ref(x[rows], pos[rows], theta)
        half = d // 2
        pair = (ref[..., :half].pow(2) + ref[..., half:].pow(2)).sqrt().repeat(1, 1, 2)
        err = (y[rows].double() - ref).abs()
        bad = ~(err <= 1e-3 * ref.abs() + 1e-4 + 1e-3 * pair)  # the problem's, its rtol and atol 10x
        if bool(bad.any()):
            t, h, c = (int(v) for v in bad.nonzero()[0])
            return y, (f"output [{rows[t]}, {h}, {c}] (position {int(pos[rows[t]])}) was {y[rows[t], h, c].item():.6g}, "
                       f"the fp64 reference gives {ref[t, h, c].item():.6g}")
        return y, None

    def apply(self, x: torch.Tensor, pos: torch.Tensor, rope_set: int) -> torch.Tensor | None:
        """x [tokens, heads, D] roped at ``pos`` (fp32), or None: the engine's own code runs this
        call (the kernel dropped, this set not the problem's, a position past its range)."""
        theta = self.thetas[rope_set]
        if self.dropped or theta is None or not len(pos) or int(pos.max()) >= ROPE_MAX_POS:
            return None
        x = x.to(torch.float32).contiguous()
        pos = pos.to(torch.int64).contiguous()
        tokens, heads, d = x.shape
        y, what = self._rope(x, pos, theta, audit=self._audit_now((heads, d, tokens)))
        if what is None:
            return y
        self._report({"tokens": tokens, "heads": heads, "head_dim": d}, what)
        return None


class AttentionKernel(Audited):
    """Decode attention by an ``attention_decode`` kernel: one call per sequence and kv head, its
    ``group`` query heads against that head's keys and values read in place from an fp32 KV cache
    (``[slots, kv heads, capacity, D]`` per plane, so a head's first positions are contiguous);
    a sliding-window layer's window is one stretch of its ring, or two gathered into one where it
    wraps. Batch invariant: each sequence's sums are its own."""

    def __init__(self, family: str, group: int, head_dim: int, scale: float):
        self._bind(family, ATTENTION[0])
        self.group, self.head_dim, self.scale = group, head_dim, scale
        if self.check:
            g = torch.Generator().manual_seed(20261205)
            for seq in CHECK_SEQ:
                q = torch.randn(group, head_dim, generator=g)
                k, v = torch.randn(seq, head_dim, generator=g), torch.randn(seq, head_dim, generator=g)
                what = self._attend(q, k, v, audit=True, poison=True)[1]
                if what is not None:
                    raise self._refused(f"{group} query head(s), {seq} key(s) of {head_dim}", what)

    def _attend(self, q, k, v, audit: bool, poison: bool = False) -> tuple[torch.Tensor, str | None]:
        G, D = q.shape
        seq = k.shape[0]
        [out], what = self._call(
            lambda o: self.fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), o[0].data_ptr(), 1, G, 1, seq, D, self.scale),
            [q, k, v], G * D, 1, (G, D), audit, poison, "its inputs (the query or the KV cache)")
        if not audit or what is not None:
            return out, what
        p = ((q.double() @ k.double().T) * self.scale).softmax(-1)
        ref = p @ v.double()
        err = (out.double() - ref).abs()
        bad = ~(err <= 1e-3 * ref.abs() + 1e-3)  # the problem's tolerance, 10x
        if bool(bad.any()):
            h, c = (int(x) for x in bad.nonzero()[0])
            return out, (f"output [{h}, {c}] over {seq} keys was {out[h, c].item():.6g}, the fp64 reference gives "
                         f"{ref[h, c].item():.6g}")
        return out, None

    def decode(self, q: torch.Tensor, k_plane: torch.Tensor, v_plane: torch.Tensor, slots: list[int],
               lens: list[int], capacity: int, window: int | None) -> torch.Tensor | None:
        """q [B, KV * G, D] (one decode token per sequence) -> [B, KV * G * D], or None once the
        kernel is dropped (the engine's own attention then runs the step)."""
        if self.dropped or k_plane.dtype != torch.float32:
            return None
        B, KV, G, D = q.shape[0], k_plane.shape[1], self.group, self.head_dim
        qs = q.to(torch.float32).reshape(B, KV, G, D)
        out = torch.empty(B, KV, G, D)
        for i, (slot, n) in enumerate(zip(slots, lens)):
            length = n if window is None else min(n, window)
            start = (n - length) % capacity  # the ring entry of the oldest position the query sees
            for h in range(KV):
                kh, vh = k_plane[slot, h], v_plane[slot, h]
                if start + length <= capacity:
                    k, v = kh[start:start + length], vh[start:start + length]
                else:  # the window wraps around the ring: its two stretches, gathered
                    k = torch.cat([kh[start:], kh[: start + length - capacity]])
                    v = torch.cat([vh[start:], vh[: start + length - capacity]])
                qh = qs[i, h].contiguous()
                audit = self._audit_now((G, D, length.bit_length()))
                o, what = self._attend(qh, k, v, audit)
                if what is not None:
                    self._report({"batch": 1, "heads": G, "kv_heads": 1, "seq": length, "head_dim": D}, what)
                    return None
                out[i, h] = o
        return out.view(B, KV * G * D)


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
            out = k.run([x if x.dim() == 2 else x.reshape(-1, d)], [k.param(w2, n=d)], eps)
            if out is not None:
                y = out[0] if x.dim() == 2 else out[0].view(x.shape)
                return y if x.dtype == torch.float32 else y.to(x.dtype)
        return self.own.norm(x, w2, eps)

    def head_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float, n_q: int) -> torch.Tensor:
        """x [tokens, heads, D], the first ``n_q`` heads q's, the rest k's; w [heads, D]."""
        k = self.kernels.get("norm")
        if k is not None:
            n, heads, d = x.shape
            q = k.run([x[:, :n_q].reshape(-1, d)], [k.param(w, row=0)], eps)
            kk = k.run([x[:, n_q:].reshape(-1, d)], [k.param(w, row=n_q)], eps) if q is not None else None
            if kk is not None:
                return torch.cat([q[0].view(n, n_q, d), kk[0].view(n, heads - n_q, d)], dim=1).to(x.dtype)
        return self.own.head_norm(x, w, eps, n_q)

    def add_norm(self, x: torch.Tensor, r: torch.Tensor, w2: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.kernels.get("add_norm")
        if k is not None:
            out = k.run([x, r], [k.param(w2, n=x.shape[-1])], eps)
            if out is not None:
                return (out[0], out[1]) if x.dtype == torch.float32 else (out[0].to(x.dtype), out[1].to(x.dtype))
        return self.own.add_norm(x, r, w2, eps)

    def rope(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, n_rot: int,
             rope_set: int) -> torch.Tensor:
        """qkv [tokens, heads, D] with its first ``n_rot`` heads (q and k) roped."""
        k = self.kernels.get("rope")
        if k is not None:
            y = k.apply(qkv[:, :n_rot], positions, rope_set)
            if y is not None:
                return torch.cat([y.to(qkv.dtype), qkv[:, n_rot:]], dim=1)
        return self.own.rope(qkv, cos, sin, positions, n_rot, rope_set)

    def act(self, gu: torch.Tensor, fn) -> torch.Tensor:
        k = self.kernels.get("act")
        if k is not None:
            f = gu.shape[-1] // 2
            out = k.run([gu[:, :f], gu[:, f:]], [])
            if out is not None:
                return out[0] if gu.dtype == torch.float32 else out[0].to(gu.dtype)
        return self.own.act(gu, fn)


KINDS = {"rope": RopeKernel, "attention": AttentionKernel}  # op -> its kernel class (row-wise ops: ElementKernel)


def _class(op: str, lib: Library, check: bool, on_wrong) -> type[Audited]:
    state = {"calls": 0, "audited": 0, "dropped": None, "rng": random.Random(os.urandom(16))}
    base = KINDS.get(op, ElementKernel)
    return type(f"{base.__name__}_{op}_{lib.sha256[:12]}", (base,),
                {"op": op, "name": lib.spec, "library": lib, "check": check, "audit_state": state,
                 "on_wrong": staticmethod(on_wrong)})


def resolve_one(op: str, spec: str, supply: KernelSupply | None = None) -> type[Audited]:
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
            built = supply.build(spec, DECLARATIONS[family][0])
        except UnavailableKernel as e:
            raise KernelError(str(e)) from None
        lib = _load(built.path, spec, _sha256(built.path), (family,), abi=abi, origin=built.origin,
                    candidate=built.candidate, speedup=built.speedup, problem=ref.target)
    return _class(op, lib, _checks_on(), supply.on_wrong)


def resolve_elements(kernels: dict[str, str], supply: KernelSupply | None = None) -> dict[str, type[Audited]]:
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
