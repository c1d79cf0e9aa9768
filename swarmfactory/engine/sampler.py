"""Next-token choice per row: greedy (argmax) or temperature + top-p with a per-request seed."""

from __future__ import annotations

import torch

from .sequence import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list) -> list[int]:
    """logits: fp32 [R, V]; one params/generator per row. Greedy rows are exact argmax."""
    if all(p.greedy for p in params):
        return logits.argmax(dim=-1).tolist()
    out = []
    for row, p, g in zip(logits, params, generators):
        if p.greedy:
            out.append(int(row.argmax()))
            continue
        probs = torch.softmax(row / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sorted_p, idx = probs.sort(descending=True)
            keep = sorted_p.cumsum(0) - sorted_p < p.top_p  # always keeps the top token
            sorted_p = torch.where(keep, sorted_p, 0.0)
            choice = torch.multinomial(sorted_p, 1, generator=g)
            out.append(int(idx[choice]))
        else:
            out.append(int(torch.multinomial(probs, 1, generator=g)))
    return out
