"""What one forward computes: a flat batch of decode rows, then prompt chunks (built by the
model runner, ``engine/model_runner.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PrefillChunk:
    row: int  # first row of the chunk in the flat batch
    n: int  # tokens in the chunk
    slot: int
    start: int  # position of the chunk's first token
    mask: torch.Tensor | None = None  # [n, start + n] bool when start > 0 (see offset_causal_mask)


@dataclass
class StepInput:
    """What one forward computes; built by the model runner."""

    tokens: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    slots: torch.Tensor  # [N] int64, KV slot of each token
    n_decode: int  # rows [0, n_decode) are decode tokens, one per sequence
    decode_slots: torch.Tensor | None  # [B]
    decode_range: tuple[int, int] | None  # (first, last + 1) when decode slots are contiguous
    decode_len: int  # longest context among decode rows (after this step's token)
    decode_bias: torch.Tensor | None  # [B, 1, 1, decode_len]: 0 or -inf, None when all lengths equal
    prefills: list[PrefillChunk] = field(default_factory=list)
    logit_rows: torch.Tensor | None = None  # rows whose next-token logits are wanted


def offset_causal_mask(n: int, start: int) -> torch.Tensor:
    """[n, start + n] bool: query i (at position start + i) sees keys 0..start + i."""
    return torch.arange(start + n)[None, :] <= (torch.arange(n)[:, None] + start)
