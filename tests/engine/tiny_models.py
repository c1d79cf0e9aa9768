"""Tiny random decoders, one per architecture, written as GGUF the way llama.cpp writes them.

Nothing is downloaded: ``hf_model(arch)`` is a small HF config with random weights (a fixed
seed), and ``write_gguf`` writes it as ``convert_hf_to_gguf.py`` does (its ``TextModel``,
``LlamaModel``, ``Qwen2Model``, ``Qwen3Model`` and ``Gemma3Model``): the same metadata keys,
tensor names from gguf's own name map, q/k rows permuted for llama only, Gemma's norms stored as
``w + 1``, 1-D tensors and norms in F32, Llama 3 RoPE scaling as a ``rope_freqs`` tensor of
per-dimension factors. The tokenizer is a consistent subset of the bundled SmolLM2 file's GPT-2
BPE (its first ``VOCAB`` tokens and the merges among them), so the engine's tokenizer loads and
the vocabulary stays small.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

VOCAB = 1024
SEED = 0

# name -> (HF config class, its options); every one small enough to build and run in well under
# a second. gemma3 has six layers, so that one is global (every 6th) and five slide over a window
# shorter than the test prompts.
CONFIGS: dict[str, tuple[str, dict]] = {
    # untied head, a head size that is not hidden / heads (Mistral-style)
    "llama": ("LlamaConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                  tie_word_embeddings=False, rms_norm_eps=1e-5)),
    "qwen2": ("Qwen2Config", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                  rms_norm_eps=1e-6, rope_parameters={"rope_type": "default",
                                                                      "rope_theta": 1_000_000.0})),
    # head size 128 (what transformers assumes for a qwen3 GGUF), not hidden / heads = 32
    "qwen3": ("Qwen3Config", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                                  tie_word_embeddings=False, rms_norm_eps=1e-6)),
    # head size 256 = query_pre_attn_scalar, as in Gemma 3 270M (the file stores no scalar)
    "gemma3": ("Gemma3TextConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                                        query_pre_attn_scalar=256, sliding_window=8, rms_norm_eps=1e-6)),
}
GEMMA_WINDOW = CONFIGS["gemma3"][1]["sliding_window"]

# HF config of the llama variants with RoPE scaling (compared against the HF model itself:
# transformers does not read rope_freqs or rope.scaling back from a GGUF)
ROPE_SCALING = {
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
}

_GGUF_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3,
              "gemma3": gguf.MODEL_ARCH.GEMMA3}
_FILE_TYPE = {QT.F32: "ALL_F32", QT.F16: "MOSTLY_F16", QT.BF16: "MOSTLY_BF16", QT.Q8_0: "MOSTLY_Q8_0",
              QT.Q4_0: "MOSTLY_Q4_0", QT.Q4_1: "MOSTLY_Q4_1", QT.Q5_0: "MOSTLY_Q5_0", QT.Q5_1: "MOSTLY_Q5_1",
              QT.Q4_K: "MOSTLY_Q4_K_M", QT.Q5_K: "MOSTLY_Q5_K_M", QT.Q6_K: "MOSTLY_Q6_K"}
# llama-quantize's type for a tensor whose rows do not fill whole 256-element super-blocks
_K_FALLBACK = {QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0}


def hf_model(arch: str, rope: str | None = None, **overrides):
    """A random HF causal LM of ``arch`` (``rope``: a ``ROPE_SCALING`` variant of llama), in
    fp32 eval mode. Norm weights and biases are random too, so the file's conventions matter."""
    import transformers
    from transformers import AutoModelForCausalLM

    cls_name, opts = CONFIGS[arch]
    opts = {**opts, "vocab_size": VOCAB, "max_position_embeddings": 256, "initializer_range": 0.1,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, **overrides}
    if rope:
        opts["rope_parameters"] = dict(ROPE_SCALING[rope])
    if arch == "qwen2":
        opts["attention_bias"] = True  # Qwen2's q/k/v projections always have biases
    cfg = getattr(transformers, cls_name)(**opts)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma's norms multiply by 1 + w (w is zero at init), others by w
                base = 0.0 if arch == "gemma3" else 1.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model.eval()


def write_gguf(model, arch: str, path: Path, qtype: QT = QT.F32) -> Path:
    """Write ``model`` (from ``hf_model``) to ``path`` as convert_hf_to_gguf.py would, its 2-D
    weights as ``qtype`` (F32, F16, or a type ``swarmfactory.engine.quants`` quantises)."""
    cfg = model.config
    w = gguf.GGUFWriter(path, _GGUF_ARCH[arch].name.lower())
    w.add_name(f"tiny {arch}")
    w.add_file_type(getattr(gguf.LlamaFileType, _FILE_TYPE[qtype]))
    if qtype not in (QT.F32, QT.F16):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _hparams(w, cfg, arch)
    for key, value, vtype, sub in _tokenizer_fields():
        w.add_key_value(key, value, vtype, sub)
    for name, data in _tensors(model, arch):
        _add_tensor(w, name, data, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_unknown_arch(path: Path, arch: str = "mamba") -> Path:
    """A GGUF of an architecture the engine does not compute (one tensor, a few keys)."""
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_tensor("token_embd.weight", np.zeros((VOCAB, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _hparams(w: gguf.GGUFWriter, cfg, arch: str) -> None:
    """TextModel.set_gguf_parameters and the architecture's own additions."""
    hp = cfg.to_dict()
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if hp.get("head_dim") is not None:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if arch == "llama":
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(hp.get("head_dim") or cfg.hidden_size // cfg.num_attention_heads)
    if arch == "gemma3":
        w.add_sliding_window(cfg.sliding_window)


@lru_cache(maxsize=1)
def _tokenizer_fields() -> tuple:
    """(key, value, type, element type) of the bundled SmolLM2 file's tokenizer, cut to VOCAB."""
    from swarmfactory.engine.gguf_loader import bundled_model_path

    reader = gguf.GGUFReader(bundled_model_path())
    fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}

    def strings(f, n=None) -> list[str]:  # element by element: contents() of 49k strings is slow
        return [bytes(f.parts[i]).decode() for i in f.data[:n]]

    tokens = strings(fields["tokenizer.ggml.tokens"], VOCAB)
    kept = set(tokens)

    def inside(merge: str) -> bool:
        a, b = merge.split(" ", 1)
        return a in kept and b in kept and a + b in kept

    values = {"tokenizer.ggml.tokens": tokens,
              "tokenizer.ggml.token_type": fields["tokenizer.ggml.token_type"].contents()[:VOCAB],
              "tokenizer.ggml.merges": [m for m in strings(fields["tokenizer.ggml.merges"]) if inside(m)]}
    return tuple((k, values[k] if k in values else f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
                 for k, f in fields.items())


def _permute(w: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    """LlamaModel.permute of convert_hf_to_gguf.py."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(model, arch: str):
    """(GGUF name, fp32 numpy array) of every tensor the converter writes."""
    cfg = model.config
    names = gguf.get_tensor_name_map(_GGUF_ARCH[arch], cfg.num_hidden_layers)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    if arch == "llama" and rope.get("rope_type") == "llama3":
        yield "rope_freqs.weight", _llama3_factors(cfg, rope)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        t = t.detach().float()
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            t = _permute(t, cfg.num_attention_heads, cfg.num_attention_heads)
        elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            t = _permute(t, cfg.num_attention_heads, cfg.num_key_value_heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            t = t + 1  # Gemma3RMSNorm multiplies by 1 + w
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"no GGUF name for {name}")
        yield new, t.numpy()


def _llama3_factors(cfg, rope: dict) -> np.ndarray:
    """LlamaModel.generate_extra_tensors: the factors each RoPE frequency is divided by."""
    base, factor = rope["rope_theta"], rope["factor"]
    dim = cfg.to_dict().get("head_dim") or cfg.hidden_size // cfg.num_attention_heads
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _add_tensor(w: gguf.GGUFWriter, name: str, data: np.ndarray, qtype: QT) -> None:
    if data.ndim <= 1 or name.endswith("_norm.weight") or qtype == QT.F32:
        w.add_tensor(name, data.astype(np.float32))
        return
    if qtype == QT.F16:
        w.add_tensor(name, data.astype(np.float16))
        return
    from swarmfactory.engine import quants

    if qtype in _K_FALLBACK and data.shape[-1] % 256:
        qtype = _K_FALLBACK[qtype]
    raw = quants.quantize(data, qtype, name=name)
    w.add_tensor(name, raw, raw_dtype=qtype)
