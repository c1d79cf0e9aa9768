"""Rotary position tables, computed exactly as HF computes them (fp32), then cast.

A ``Rope`` is one frequency set: base ``theta``, optional per-dimension ``factors`` dividing the
frequencies (llama.cpp stores Llama 3.1's scaled frequencies so, as the ``rope_freqs.weight``
tensor) and a ``linear`` factor dividing them all (``rope.scaling.type: linear``). Models with
several sets (Gemma 3: one for its global layers, one for its sliding-window layers) keep one
table pair per set.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rope:
    theta: float
    factors: torch.Tensor | None = None  # [head_dim / 2] fp32
    linear: float = 1.0

    def tables(self, head_dim: int, n_pos: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin), each [n_pos, head_dim] in ``dtype``.

        rotate_half(x) * sin == [x_hi, x_lo] * [-sin_lo, sin_hi]: the sign lives in the table.
        """
        inv = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        if self.factors is not None:
            inv = inv / self.factors
        if self.linear != 1.0:
            inv = inv / self.linear
        freqs = torch.arange(n_pos, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        half = head_dim // 2
        sin = emb.sin()
        return emb.cos().to(dtype), torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).to(dtype)
