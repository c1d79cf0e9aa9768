"""``gemma3``: Gemma 3 (text).

As llama.cpp and transformers run it: five sliding-window layers to one global layer (every
6th, unless the file stores ``gemma3.attention.sliding_window_pattern``), the sliding ones
seeing the last ``attention.sliding_window`` positions with RoPE base 10000, the global ones
``rope.freq_base`` (and its linear scaling, if any); per-head q/k RMSNorm; a GELU (tanh) gated
FFN; RMSNorm of the attention and FFN outputs before each residual add; embeddings times
sqrt(hidden) in the activation dtype; output head tied to the embeddings. Its norms compute
``x * (1 + w)``: llama.cpp's converter stores ``w + 1``, used as stored.
"""

from __future__ import annotations

import functools

import torch.nn.functional as F

from .decoder import Decoder
from .rope import Rope

LOCAL_ROPE_THETA = 10000.0
PATTERN = 6  # one global layer in six


class Gemma3(Decoder):
    qk_norm = True
    sandwich_norms = True
    activation = staticmethod(functools.partial(F.gelu, approximate="tanh"))
    activation_name = "gelu_tanh"

    def embed_scale(self) -> float:
        return self.hp.dim**0.5

    def attention_scale(self) -> float:
        # query_pre_attn_scalar ** -0.5, which the file does not store: the head size for every
        # Gemma 3 but the 27B (62 layers), whose scalar is hidden / heads (as llama.cpp has it)
        hp = self.hp
        return (hp.dim // hp.n_heads) ** -0.5 if hp.n_layers == 62 else hp.head_dim**-0.5

    def rope_sets(self, gg) -> list[Rope]:
        return [Rope(self.hp.rope_theta, linear=self.hp.rope_scaling_factor), Rope(LOCAL_ROPE_THETA)]

    def layer_rope(self, i: int) -> int:
        return 0 if self.layer_window(i) is None else 1

    def layer_window(self, i: int) -> int | None:
        hp = self.hp
        if not hp.sliding_window:
            return None
        pattern = hp.sliding_window_pattern
        if isinstance(pattern, tuple):
            sliding = pattern[i]
        else:
            sliding = (i + 1) % (pattern or PATTERN) != 0
        return hp.sliding_window if sliding else None
