"""Linear-layer kernels, one class per kernel, chosen per op by ``EngineConfig.kernels``.

This is the seam where the kernel factory plugs in: a kernel is a class with a ``name``, the
weight types it accepts, and two methods:

- ``__init__(weight, act_dtype)`` prepares the weight once (repacking, dequantising...). It may
  keep references to ``weight`` but must not modify it.
- ``__call__(x) -> y`` computes ``y = x @ W.T`` for ``x`` of shape [M, K] in ``act_dtype`` and
  returns [M, N] in ``act_dtype``. It must not modify ``x`` and must be correct for every M >= 1.

Register new kernels with ``register_kernel`` or the ``swarmfactory.engine_kernels`` entry-point
group (name -> class); the engine verifies a build end to end (tests/engine), not per kernel.
Names with a prefix, ``so:PATH`` and ``champion:q4_1_matmul``, are native shared objects built
by the kernel factory (``native_seam.py``: one ctypes call per op call, each weight checked once
at load).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from importlib.metadata import entry_points
from typing import ClassVar

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from .capabilities import check
from .gguf_loader import QuantTensor


class Weight:
    """One logical weight [N, K]: stored tensors concatenated along rows (e.g. q|k|v)."""

    def __init__(self, parts: list[QuantTensor]):
        self.parts = parts
        self.qtypes = {p.qtype for p in parts}
        self.rows = sum(p.rows for p in parts)
        self.cols = parts[0].cols
        self.name = "+".join(p.name for p in parts)

    @property
    def qtype(self) -> QT | None:
        return next(iter(self.qtypes)) if len(self.qtypes) == 1 else None

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts]) if len(self.parts) > 1 else self.parts[0].dequantize()

    def q4_1(self):
        qs, ds, ms = zip(*(p.q4_1() for p in self.parts))
        return torch.cat(qs), torch.cat(ds), torch.cat(ms)

    def q8_0(self):
        qs, ds = zip(*(p.q8_0() for p in self.parts))
        return torch.cat(qs), torch.cat(ds)

    def blocks(self) -> torch.Tensor:
        """Stored blocks of all parts, row after row: uint8 [rows, bytes_per_row]."""
        return torch.cat([p.blocks() for p in self.parts])


class LinearKernel(ABC):
    name: ClassVar[str]
    qtypes: ClassVar[frozenset[QT] | None] = None  # accepted stored types; None = any
    act_dtypes: ClassVar[frozenset[torch.dtype]] = frozenset({torch.float32, torch.bfloat16})

    def __init__(self, weight: Weight, act_dtype: torch.dtype):
        if self.qtypes is not None and not weight.qtypes <= self.qtypes:
            got = ", ".join(sorted(q.name for q in weight.qtypes))
            raise KernelError(f"kernel {self.name!r} cannot run {weight.name} (stored as {got})")
        if act_dtype not in self.act_dtypes:
            raise KernelError(f"kernel {self.name!r} does not support {act_dtype} activations")
        self.act_dtype = act_dtype
        self.out_features, self.in_features = weight.rows, weight.cols

    @abstractmethod
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class KernelError(ValueError):
    pass


class Dense(LinearKernel):
    """The stored weight dequantised to the activation dtype.

    fp32 runs F.linear (MKL sgemm, as the HF reference does). bf16 runs oneDNN with the weight
    reordered once into its blocked layout: F.linear would reorder it on every call, which on
    this kind of CPU makes a small-batch bf16 matmul 1.3-2.5x slower. Where that path fails its
    probe (no AVX-512 BW/VL/DQ nor avx_ne_convert: torch refuses it, and its fallback bf16
    matmul was 3-4x slower than sgemm at 32-256 rows on AVX2), the bf16-rounded weight is kept
    in fp32 and run by sgemm: the same weights, fp32 accumulation, a bf16 result.
    """

    name = "dense"
    PACK_HINT = 16  # batch size oneDNN optimises the blocked layout for

    def __init__(self, weight: Weight, act_dtype: torch.dtype):
        super().__init__(weight, act_dtype)
        self.w = weight.dequantize().to(act_dtype).contiguous()
        self.packed = None
        self.upcast = False
        if act_dtype == torch.bfloat16:
            if check("bf16_prepack").ok:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.w, self.PACK_HINT)
                self.w = None  # the packed copy replaces it
            else:
                self.w, self.upcast = self.w.float(), True

    @staticmethod
    def path(act_dtype: torch.dtype) -> str:
        """How a dense bf16 or fp32 matmul runs on this machine, for reports."""
        if act_dtype != torch.bfloat16:
            return "fp32 sgemm"
        return "bf16 oneDNN, prepacked" if check("bf16_prepack").ok else "fp32 sgemm on bf16-rounded weights"

    def __call__(self, x):
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        if self.upcast:
            return F.linear(x.float(), self.w).to(x.dtype)
        return F.linear(x, self.w)


def _int4pack(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype):
    """Pack for aten._weight_int4pack_mm_for_cpu, which computes w = (q - 8) * scale + zero."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
    sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(dtype)  # [K/32, N, 2]
    return packed, sz


class Int4Pack(LinearKernel):
    """Q4_1 blocks run by torch's int4 CPU kernel: group 32, scale d, zero m + 8d (bf16)."""

    name = "int4pack"
    qtypes = frozenset({QT.Q4_1})
    act_dtypes = frozenset({torch.bfloat16})

    def __init__(self, weight: Weight, act_dtype: torch.dtype):
        super().__init__(weight, act_dtype)
        q, d, m = weight.q4_1()
        self.packed, self.sz = _int4pack(q, d, m + 8 * d, act_dtype)

    def __call__(self, x):
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, 32, self.sz)


class Int4x2(LinearKernel):
    """Q8_0 blocks run exactly as two int4 planes: q = 16*hi + lo, w = 16d*hi + d*lo.

    Two calls of torch's int4 kernel read ~0.5 bytes/weight each, which at small M beats
    a dense bf16 matmul (2 bytes/weight) and keeps the file's 8-bit precision.
    """

    name = "int4x2"
    qtypes = frozenset({QT.Q8_0})
    act_dtypes = frozenset({torch.bfloat16})

    def __init__(self, weight: Weight, act_dtype: torch.dtype):
        super().__init__(weight, act_dtype)
        q, d = weight.q8_0()
        q = q.to(torch.int16)
        hi, lo = torch.div(q, 16, rounding_mode="floor"), torch.remainder(q, 16)  # hi in -8..7
        zeros = torch.zeros_like(d)
        self.hi = _int4pack(hi + 8, 16 * d, zeros, act_dtype)
        self.lo = _int4pack(lo, d, 8 * d, act_dtype)

    def __call__(self, x):
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.hi[0], 32, self.hi[1])
        return y.add_(torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.lo[0], 32, self.lo[1]))


class Q41Function(LinearKernel):
    """Adapter for kernels with the kernel factory's ``q4_1_matmul`` ABI.

    ``fn(wq, x, y, n, k, batch)``: ``wq`` the raw GGUF Q4_1 blocks of W [n, k] (uint8 tensor,
    n * k / 32 blocks of 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles), ``x`` fp32 [batch, k]
    contiguous, ``y`` fp32 [batch, n] to be written. Make one with ``register_q4_1_matmul``.
    """

    qtypes = frozenset({QT.Q4_1})
    fn: ClassVar

    def __init__(self, weight: Weight, act_dtype: torch.dtype):
        super().__init__(weight, act_dtype)
        self.wq = weight.blocks().reshape(-1).contiguous()

    def __call__(self, x):
        xf = x.float().contiguous()
        y = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
        type(self).fn(self.wq, xf, y, self.out_features, self.in_features, x.shape[0])
        return y if self.act_dtype == torch.float32 else y.to(self.act_dtype)


def register_q4_1_matmul(name: str, fn) -> type[LinearKernel]:
    """Register ``fn`` (q4_1_matmul ABI, see Q41Function) as kernel ``name`` for Q4_1 ops."""
    cls = type(f"Q41Function_{name}", (Q41Function,), {"name": name, "fn": staticmethod(fn)})
    return register_kernel(cls)


_REGISTRY: dict[str, type[LinearKernel]] = {k.name: k for k in (Dense, Int4Pack, Int4x2)}
_ENTRY_POINTS_LOADED = False


def register_kernel(cls: type[LinearKernel]) -> type[LinearKernel]:
    """Add a kernel class to the registry (usable as a decorator)."""
    _REGISTRY[cls.name] = cls
    return cls


def kernel_class(name: str) -> type[LinearKernel]:
    global _ENTRY_POINTS_LOADED
    if name not in _REGISTRY:
        from .native import qlinear  # noqa: F401  (registers "qnative")
    if name not in _REGISTRY and not _ENTRY_POINTS_LOADED:
        _ENTRY_POINTS_LOADED = True
        for ep in entry_points(group="swarmfactory.engine_kernels"):
            _REGISTRY.setdefault(ep.name, ep.load())
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KernelError(f"unknown kernel {name!r} (known: {', '.join(sorted(_REGISTRY))})") from None


def available_kernels() -> list[str]:
    kernel_class("dense")
    return sorted(_REGISTRY)


def default_kernel(weights: str, op: str, weight: Weight) -> str:
    """The kernel an op runs when the config names none (dense where torch's int4 kernel fails
    its probe on this machine); a weight torch's int4 kernels cannot run (K-quants, Q4_0, Q5_x,
    mixed types) stays in its blocks and runs natively where this machine has a checked build."""
    from .native.qlinear import default_for  # registers "qnative"

    if (native := default_for(weights, weight)) is not None:
        return native
    if weights != "q4_1" or not check("int4pack").ok:
        return "dense"
    if weight.qtype == QT.Q4_1:
        return "int4pack"
    if weight.qtype == QT.Q8_0:
        return "int4x2"
    return "dense"


class Linear:
    """One op: its kernel, plus (q4_1 only) a dense bf16 copy used when M > dense_above."""

    __slots__ = ("kernel", "dense", "dense_above")

    def __init__(self, kernel: LinearKernel, dense: LinearKernel | None, dense_above: int):
        self.kernel, self.dense, self.dense_above = kernel, dense, dense_above

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense is not None and x.shape[0] > self.dense_above:
            return self.dense(x)
        return self.kernel(x)


def build_linear(weights: str, op: str, weight: Weight, act_dtype: torch.dtype, name: str | None,
                 dense_above: int | None, cls: type | None = None) -> Linear:
    """The op's linear layer: ``cls`` if given (a shared object the config names, resolved by
    the engine's plan), else the kernel registered as ``name`` (or the default)."""
    kname = name or default_kernel(weights, op, weight)
    try:
        if cls is None and ":" in kname:  # so:PATH; a champion needs the engine's supply (engine/paths.py)
            from .native_seam import resolve_joined

            cls = resolve_joined(kname)
        kernel = (cls or kernel_class(kname))(weight, act_dtype)
    except KernelError as e:
        if name is None or str(e).startswith("kernels."):
            raise
        raise KernelError(f"kernels.{op}: {e}") from None
    dense = None
    if weights == "q4_1" and dense_above is not None and kname != "dense":
        dense = Dense(weight, act_dtype)
    return Linear(kernel, dense, dense_above or 0)
