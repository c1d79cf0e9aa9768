"""What this CPU and this torch build can run, decided by probing, not by assuming.

A CPU flag says an instruction exists; it does not say that this torch build has a kernel for
it, nor that the kernel computes the right thing. So each optional torch path the engine uses
is run once per process on a tiny tensor and compared with a plain fp32 computation. The
flags come from ``swarmfactory.hardware.cpu_features`` and so honour SWARMFACTORY_CPU_MASK:
a masked machine reports the paths of the machine it emulates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from swarmfactory.hardware import cpu_features, cpu_mask

log = logging.getLogger("swarmfactory.engine")


@dataclass(frozen=True)
class Probe:
    """Whether a path works here; ``reason`` says why not (empty when it works)."""

    ok: bool
    reason: str = ""


def _close(got: torch.Tensor, ref: torch.Tensor, rtol: float) -> bool:
    return bool(torch.isfinite(got).all()) and (got.float() - ref).abs().max().item() <= rtol * ref.abs().max().item()


def _inputs(n: int, k: int, m: int = 3):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, k, generator=g), torch.randn(m, k, generator=g)


def probe_bf16_prepack() -> Probe:
    """oneDNN's bf16 linear on a weight reordered once into its blocked layout (kernels.Dense).

    torch refuses it without avx_ne_convert or AVX-512 BW/VL/DQ, and on such a CPU oneDNN
    would have no fast bf16 kernel anyway, so the flags are checked first (honouring the mask).
    """
    f = cpu_features()
    if "avx_ne_convert" not in f and not {"avx512bw", "avx512vl", "avx512dq"} <= f:
        masked = f" (masked to {cpu_mask()})" if cpu_mask() else ""
        return Probe(False, f"this CPU{masked} has neither avx_ne_convert nor avx512bw/vl/dq")
    if not torch.backends.mkldnn.is_available():
        return Probe(False, "this torch build has no oneDNN")
    try:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return Probe(False, "oneDNN reports no bf16 support (ONEDNN_MAX_CPU_ISA?)")
        w, x = (t.bfloat16() for t in _inputs(48, 64))
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 16)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (RuntimeError, AttributeError) as e:
        return Probe(False, f"the probe raised: {str(e).splitlines()[0][:160]}")
    if not _close(got, F.linear(x.float(), w.float()), 2e-2):
        return Probe(False, "the probe's result is wrong")
    return Probe(True)


def probe_int4pack() -> Probe:
    """torch's int4 CPU kernel (aten._weight_int4pack_mm_for_cpu) with bf16 activations."""
    try:
        w, x = _inputs(16, 64)
        q = torch.randint(0, 16, (16, 64), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
        scale = torch.rand(16, 2, generator=torch.Generator().manual_seed(2)) * 0.05 + 0.01
        zero = torch.randn(16, 2, generator=torch.Generator().manual_seed(3)) * 0.1
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().bfloat16()
        got = torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), packed, 32, sz)
    except (RuntimeError, AttributeError) as e:
        return Probe(False, f"the probe raised: {str(e).splitlines()[0][:160]}")
    sz = sz.float()
    wd = (q.float() - 8).view(16, 2, 32) * sz[..., 0].T[..., None] + sz[..., 1].T[..., None]
    if not _close(got, F.linear(x.bfloat16().float(), wd.view(16, 64)), 2e-2):
        return Probe(False, "the probe's result is wrong")
    return Probe(True)


# Probes run once per process and mask level; tests replace entries to simulate failures.
PROBES = {"bf16_prepack": probe_bf16_prepack, "int4pack": probe_int4pack}


@cache
def _probe(name: str, mask: str | None) -> Probe:
    return PROBES[name]()


def check(name: str) -> Probe:
    """The cached result of probe ``name`` ("bf16_prepack", "int4pack") under the current mask."""
    return _probe(name, cpu_mask())


def reset() -> None:
    """Forget probe results (tests that change PROBES or the mask)."""
    _probe.cache_clear()


def fallback(what: str, reason: str, instead: str) -> str:
    """Log the one line that says a path is not used here, and return it."""
    line = f"{what} unavailable ({reason}); using {instead}"
    log.warning(line)
    return line
