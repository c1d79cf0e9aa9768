"""``llama``: SmolLM2, Llama 2 and 3.x, Mistral and the other models llama.cpp writes as llama.

The skeleton as it is. What the file may carry: Llama 3.1's scaled RoPE frequencies as the
``rope_freqs.weight`` tensor, linear RoPE scaling as ``llama.rope.scaling.*``, q/k/v biases; the
loader un-permutes the rows of ``attn_q``/``attn_k``, which llama.cpp's converter permutes for
this architecture only.
"""

from __future__ import annotations

from .decoder import Decoder


class Llama(Decoder):
    native_decoder = True  # engine/native computes exactly this step (Q4_1/Q8_0 weights)
