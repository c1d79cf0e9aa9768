"""Static KV cache: one slot per running sequence, preallocated for max_seq_len tokens.

Layout per layer: one tensor [2, slots, n_kv_heads, max_seq_len, head_dim] (k plane, v plane),
so one indexed write stores a token's k and v, and each plane is [slots, heads, len, dim] with
slots and heads mergeable into one batch dimension for bmm without a copy. A sequence owns one slot from admission to finish, so nothing is copied when
the batch changes; the scheduler hands out the lowest free slot so that running slots tend to
form a contiguous range, which attention reads as a view instead of a gather.

Sliding-window layers (``capacities``): a layer whose attention sees only the last few positions
keeps a ring of ``capacity`` positions per slot instead of ``max_seq_len``; position p lives at
p % capacity, so a long context costs its window, not its length. ``ring_positions`` says which
position each entry holds; the model masks by it.

int8 (``dtype=torch.int8``): each token's k (and v) of each kv head is stored as int8 with its
own fp32 scale in ``scales`` ([2, slots, n_kv_heads, max_seq_len, 1] per layer), written by
``write`` and read back as fp32 by ``read``; the float dtypes store values as they are.
"""

from __future__ import annotations

import torch


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per vector (last dim) symmetric int8: (q, scale) with x ~ q * scale, scale = absmax / 127
    (1 for an all-zero vector)."""
    x = x.float()
    amax = x.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    return torch.round(x / scale).clamp_(-127, 127).to(torch.int8), scale


def ring_positions(last: torch.Tensor, n: int, capacity: int) -> torch.Tensor:
    """The position held by entries 0..n-1 of a ring of ``capacity`` whose sequence last wrote
    position ``last`` (any shape S -> S + [n]); negative where nothing was written yet. A cache
    layer that is not a ring is the case capacity > last: entry r holds position r."""
    last = last[..., None]
    return last - ((last - torch.arange(n)) % capacity)


class KVCache:
    """``capacities``: positions kept per layer (default: ``max_seq_len`` for every layer); a
    layer with fewer is a ring (see the module docstring)."""

    def __init__(self, n_layers: int, slots: int, n_kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype, capacities: list[int] | None = None):
        self.capacities = list(capacities) if capacities is not None else [max_seq_len] * n_layers
        if len(self.capacities) != n_layers or not all(0 < c <= max_seq_len for c in self.capacities):
            raise ValueError(f"capacities must be {n_layers} values in 1..{max_seq_len}")
        shapes = [(2, slots, n_kv_heads, c, head_dim) for c in self.capacities]
        # zeros, not empty: unused positions are read (and masked) by batched attention, and
        # masked garbage that happens to be NaN would still poison softmax @ V.
        self.kv = [torch.zeros(shape, dtype=dtype) for shape in shapes]
        self.quantized = dtype == torch.int8
        self.scales = ([torch.zeros((*shape[:-1], 1), dtype=torch.float32) for shape in shapes]
                       if self.quantized else None)
        self.slots = slots
        self.max_seq_len = max_seq_len
        self._free = list(range(slots))

    def is_ring(self, layer: int) -> bool:
        return self.capacities[layer] < self.max_seq_len

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        self._free.sort()
        return self._free.pop(0)

    def release(self, slot: int) -> None:
        if slot in self._free:
            raise ValueError(f"KV slot {slot} released twice")
        self._free.append(slot)

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor) -> None:
        """Store ``kv`` [n, 2, n_kv_heads, head_dim] (each row's k and v) at (slot, position) per row."""
        if self.is_ring(layer):
            positions = positions % self.capacities[layer]
        if self.quantized:
            q, scale = quantize_int8(kv)
            self.kv[layer][:, slots, :, positions] = q
            self.scales[layer][:, slots, :, positions] = scale
        else:
            self.kv[layer][:, slots, :, positions] = kv

    def read(self, layer: int, plane: int, slots, end: int, dtype: torch.dtype) -> torch.Tensor:
        """Plane 0 (k) or 1 (v) of ``slots`` (an int, a slice or an index tensor) for positions
        0..end-1, as ``dtype``: a view of the cache where it is stored so, else a copy. A ring
        layer gives its first min(end, capacity) entries (see ``ring_positions``)."""
        end = min(end, self.capacities[layer])
        t = self.kv[layer][plane, slots, :, :end]
        if self.quantized:
            return t.to(dtype) * self.scales[layer][plane, slots, :, :end].to(dtype)
        return t

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv + (self.scales or []))
