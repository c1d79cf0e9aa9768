"""The block step: a whole engine step on GGUF block weights in one C call (``qstep.c``).

Where decode.c computes the plain llama step on its own packed Q4_1/Q8_0 layout, the block step
computes what the architecture hooks of ``models/decoder.py`` describe (llama with RoPE scaling,
qwen2's biases, qwen3's q/k norms, gemma3's windows, two RoPE sets, sandwich norms, GELU and
embedding scale) on every block type ``qnative`` runs, with qnative's numerics: it is built into
the same library as qlinear.c (``qlinear.source``), on the ISA path that passed qnative's probe.
``BlockDecoder`` has ``NativeDecoder``'s interface, so the engine, its model runner and the
calibration (which measures where it beats torch) use either.
"""

from __future__ import annotations

import ctypes

import torch

from ..gguf_loader import GGUFModel
from ..kernels import Weight
from ..kv_cache import KVCache
from .library import NativeUnavailable
from .qlinear import K_QUANTS, QTYPES, Loaded, Packed, QNative, loaded

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}
OPS = (("qkv", ("attn_q", "attn_k", "attn_v")), ("o", ("attn_output",)), ("gate_up", ("ffn_gate", "ffn_up")),
       ("down", ("ffn_down",)))


class _QMat(ctypes.Structure):
    _fields_ = [("parts", ctypes.c_void_p), ("n_parts", ctypes.c_int64), ("rows", ctypes.c_int64),
                ("cols", ctypes.c_int64), ("bias", ctypes.c_void_p)]


class _QLayer(ctypes.Structure):
    _fields_ = [("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p), ("post_attn_norm", ctypes.c_void_p),
                ("post_ffn_norm", ctypes.c_void_p), ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                ("window", ctypes.c_int64), ("capacity", ctypes.c_int64), ("rope", ctypes.c_int64),
                ("kv", ctypes.c_void_p)]


def linear_names(gg: GGUFModel) -> list[tuple[str, list[str]]]:
    """(op, tensor names) of every linear weight the step reads, the head last."""
    hp = gg.hparams
    out = [(op, [f"blk.{i}.{t}.weight" for t in names]) for i in range(hp.n_layers) for op, names in OPS]
    out.append(("lm_head", ["token_embd.weight" if hp.tied_embeddings else "output.weight"]))
    return out


def unsupported(gg: GGUFModel, model_cls) -> str | None:
    """Why the block step cannot compute this model's step (None: it can): an architecture whose
    decoder computes more than the skeleton's hooks, a weight of a type qnative does not run, or
    a size its blocks do not divide."""
    hp = gg.hparams
    if not getattr(model_cls, "block_step", False):
        return f"it computes the shared decoder's hooks, and {hp.architecture}'s decoder does more"
    if hp.head_dim % 2:
        return f"it needs an even head size, this model's is {hp.head_dim}"
    for name in gg.tensors:
        if name.endswith(".bias") and not any(name.endswith(f"attn_{x}.bias") for x in "qkv"):
            return f"it adds q, k and v biases only; this model has {name}"
    for _, names in linear_names(gg):
        for n in names:
            t = gg.tensor(n)
            if t.qtype not in QTYPES:
                return f"it runs {', '.join(sorted(q.name for q in QTYPES))} weights; {n} is {t.qtype.name}"
            if t.cols % (256 if t.qtype in K_QUANTS else 32):
                return f"{n}: {t.cols} columns is not a multiple of {t.qtype.name}'s block"
    return None


class BlockLibrary:
    """What ``paths.plan`` hands the engine when the block step computes the model: the checked
    qlinear library and the model's torch decoder (whose hooks and packed weights it reuses)."""

    def __init__(self, loaded_lib: Loaded):
        self.lib, self.isa = loaded_lib.lib, loaded_lib.isa
        self.qexts = None  # the factory's kernels for block types (native/qext.py), set by paths.plan


class BlockDecoder:
    """Engine steps of up to ``max_batch`` decode rows plus ``max_prompt`` prompt tokens through
    ``qstep.c``: the interface of ``NativeDecoder``. ``model`` is the engine's torch decoder of
    the same file: its layer windows, RoPE sets, attention scale, activation and embedding scale
    are used, and so are its ``qnative`` weights (the same blocks, not a second copy)."""

    def __init__(self, gg: GGUFModel, model, kv: KVCache, max_batch: int, threads: int,
                 lib: BlockLibrary | None = None, max_prompt: int = 0):
        hp = gg.hparams
        if any(t.dtype != torch.float32 for t in kv.kv):
            raise NativeUnavailable("the block step needs an fp32 KV cache (kv_dtype: fp32)")
        why = unsupported(gg, type(model))
        if why:
            raise NativeUnavailable(f"the block step cannot run this model: {why}")
        if lib is None:
            got = loaded()
            if got.lib is None:
                raise NativeUnavailable(got.reason)
            lib = BlockLibrary(got)
        self.hp, self.max_batch, self.max_prompt = hp, max_batch, max_prompt
        self.max_rows = max_batch + max_prompt
        self.fallbacks: list[str] = []
        self.lib, self.isa = lib.lib, f"blocks-{lib.isa}"
        self.qexts = lib.qexts
        self._keep: list = []

        def vec(name: str | None, size: int = hp.dim):
            """The fp32 vector's address, checked to hold ``size`` values (the C step reads that
            many: a file that says otherwise is refused here, never read past)."""
            if name is None or name not in gg.tensors:
                return None
            t = gg.tensor(name).dequantize().reshape(-1).float().contiguous()
            if t.numel() != size:
                raise NativeUnavailable(f"{name} holds {t.numel()} values where the model's sizes need {size}")
            self._keep.append(t)
            return t.data_ptr()

        kernels = {}
        for i, L in enumerate(model.layers):
            for op, _ in OPS:
                kernels[(i, op)] = getattr(L, op).kernel
        kernels[("head", "lm_head")] = model.lm_head.kernel
        mats = []
        for idx, (op, names) in enumerate(linear_names(gg)):
            key = ("head", op) if op == "lm_head" else (idx // 4, op)
            k = kernels.get(key)
            packed = k.packed if isinstance(k, QNative) else Packed(Weight([gg.tensor(n) for n in names]))
            packed.use(self.lib)
            if lib.qexts is not None:
                lib.qexts.attach(packed)
            self._keep.append(packed)
            bias = None
            if op == "qkv":
                p = names[0].rsplit(".", 2)[0]  # blk.N
                if any(f"{p}.attn_{x}.bias" in gg.tensors for x in "qkv"):
                    H, KV, D = hp.n_heads, hp.n_kv_heads, hp.head_dim
                    b = torch.cat([gg.tensor(f"{p}.attn_{x}.bias").dequantize().reshape(-1).float()
                                   if f"{p}.attn_{x}.bias" in gg.tensors else torch.zeros(n)
                                   for x, n in zip("qkv", (H * D, KV * D, KV * D))]).contiguous()
                    if b.numel() != packed.rows:
                        raise NativeUnavailable(f"{p}: q, k and v biases hold {b.numel()} values for "
                                                f"{packed.rows} outputs")
                    self._keep.append(b)
                    bias = b.data_ptr()
            mats.append(_QMat(ctypes.addressof(packed.parts), packed.n_parts, packed.rows, packed.cols, bias))
        if mats[-1].rows != hp.vocab_size:
            raise NativeUnavailable(f"output head has {mats[-1].rows} rows for a vocabulary of {hp.vocab_size}")
        layers = []
        for i, L in enumerate(model.layers):
            p = f"blk.{i}."
            qk = model.qk_norm
            layers.append(_QLayer(vec(p + "attn_norm.weight"), vec(p + "ffn_norm.weight"),
                                  vec(p + "post_attention_norm.weight") if model.sandwich_norms else None,
                                  vec(p + "post_ffw_norm.weight") if model.sandwich_norms else None,
                                  vec(p + "attn_q_norm.weight", hp.head_dim) if qk else None,
                                  vec(p + "attn_k_norm.weight", hp.head_dim) if qk else None,
                                  L.window or 0, kv.capacities[i], L.rope, kv.kv[i].data_ptr()))
        n_pos = max(kv.max_seq_len, 1)
        tables = [r.tables(hp.head_dim, n_pos, torch.float32) for r in model.rope_sets(gg)]
        cos = torch.stack([c for c, _ in tables]).contiguous()
        sin = torch.stack([s for _, s in tables]).contiguous()
        self._keep += [cos, sin]
        self._mats = (_QMat * len(mats))(*mats)
        self._layers = (_QLayer * len(layers))(*layers)
        self._kv = kv  # the cache's tensors outlive the model
        self._embed = gg.tensor("token_embd.weight")
        mul = model.embed_scale()
        self._embed_mul = None if mul is None else float(torch.tensor(mul, dtype=torch.float32))
        self.threads = threads
        self._model = self.lib.sf_qstep_new(
            hp.n_layers, hp.dim, hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.ffn_dim, hp.vocab_size, hp.norm_eps,
            model.scale, ACTIVATIONS[model.activation_name], self.max_rows, kv.slots, kv.max_seq_len, n_pos,
            ctypes.addressof(self._mats), ctypes.addressof(self._layers), vec("output_norm.weight"),
            cos.data_ptr(), sin.data_ptr(), threads)
        if not self._model:
            raise NativeUnavailable("the block step does not support this model's dimensions")

    @torch.inference_mode()
    def __call__(self, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                 out_rows: torch.Tensor | None = None) -> torch.Tensor:
        B = tokens.shape[0]
        x = self._embed.take(tokens.numpy()).dequantize()
        if self._embed_mul is not None:
            x = x * self._embed_mul
        x = x.contiguous()
        slots = slots.to(torch.int64).contiguous()
        positions = positions.to(torch.int64).contiguous()
        out_rows = torch.arange(B) if out_rows is None else out_rows.to(torch.int64).contiguous()
        logits = torch.empty(out_rows.shape[0], self.hp.vocab_size, dtype=torch.float32)
        rc = self.lib.sf_qstep(self._model, B, x.data_ptr(), slots.data_ptr(), positions.data_ptr(),
                               out_rows.shape[0], out_rows.data_ptr(), logits.data_ptr())
        if rc == 1 and self.qexts is not None:  # a factory kernel failed its audit: the step ran again without it
            self.qexts.poll()
        elif rc != 0:
            raise ValueError(f"block step rejected its rows (rows {B} of at most {self.max_rows}, "
                             f"slots {slots.tolist()[:8]}, positions {positions.tolist()[:8]})")
        return logits

    def __del__(self):
        model, lib = getattr(self, "_model", None), getattr(self, "lib", None)
        if model and lib is not None:
            lib.sf_qstep_free(model)
            self._model = None
