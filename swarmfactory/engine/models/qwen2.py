"""``qwen2``: Qwen2 and Qwen2.5. The skeleton with the q/k/v biases every Qwen2 file carries
(``attn_q.bias``...); rows are stored as HF has them (no permutation)."""

from __future__ import annotations

from .decoder import Decoder


class Qwen2(Decoder):
    pass
