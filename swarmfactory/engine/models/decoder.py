"""The decoder-only skeleton every architecture shares, over a flat batch of tokens.

One forward runs a mixed step: decode tokens of running sequences (one each, batched attention
over the KV cache) followed by prompt chunks of sequences being prefilled (causal attention per
chunk). All linear layers see the whole flat batch, so matmuls are as large as the step allows.

Every weight is read by its llama.cpp name (``blk.N.attn_q.weight``...). An architecture is a
subclass in a module of its own (``models/ARCH.py``) that sets what differs:

- ``qk_norm``: RMSNorm of each q and k head before RoPE (``attn_q_norm``, ``attn_k_norm``);
- ``sandwich_norms``: RMSNorm of the attention and FFN outputs before their residual adds
  (``post_attention_norm``, ``post_ffw_norm``);
- ``activation``: the gated FFN's (SiLU unless set);
- ``embed_scale()``: what the embeddings are multiplied by (None: nothing);
- ``rope_sets()`` / ``layer_rope(i)``: the RoPE frequency sets and the one layer i uses;
- ``layer_window(i)``: how many positions (its own included) a query of layer i sees (None: all);
- ``attention_scale()``;
- ``activation_name``: ``activation``'s name for the native block step (``silu``, ``gelu_tanh``);
- ``native_decoder``: whether decode.c computes this architecture's step (the plain llama step);
- ``block_step``: whether the native block step (``native/qstep.c``) computes it: true for any
  architecture that only sets the hooks above; one that overrides ``forward`` sets it False.

The non-linear ops (the norms, the residual add with the norm after it, the gated activation,
RoPE; decode attention in ``_decode_attention``) go through ``self.ops``: the engine's own code (``TorchOps``), or a kernel-factory kernel where the
config names one (``native_ops.py``; ``classes`` holds it under its op key).

q, k and v biases are added wherever the file has them. RMSNorm weights are used as stored: a
norm written as ``x * (1 + w)`` (Gemma) is stored by llama.cpp's converter as ``w + 1``.
Sliding-window layers keep a ring of ``window - 1 + prefill_chunk`` positions in the KV cache
(``kv_cache.py``), so a prompt chunk never evicts a key one of its queries needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import EngineConfig
from ..gguf_loader import GGUFModel
from ..kernels import Dense, Linear, Weight, build_linear
from ..kv_cache import KVCache, ring_positions
from ..native_ops import CHECK_ROWS, ROPE_THETA, ElementOps, families
from .rope import Rope
from .step import PrefillChunk, StepInput


# The tensors each linear op stacks along its output, in a layer (blk.<i>.<name>.weight), and the
# output head's: what the engine multiplies, for whoever reads a file's ops (problems/derive.py,
# enginefactory/design.py) as well as for the decoder.
OP_TENSORS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
              "down": ("ffn_down",)}


def op_weights(op: str, layer: int) -> list[str]:
    """The weight tensors of linear op ``op`` of layer ``layer``."""
    return [f"blk.{layer}.{t}.weight" for t in OP_TENSORS[op]]


def head_weight(tensors) -> str:
    """The output head's tensor: its own, or the embedding where the file ties them."""
    return "output.weight" if "output.weight" in tensors else "token_embd.weight"


class Layer:
    __slots__ = ("attn_norm", "qkv", "qkv_bias", "qk_norm", "o", "post_attn_norm", "ffn_norm", "gate_up", "down",
                 "post_ffn_norm", "window", "rope")

    def __init__(self, **parts):
        for name in self.__slots__:
            setattr(self, name, parts.get(name))


class Decoder:
    """``dense_above``: op -> rows for the q4_1 ops that keep a dense copy (see EngineConfig);
    the engine passes the configured or measured thresholds. ``classes``: op -> the kernel class
    of each shared object the config names (``native_seam.resolve_all``)."""

    qk_norm = False
    sandwich_norms = False
    activation = staticmethod(F.silu)
    activation_name = "silu"
    native_decoder = False
    block_step = True

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
        self.scale = self.attention_scale()
        self._sdpa_scale = None if self.scale == 1.0 / self.hd**0.5 else self.scale  # None: SDPA's own
        self.exact_attention = cfg.attention == "exact"
        self.max_chunk = cfg.prefill_chunk  # the longest prompt chunk a step holds: sizes the rings
        kernels = cfg.kernels
        dense_above = dense_above or {}
        dt = self.dtype

        def lin(op: str, *names: str) -> Linear:
            w = Weight([gg.tensor(n) for n in names])
            return build_linear(cfg.weights, op, w, dt, kernels.get(op), dense_above.get(op), (classes or {}).get(op))

        self.lm_head = lin("lm_head", head_weight(gg.tensors))
        head = self.lm_head.kernel
        if hp.tied_embeddings and isinstance(head, Dense) and head.w is not None and head.w.dtype == dt:
            self.embed = head.w  # a tied head run dense holds the embedding's very numbers: one copy
        else:
            self.embed = gg.tensor("token_embd.weight").dequantize().to(dt)
        mul = self.embed_scale()
        # as HF does: an fp32 scalar cast to the activation dtype
        self.embed_mul = None if mul is None else torch.tensor(mul).to(dt)
        self.layers = [self._layer(gg, lin, i) for i in range(hp.n_layers)]
        self.norm = self._norm_w(gg, "output_norm.weight")

        # At least 512 positions: calibration (engine/calibrate.py) runs 256-token prompts whatever
        # max_seq_len is, and the tables are tiny.
        n_pos = min(max(cfg.max_seq_len, 512), hp.context_length)
        self.ropes = self.rope_sets(gg)
        self.rope_tables = [r.tables(self.hd, n_pos, dt) for r in self.ropes]
        self.cos, self.sin_signed = self.rope_tables[0]
        self._zero = torch.zeros(1, 1, 1, dtype=self.att_dtype)  # baddbmm's ignored input (beta=0)
        self.ops = self._element_ops(classes or {})

    def _element_ops(self, classes: dict) -> ElementOps:
        """The non-linear ops: a named kernel per op (checked here on this model's sizes), the
        engine's own code for the others."""
        hp, rows, fam = self.hp, CHECK_ROWS, families(self.activation_name)
        sizes = {"norm": [(r, hp.dim) for r in rows] + ([(r * self.n_heads, self.hd) for r in rows]
                                                        if self.qk_norm else []),
                 "add_norm": [(r, hp.dim) for r in rows], "act": [(r, hp.ffn_dim) for r in rows]}
        made = {op: cls(fam[op], sizes[op], self.eps) for op, cls in classes.items() if op in sizes}
        if "rope" in classes:  # the sets the rope problem computes: plain theta frequencies in its range
            thetas = [r.theta if r.factors is None and r.linear == 1.0 and ROPE_THETA[0] <= r.theta <= ROPE_THETA[1]
                      else None for r in self.ropes]
            made["rope"] = classes["rope"](fam["rope"], self.n_heads + self.n_kv, self.hd, thetas)
        if "attention" in classes:
            made["attention"] = classes["attention"](fam["attention"], self.group, self.hd, self.scale)
        return ElementOps(TorchOps(), made)

    # -- hooks (see the module docstring) ------------------------------------------------------
    def embed_scale(self) -> float | None:
        return None

    def rope_sets(self, gg: GGUFModel) -> list[Rope]:
        """Base frequency, ``rope_freqs.weight`` where the file has it, linear scaling."""
        f = gg.tensors.get("rope_freqs.weight")
        return [Rope(self.hp.rope_theta, None if f is None else f.dequantize().reshape(-1),
                     self.hp.rope_scaling_factor)]

    def layer_rope(self, i: int) -> int:
        return 0

    def layer_window(self, i: int) -> int | None:
        return None

    def attention_scale(self) -> float:
        return 1.0 / self.hd**0.5

    # -- weights -------------------------------------------------------------------------------
    def _vec(self, gg: GGUFModel, name: str) -> torch.Tensor:
        return gg.tensor(name).dequantize().reshape(-1).to(self.dtype)

    def _norm_w(self, gg: GGUFModel, name: str) -> torch.Tensor:
        w = self._vec(gg, name)
        return torch.cat([w, torch.zeros_like(w)])  # see rms_norm

    def _layer(self, gg: GGUFModel, lin, i: int) -> Layer:
        p, H, KV, D = f"blk.{i}.", self.n_heads, self.n_kv, self.hd
        bias = None
        names = [p + f"attn_{x}.bias" for x in "qkv"]
        if any(n in gg.tensors for n in names):
            bias = torch.cat([self._vec(gg, n) if n in gg.tensors else torch.zeros(size, dtype=self.dtype)
                              for n, size in zip(names, (H * D, KV * D, KV * D))])
        qk_norm = None
        if self.qk_norm:  # one row per q and k head of the fused output
            qk_norm = torch.cat([self._vec(gg, p + "attn_q_norm.weight").expand(H, D),
                                 self._vec(gg, p + "attn_k_norm.weight").expand(KV, D)])
        post = self.sandwich_norms
        return Layer(
            attn_norm=self._norm_w(gg, p + "attn_norm.weight"),
            qkv=lin("qkv", *op_weights("qkv", i)),
            qkv_bias=bias, qk_norm=qk_norm,
            o=lin("o", *op_weights("o", i)),
            post_attn_norm=self._norm_w(gg, p + "post_attention_norm.weight") if post else None,
            ffn_norm=self._norm_w(gg, p + "ffn_norm.weight"),
            gate_up=lin("gate_up", *op_weights("gate_up", i)),
            down=lin("down", *op_weights("down", i)),
            post_ffn_norm=self._norm_w(gg, p + "post_ffw_norm.weight") if post else None,
            window=self.layer_window(i), rope=self.layer_rope(i),
        )

    def new_cache(self, slots: int, max_seq_len: int) -> KVCache:
        caps = [max_seq_len if L.window is None else min(max_seq_len, L.window - 1 + self.max_chunk)
                for L in self.layers]
        return KVCache(self.hp.n_layers, slots, self.n_kv, max_seq_len, self.hd, self.kv_dtype, caps)

    # -- forward -------------------------------------------------------------------------------
    def _rope_tables(self, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, H + 2KV, D] cos and signed-sin for every head of the fused q|k|v output.

        v heads get cos 1 and sin 0, so one elementwise pass ropes q and k and carries v
        along, leaving k|v adjacent for a single KV-cache write.
        """
        n, H, KV, D = positions.shape[0], self.n_heads, self.n_kv, self.hd
        c = torch.ones(n, H + 2 * KV, D, dtype=self.dtype)
        sn = torch.zeros(n, H + 2 * KV, D, dtype=self.dtype)
        c[:, : H + KV] = cos[positions].unsqueeze(1)
        sn[:, : H + KV] = sin[positions].unsqueeze(1)
        return c, sn

    def _decode_attention(self, q: torch.Tensor, kv: KVCache, li: int, s: StepInput, window: int | None,
                          masks: dict) -> torch.Tensor:
        """One query token per sequence against its cached keys: [B, H, D] -> [B, H * D].

        Plain bmm + softmax: at one query row per head, SDPA's flash kernel costs 2-3x more on
        CPU. The G query heads sharing a kv head form the rows of one small matmul.
        """
        kernel = self.ops.kernels.get("attention")
        if kernel is not None:  # a kernel-factory kernel, per sequence (None: dropped, this step included)
            slots = (list(range(*s.decode_range)) if s.decode_range is not None else s.decode_slots.tolist())
            out = kernel.decode(q, kv.kv[li][0], kv.kv[li][1], slots, (s.positions[: q.shape[0]] + 1).tolist(),
                                kv.capacities[li], window)
            if out is not None:
                return out.to(q.dtype)
        if self.exact_attention:
            return self._exact_decode_attention(q, kv, li, s, window)
        B, KV, G, D = q.shape[0], self.n_kv, self.group, self.hd
        L = s.decode_len if window is None else min(s.decode_len, kv.capacities[li])
        slots = slice(*s.decode_range) if s.decode_range is not None else s.decode_slots
        k, v = kv.read(li, 0, slots, L, self.att_dtype), kv.read(li, 1, slots, L, self.att_dtype)
        k, v = k.reshape(B * KV, L, D), v.reshape(B * KV, L, D)  # views when slots are a range
        scores = torch.baddbmm(self._zero, q.reshape(B * KV, G, D), k.transpose(1, 2), beta=0.0,
                               alpha=self.scale)
        bias = s.decode_bias if window is None else self._decode_window_bias(s, kv.capacities[li], window, L, masks)
        if bias is not None:
            scores.view(B, KV, G, L).add_(bias)
        return torch.bmm(torch.softmax(scores, dim=-1), v).view(B, KV * G * D)

    def _decode_window_bias(self, s: StepInput, cap: int, window: int, L: int, masks: dict) -> torch.Tensor:
        """[B, 1, 1, L]: 0 where a decode row's cache entry holds one of its last ``window``
        positions, -inf elsewhere (older, not yet written, or beyond a shorter sequence)."""
        key = ("decode", window, cap)
        if key not in masks:
            pos = s.positions[: s.n_decode]
            kp = ring_positions(pos, L, cap)
            ok = (kp >= 0) & (kp > pos[:, None] - window)
            bias = torch.zeros(len(pos), L, dtype=self.att_dtype).masked_fill_(~ok, float("-inf"))
            masks[key] = bias.view(len(pos), 1, 1, L)
        return masks[key]

    def _exact_decode_attention(self, q: torch.Tensor, kv: KVCache, li: int, s: StepInput,
                                window: int | None) -> torch.Tensor:
        """``attention: exact``: each sequence against exactly its own context, with the same
        operations (and shapes) whatever else is in the step, so batching never changes its sums."""
        B, KV, G, D = q.shape[0], self.n_kv, self.group, self.hd
        slots = (range(*s.decode_range) if s.decode_range is not None else s.decode_slots.tolist())
        lens = (s.positions[:B] + 1).tolist()
        out = torch.empty(B, KV * G * D, dtype=q.dtype)
        for i, (slot, n) in enumerate(zip(slots, lens)):
            m = n if window is None else min(n, kv.capacities[li])
            k, v = kv.read(li, 0, slot, m, self.att_dtype), kv.read(li, 1, slot, m, self.att_dtype)  # [KV, m, D]
            scores = torch.baddbmm(self._zero, q[i].reshape(KV, G, D), k.transpose(1, 2), beta=0.0,
                                   alpha=self.scale)
            if window is not None and n > window:
                scores.masked_fill_(ring_positions(torch.tensor(n - 1), m, kv.capacities[li]) <= n - 1 - window,
                                    float("-inf"))
            out[i] = torch.bmm(torch.softmax(scores, dim=-1), v).view(KV * G * D)
        return out

    def _prefill_attention(self, q: torch.Tensor, kv: KVCache, li: int, ch: PrefillChunk, window: int | None,
                           masks: dict) -> torch.Tensor:
        """A prompt chunk's queries [n, H, D] against its sequence's cache: [n, H * D]."""
        q = q.transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        end = ch.start + ch.n
        one = slice(ch.slot, ch.slot + 1)
        k, v = kv.read(li, 0, one, end, self.att_dtype), kv.read(li, 1, one, end, self.att_dtype)
        sc = self._sdpa_scale
        if window is not None:
            mask = self._chunk_window_mask(ch, kv.capacities[li], window, masks)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sc, enable_gqa=True)
        elif ch.start == 0:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=sc, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=ch.mask, scale=sc, enable_gqa=True)
        return o.squeeze(0).transpose(0, 1).reshape(ch.n, self.n_heads * self.hd)

    def _chunk_window_mask(self, ch: PrefillChunk, cap: int, window: int, masks: dict) -> torch.Tensor:
        """[n, min(end, cap)] bool: query i (position start + i) sees the entries holding
        positions start + i - window + 1 .. start + i."""
        key = ("chunk", ch.row, window, cap)
        if key not in masks:
            end = ch.start + ch.n
            if end > cap and ch.n > cap - window + 1:
                raise ValueError(f"a prompt chunk of {ch.n} tokens overruns a sliding-window ring of {cap} "
                                 f"positions (window {window}); chunks must hold at most {cap - window + 1}")
            kp = ring_positions(torch.tensor(end - 1), min(end, cap), cap)
            qp = torch.arange(ch.start, end)[:, None]
            masks[key] = (kp >= 0) & (kp <= qp) & (kp > qp - window)
        return masks[key]

    @torch.inference_mode()
    def forward(self, s: StepInput, kv: KVCache) -> torch.Tensor:
        """Returns fp32 logits [len(logit_rows), vocab]."""
        n = s.tokens.shape[0]
        H, KV, D = self.n_heads, self.n_kv, self.hd
        heads, eps = H + 2 * KV, self.eps
        tables = [self._rope_tables(s.positions, cos, sin) for cos, sin in self.rope_tables]
        nd = s.n_decode
        cast = self.att_dtype != self.dtype
        masks: dict = {}  # this step's sliding-window masks, built by the first layer needing each
        ops = self.ops
        x = F.embedding(s.tokens, self.embed)
        if self.embed_mul is not None:
            x = x * self.embed_mul
        pending = None  # the FFN output the next norm adds to the residual first (add_norm)
        for li, L in enumerate(self.layers):
            if pending is None:
                h = ops.norm(x, L.attn_norm, eps)
            else:
                x, h = ops.add_norm(x, pending, L.attn_norm, eps)
            qkv = L.qkv(h)
            if L.qkv_bias is not None:
                qkv = qkv + L.qkv_bias
            qkv = qkv.view(n, heads, D)
            if L.qk_norm is not None:
                qkv = torch.cat([ops.head_norm(qkv[:, : H + KV], L.qk_norm, eps, H), qkv[:, H + KV :]], dim=1)
            cos, sin = tables[L.rope]
            qkv = ops.rope(qkv, cos, sin, s.positions, H + KV, L.rope)
            if cast:
                qkv = qkv.to(self.att_dtype)
            kv.write(li, s.slots, s.positions, qkv[:, H:].view(n, 2, KV, D))
            outs = []
            if nd:
                outs.append(self._decode_attention(qkv[:nd, :H], kv, li, s, L.window, masks))
            for ch in s.prefills:
                outs.append(self._prefill_attention(qkv[ch.row : ch.row + ch.n, :H], kv, li, ch, L.window, masks))
            attn = outs[0] if len(outs) == 1 else torch.cat(outs)
            if cast:
                attn = attn.to(self.dtype)
            a = L.o(attn)
            if L.post_attn_norm is not None:
                a = ops.norm(a, L.post_attn_norm, eps)
            x, h = ops.add_norm(x, a, L.ffn_norm, eps)
            y = L.down(ops.act(L.gate_up(h), self.activation))
            if L.post_ffn_norm is not None:
                y = ops.norm(y, L.post_ffn_norm, eps)
            pending = y
        if s.logit_rows is not None:
            if s.logit_rows.numel() == 0:
                return torch.empty(0, self.hp.vocab_size)
            x = x[s.logit_rows]
            pending = None if pending is None else pending[s.logit_rows]
        x = ops.norm(x, self.norm, eps) if pending is None else ops.add_norm(x, pending, self.norm, eps)[1]
        return self.lm_head(x).float()


class TorchOps:
    """The engine's own code for the non-linear ops (``native_ops.ElementOps`` runs it where no
    kernel is named, and where a named one was dropped)."""

    @staticmethod
    def norm(x: torch.Tensor, w2: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, w2, eps)

    @staticmethod
    def head_norm(x: torch.Tensor, w: torch.Tensor, eps: float, n_q: int) -> torch.Tensor:
        return head_rms_norm(x, eps) * w

    @staticmethod
    def add_norm(x: torch.Tensor, r: torch.Tensor, w2: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + r
        return h, rms_norm(h, w2, eps)

    @staticmethod
    def rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, n_rot: int,
             rope_set: int) -> torch.Tensor:
        """cos and signed sin [tokens, heads, D] cover every head (1 and 0 past ``n_rot``: v is
        carried along, so one pass ropes q and k)."""
        half = qkv.shape[-1] // 2
        rot = torch.cat([qkv[..., half:], qkv[..., :half]], dim=-1)  # cheaper than roll
        return torch.addcmul(qkv * cos, rot, sin)

    @staticmethod
    def act(gu: torch.Tensor, fn) -> torch.Tensor:
        f = gu.shape[-1] // 2
        return fn(gu[:, :f]) * gu[:, f:]


def rms_norm(x: torch.Tensor, w2: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with weight w, given w2 = [w, 0].

    layer_norm over [x, -x] has mean 0 and variance mean(x^2), so it is exactly RMSNorm, in
    one fused kernel with fp32 accumulation; torch's rms_norm runs as ~8 separate ops for bf16.
    """
    d = x.shape[-1]
    return F.layer_norm(torch.cat([x, -x], dim=-1), (2 * d,), w2, None, eps)[:, :d].contiguous()


def head_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without weight over the last dimension of [..., D] (per head; see rms_norm)."""
    d = x.shape[-1]
    return F.layer_norm(torch.cat([x, -x], dim=-1), (2 * d,), None, None, eps)[..., :d]
