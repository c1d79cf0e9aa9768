"""Llama-family decoder (SmolLM2, Llama 2/3...) over a flat batch of tokens.

One forward runs a mixed step: decode tokens of running sequences (one each, batched attention
over the KV cache) followed by prompt chunks of sequences being prefilled (causal attention per
chunk). All linear layers see the whole flat batch, so matmuls are as large as the step allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .config import EngineConfig
from .gguf_loader import GGUFModel
from .kernels import Linear, Weight, build_linear
from .kv_cache import KVCache


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


class Layer:
    __slots__ = ("attn_norm", "qkv", "o", "ffn_norm", "gate_up", "down")

    def __init__(self, attn_norm, qkv, o, ffn_norm, gate_up, down):
        self.attn_norm, self.qkv, self.o = attn_norm, qkv, o
        self.ffn_norm, self.gate_up, self.down = ffn_norm, gate_up, down


class Llama:
    """``dense_above``: op -> rows for the q4_1 ops that keep a dense copy (see EngineConfig);
    the engine passes the configured or measured thresholds. ``classes``: op -> the kernel class
    of each shared object the config names (``native_seam.resolve_all``)."""

    def __init__(self, gg: GGUFModel, cfg: EngineConfig, dense_above: dict[str, int] | None = None,
                 classes: dict | None = None):
        hp = gg.hparams
        self.hp = hp
        self.dtype = torch.float32 if cfg.weights == "fp32" else torch.bfloat16
        self.kv_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}[cfg.kv_dtype]
        # attention runs in the cache's dtype; an int8 cache is read back to fp32
        self.att_dtype = torch.float32 if self.kv_dtype == torch.int8 else self.kv_dtype
        self.n_heads, self.n_kv, self.hd = hp.n_heads, hp.n_kv_heads, hp.head_dim
        self.group = hp.n_heads // hp.n_kv_heads
        self.eps = hp.norm_eps
        self.scale = 1.0 / self.hd**0.5
        self.exact_attention = cfg.attention == "exact"
        kernels = cfg.kernels
        dense_above = dense_above or {}
        dt = self.dtype

        def lin(op: str, *names: str) -> Linear:
            w = Weight([gg.tensor(n) for n in names])
            return build_linear(cfg.weights, op, w, dt, kernels.get(op), dense_above.get(op), (classes or {}).get(op))

        def vec(name: str) -> torch.Tensor:
            return gg.tensor(name).dequantize().reshape(-1).to(dt)

        def norm_w(name: str) -> torch.Tensor:
            w = vec(name)
            return torch.cat([w, torch.zeros_like(w)])  # see rms_norm

        self.embed = gg.tensor("token_embd.weight").dequantize().to(dt)
        self.layers = []
        for i in range(hp.n_layers):
            p = f"blk.{i}."
            self.layers.append(Layer(
                norm_w(p + "attn_norm.weight"),
                lin("qkv", p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"),
                lin("o", p + "attn_output.weight"),
                norm_w(p + "ffn_norm.weight"),
                lin("gate_up", p + "ffn_gate.weight", p + "ffn_up.weight"),
                lin("down", p + "ffn_down.weight"),
            ))
        self.norm = norm_w("output_norm.weight")
        self.lm_head = lin("lm_head", "token_embd.weight" if hp.tied_embeddings else "output.weight")

        # RoPE tables exactly as HF computes them (fp32), cast to the activation dtype.
        # At least 512 positions: calibration (engine/calibrate.py) runs 256-token prompts whatever
        # max_seq_len is, and the tables are tiny.
        n_pos = min(max(cfg.max_seq_len, 512), hp.context_length)
        inv = 1.0 / (hp.rope_theta ** (torch.arange(0, self.hd, 2, dtype=torch.int64).float() / self.hd))
        freqs = torch.arange(n_pos, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        half = self.hd // 2
        sin = emb.sin()
        # rotate_half(x) * sin == [x_hi, x_lo] * [-sin_lo, sin_hi]: the sign lives in the table.
        self.cos = emb.cos().to(dt)
        self._zero = torch.zeros(1, 1, 1, dtype=self.att_dtype)  # baddbmm's ignored input (beta=0)
        self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).to(dt)

    def new_cache(self, slots: int, max_seq_len: int) -> KVCache:
        return KVCache(self.hp.n_layers, slots, self.n_kv, max_seq_len, self.hd, self.kv_dtype)

    def _rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, H + 2KV, D] cos and signed-sin for every head of the fused q|k|v output.

        v heads get cos 1 and sin 0, so one elementwise pass ropes q and k and carries v
        along, leaving k|v adjacent for a single KV-cache write.
        """
        n, H, KV, D = positions.shape[0], self.n_heads, self.n_kv, self.hd
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin_signed[positions].unsqueeze(1)
        c = torch.ones(n, H + 2 * KV, D, dtype=self.dtype)
        sn = torch.zeros(n, H + 2 * KV, D, dtype=self.dtype)
        c[:, : H + KV] = cos
        sn[:, : H + KV] = sin
        return c, sn

    def _decode_attention(self, q: torch.Tensor, kv: KVCache, li: int, s: StepInput) -> torch.Tensor:
        """One query token per sequence against its cached keys: [B, H, D] -> [B, H * D].

        Plain bmm + softmax: at one query row per head, SDPA's flash kernel costs 2-3x more on
        CPU. The G query heads sharing a kv head form the rows of one small matmul.
        """
        B, KV, G, D, L = q.shape[0], self.n_kv, self.group, self.hd, s.decode_len
        if self.exact_attention:
            return self._exact_decode_attention(q, kv, li, s)
        slots = slice(*s.decode_range) if s.decode_range is not None else s.decode_slots
        k, v = kv.read(li, 0, slots, L, self.att_dtype), kv.read(li, 1, slots, L, self.att_dtype)
        k, v = k.reshape(B * KV, L, D), v.reshape(B * KV, L, D)  # views when slots are a range
        scores = torch.baddbmm(self._zero, q.reshape(B * KV, G, D), k.transpose(1, 2), beta=0.0,
                               alpha=self.scale)
        if s.decode_bias is not None:
            scores.view(B, KV, G, L).add_(s.decode_bias)
        return torch.bmm(torch.softmax(scores, dim=-1), v).view(B, KV * G * D)

    def _exact_decode_attention(self, q: torch.Tensor, kv: KVCache, li: int, s: StepInput) -> torch.Tensor:
        """``attention: exact``: each sequence against exactly its own context, with the same
        operations (and shapes) whatever else is in the step, so batching never changes its sums."""
        B, KV, G, D = q.shape[0], self.n_kv, self.group, self.hd
        slots = (range(*s.decode_range) if s.decode_range is not None else s.decode_slots.tolist())
        lens = (s.positions[:B] + 1).tolist()
        out = torch.empty(B, KV * G * D, dtype=q.dtype)
        for i, (slot, n) in enumerate(zip(slots, lens)):
            k, v = kv.read(li, 0, slot, n, self.att_dtype), kv.read(li, 1, slot, n, self.att_dtype)  # [KV, n, D]
            scores = torch.baddbmm(self._zero, q[i].reshape(KV, G, D), k.transpose(1, 2), beta=0.0,
                                   alpha=self.scale)
            out[i] = torch.bmm(torch.softmax(scores, dim=-1), v).view(KV * G * D)
        return out

    @torch.inference_mode()
    def forward(self, s: StepInput, kv: KVCache) -> torch.Tensor:
        """Returns fp32 logits [len(logit_rows), vocab]."""
        n = s.tokens.shape[0]
        H, KV, D, G = self.n_heads, self.n_kv, self.hd, self.group
        heads, half, eps = H + 2 * KV, self.hd // 2, self.eps
        cos, sin = self._rope_tables(s.positions)
        nd = s.n_decode
        cast = self.att_dtype != self.dtype
        x = F.embedding(s.tokens, self.embed)
        for li, L in enumerate(self.layers):
            h = rms_norm(x, L.attn_norm, eps)
            qkv = L.qkv(h).view(n, heads, D)
            rot = torch.cat([qkv[..., half:], qkv[..., :half]], dim=-1)  # cheaper than roll
            qkv = torch.addcmul(qkv * cos, rot, sin)
            if cast:
                qkv = qkv.to(self.att_dtype)
            kv.write(li, s.slots, s.positions, qkv[:, H:].view(n, 2, KV, D))
            outs = []
            if nd:
                outs.append(self._decode_attention(qkv[:nd, :H], kv, li, s))
            for ch in s.prefills:
                q = qkv[ch.row : ch.row + ch.n, :H].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
                end = ch.start + ch.n
                one = slice(ch.slot, ch.slot + 1)
                k, v = kv.read(li, 0, one, end, self.att_dtype), kv.read(li, 1, one, end, self.att_dtype)
                if ch.start == 0:
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                else:
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=ch.mask, enable_gqa=True)
                outs.append(o.squeeze(0).transpose(0, 1).reshape(ch.n, H * D))
            attn = outs[0] if len(outs) == 1 else torch.cat(outs)
            if cast:
                attn = attn.to(self.dtype)
            x = x + L.o(attn)
            h = rms_norm(x, L.ffn_norm, eps)
            gu = L.gate_up(h)
            f = gu.shape[-1] // 2
            x = x + L.down(F.silu(gu[:, :f]) * gu[:, f:])
        if s.logit_rows is not None:
            if s.logit_rows.numel() == 0:
                return torch.empty(0, self.hp.vocab_size)
            x = x[s.logit_rows]
        x = rms_norm(x, self.norm, eps)
        return self.lm_head(x).float()


def rms_norm(x: torch.Tensor, w2: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with weight w, given w2 = [w, 0].

    layer_norm over [x, -x] has mean 0 and variance mean(x^2), so it is exactly RMSNorm, in
    one fused kernel with fp32 accumulation; torch's rms_norm runs as ~8 separate ops for bf16.
    """
    d = x.shape[-1]
    return F.layer_norm(torch.cat([x, -x], dim=-1), (2 * d,), w2, None, eps)[:, :d].contiguous()


def offset_causal_mask(n: int, start: int) -> torch.Tensor:
    """[n, start + n] bool: query i (at position start + i) sees keys 0..start + i."""
    return torch.arange(start + n)[None, :] <= (torch.arange(n)[:, None] + start)
