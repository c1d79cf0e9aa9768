"""What an engine holds in memory, and how many sequences of what length would fit.

- **weights**: every tensor the model and the native decoder hold (weights in their kernels'
  layouts, dense copies, norms, RoPE tables), each storage counted once. The GGUF file itself is
  memory-mapped: its pages are the page cache's, not counted.
- **KV cache**: a layer stores ``2 * kv_heads * head_dim`` values per position it keeps (plus
  their scales for an int8 cache); a sliding-window layer keeps at most its ring of
  ``window - 1 + prefill_chunk`` positions (``kv_cache.KVCache.capacities``), so a sequence of
  ``L`` tokens costs ``sum over layers of per_position * min(L, capacity)``.
- **available**: ``MemAvailable`` of ``/proc/meminfo``, or the cgroup's limit less its usage
  where that is lower. The cache the engine already holds counts as available to a larger one
  (it would replace it); activations and the allocator's slack are not estimated.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .gguf_loader import GGUFModel, QuantTensor
from .kv_cache import KVCache

_MODULE = "swarmfactory.engine"  # objects walked for tensors: the engine's own, never a store or a library


def held_bytes(*roots) -> int:
    """Bytes of the distinct tensor storages (and numpy arrays owning their data) reachable
    from ``roots`` through the engine's objects, lists, tuples and dicts; KV caches and the
    memory-mapped file are left out."""
    seen: set[int] = set()
    storages: dict[int, int] = {}
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen or isinstance(obj, (KVCache, QuantTensor, GGUFModel, str, bytes)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.is_mkldnn:  # an opaque oneDNN tensor has no storage to share
                storages[id(obj)] = obj.numel() * obj.element_size()
            else:
                s = obj.untyped_storage()
                storages[s.data_ptr()] = max(storages.get(s.data_ptr(), 0), s.nbytes())
        elif isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            if base.base is None:  # owns its data (a view of a file mapping does not)
                storages[base.ctypes.data] = base.nbytes
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif type(obj).__module__.startswith(_MODULE):
            stack.extend(getattr(obj, "__dict__", {}).values())
            for cls in type(obj).__mro__:
                slots = getattr(cls, "__slots__", ())
                stack.extend(getattr(obj, n, None) for n in ((slots,) if isinstance(slots, str) else slots))
    return sum(storages.values())


def available_bytes() -> tuple[int | None, str]:
    """(bytes this process may still allocate, where the figure comes from); None where
    neither ``/proc/meminfo`` nor a cgroup says."""
    avail, source = None, "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail, source = int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    for limit_f, usage_f in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
                             ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                              "/sys/fs/cgroup/memory/memory.usage_in_bytes")):  # v1
        try:
            limit = int(Path(limit_f).read_text().strip())  # "max" (none) raises
            left = max(0, limit - int(Path(usage_f).read_text().strip()))
        except (OSError, ValueError):
            continue
        if limit < 1 << 60 and (avail is None or left < avail):
            avail, source = left, "cgroup limit"
        break
    return avail, source


def _per_position(kv: KVCache) -> list[int]:
    """Bytes each layer stores per position of one sequence, from its tensors."""
    out = []
    for i, t in enumerate(kv.kv):
        n = t.numel() * t.element_size()
        if kv.scales is not None:
            n += kv.scales[i].numel() * kv.scales[i].element_size()
        out.append(n // (kv.slots * kv.capacities[i]))
    return out


def estimate(engine) -> dict:
    """The figures of the module docstring for ``engine`` (an ``Engine``), in bytes:
    ``weights_bytes``; ``kv_bytes`` (allocated), ``kv_slots``, ``kv_context`` (max_seq_len);
    ``kv_bytes_per_token`` (a position in every layer), ``kv_bytes_per_token_past_rings`` (in
    the layers without a ring: what each token past the rings costs), ``kv_bytes_per_sequence``
    (one slot at ``kv_context``), ``ring_layers``, ``ring_positions``; ``available_bytes`` and
    ``available_source``; ``fits_sequences`` (sequences of ``kv_context`` tokens that fit) and
    ``fits_context`` (the longest context, up to the model's ``model_context``, that ``kv_slots``
    sequences fit in)."""
    kv, model = engine.kv, engine.model
    per = _per_position(kv)
    chunk = model.max_chunk
    rings = [None if L.window is None else L.window - 1 + chunk for L in model.layers]

    def per_sequence(context: int) -> int:
        return sum(p * (context if r is None else min(context, r)) for p, r in zip(per, rings))

    avail, source = available_bytes()
    budget = None if avail is None else avail + kv.nbytes()
    fits_context = None
    if budget is not None:
        lo, hi = 0, engine.hparams.context_length  # the longest context kv.slots sequences fit in
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if kv.slots * per_sequence(mid) <= budget else (lo, mid - 1)
        fits_context = lo
    seq = per_sequence(kv.max_seq_len)
    return {
        "weights_bytes": held_bytes(model, engine.native),
        "kv_bytes": kv.nbytes(), "kv_slots": kv.slots, "kv_context": kv.max_seq_len,
        "kv_bytes_per_token": sum(per),
        "kv_bytes_per_token_past_rings": sum(p for p, r in zip(per, rings) if r is None),
        "kv_bytes_per_sequence": seq,
        "ring_layers": sum(r is not None for r in rings),
        "ring_positions": max((r for r in rings if r is not None), default=0),
        "available_bytes": avail, "available_source": source,
        "fits_sequences": None if budget is None else budget // seq,
        "fits_context": fits_context, "model_context": engine.hparams.context_length,
    }


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def describe(est: dict) -> list[str]:
    """The two lines ``engine serve`` prints at start."""
    rings = ""
    if est["ring_layers"]:
        rings = (f", {_size(est['kv_bytes_per_token_past_rings'])} past the {est['ring_positions']}-position "
                 f"rings of its {est['ring_layers']} sliding-window layers")
    first = (f"memory: weights {_size(est['weights_bytes'])}; KV cache {_size(est['kv_bytes'])} allocated "
             f"({est['kv_slots']} x {est['kv_context']} tokens, {_size(est['kv_bytes_per_sequence'])} a sequence), "
             f"{_size(est['kv_bytes_per_token'])} a token{rings}")
    if est["available_bytes"] is None:
        return [first, "memory available: unknown (no /proc/meminfo or cgroup limit)"]
    longest = " (the model's longest)" if est["fits_context"] == est["model_context"] else ""
    second = (f"memory available {_size(est['available_bytes'])} ({est['available_source']}): room for a "
              f"KV cache of {est['fits_sequences']} sequences of {est['kv_context']} tokens, or "
              f"{est['kv_slots']} of {est['fits_context']} tokens{longest}")
    return [first, second]
