"""Static KV cache: one slot per running sequence, preallocated for max_seq_len tokens.

Layout per layer: one tensor [2, slots, n_kv_heads, max_seq_len, head_dim] (k plane, v plane),
so one indexed write stores a token's k and v, and each plane is [slots, heads, len, dim] with
slots and heads mergeable into one batch dimension for bmm without a copy. A sequence owns one slot from admission to finish, so nothing is copied when
the batch changes; the scheduler hands out the lowest free slot so that running slots tend to
form a contiguous range, which attention reads as a view instead of a gather.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, slots: int, n_kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype):
        shape = (2, slots, n_kv_heads, max_seq_len, head_dim)
        # zeros, not empty: unused positions are read (and masked) by batched attention, and
        # masked garbage that happens to be NaN would still poison softmax @ V.
        self.kv = [torch.zeros(shape, dtype=dtype) for _ in range(n_layers)]
        self.slots = slots
        self.max_seq_len = max_seq_len
        self._free = list(range(slots))

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

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv)
