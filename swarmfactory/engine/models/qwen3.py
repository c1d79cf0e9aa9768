"""``qwen3``: Qwen3 (dense). Per-head RMSNorm of q and k before RoPE (``attn_q_norm``,
``attn_k_norm``), no biases; the head size is ``qwen3.attention.key_length`` (128), which need
not be the hidden size over the heads."""

from __future__ import annotations

from .decoder import Decoder


class Qwen3(Decoder):
    qk_norm = True
