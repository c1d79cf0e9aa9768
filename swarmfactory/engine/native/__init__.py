"""The native decoder: a whole engine step of a Q4_1/Q8_0 model in one C call.

``decode.c`` holds the kernel (see its header for the numerics); ``isa.py`` its ISA paths
(explicit compiler flags per path, never -march=native, so a path is the same code on every
host); ``library.py`` builds a path with the C backend, checks it against a reference on a tiny
matrix and packs the GGUF blocks into its layout. ``NativeDecoder`` (here) calls it for steps
of up to ``EngineConfig.native_decode`` decode sequences plus ``native_prefill`` prompt tokens.
Other steps stay on torch; both paths share the KV cache. ``matvec.py`` compiles a kernel
factory candidate of ``q4_1_packed_matvec`` in for the decoder's Q4_1 matrices
(``EngineConfig.native_matvec``), audited while it serves (decode.c's ``Ext``, ``engine/audit.py``).
"""

from __future__ import annotations

import ctypes

import torch

from ..gguf_loader import GGUFModel
from ..kernels import Weight
from ..kv_cache import KVCache
from swarmfactory.layouts import ROWS
from .isa import BASE_FLAGS, PATHS, IsaPath, path_named, runnable_paths
from .library import (_TYPES, PROBE_TOLERANCE, SYMBOL, NativeUnavailable, _Mat, linear, linear_error, load_checked,
                      load_library, pack, probe, random_tensor, reference_linear, source)

__all__ = ["BASE_FLAGS", "PATHS", "PROBE_TOLERANCE", "ROWS", "SYMBOL", "IsaPath", "NativeDecoder", "NativeUnavailable", "build_decoder",
           "linear", "linear_error", "load_checked", "load_library", "pack", "path_named", "probe", "random_tensor",
           "reference_linear", "runnable_paths", "source", "unsupported"]


def unsupported(gg: GGUFModel, native_architecture: bool) -> str | None:
    """Why decode.c cannot compute this model's step (None: it can). ``native_architecture``:
    the architecture's decoder says decode.c computes its step (``Decoder.native_decoder``).
    decode.c is the plain llama step: no biases, no RoPE scaling, head size = hidden / heads,
    every linear weight Q4_1 or Q8_0 (one type per fused weight)."""
    hp = gg.hparams
    if not native_architecture:
        return f"it computes llama models only, this is {hp.architecture}"
    if hp.rope_scaling_factor != 1.0 or "rope_freqs.weight" in gg.tensors:
        return "it has no RoPE scaling, which this model uses"
    if hp.head_dim * hp.n_heads != hp.dim:
        return f"it needs head size = hidden / heads ({hp.dim} / {hp.n_heads}), this model's is {hp.head_dim}"
    if any(n.endswith(".bias") for n in gg.tensors):
        return "it has no biases, which this model has"
    groups = [("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",)]
    names = [[f"blk.{i}.{t}.weight" for t in g] for i in range(hp.n_layers) for g in groups]
    names.append(["token_embd.weight" if hp.tied_embeddings else "output.weight"])
    for group in names:
        types = {gg.tensor(n).qtype for n in group}
        if len(types) != 1 or not types <= set(_TYPES):
            got = "+".join(gg.tensor(n).qtype.name for n in group)
            return f"it needs Q4_1 or Q8_0 weights; {'+'.join(group)} is {got}"
    return None


def build_decoder(lib, gg: GGUFModel, model, kv: KVCache, max_batch: int, threads: int, max_prompt: int = 0):
    """The native step ``lib`` stands for (``paths.plan``): decode.c's ``NativeDecoder``, or the
    block step's ``BlockDecoder`` for a ``qstep.BlockLibrary`` (which also reads ``model``, the
    engine's torch decoder of the same file)."""
    from .qstep import BlockDecoder, BlockLibrary

    if isinstance(lib, BlockLibrary):
        return BlockDecoder(gg, model, kv, max_batch, threads, lib, max_prompt=max_prompt)
    return NativeDecoder(gg, kv, max_batch, threads, lib, max_prompt=max_prompt)


class NativeDecoder:
    """Engine steps of up to ``max_batch`` decode sequences plus ``max_prompt`` prompt tokens,
    for one model and one KV cache.

    ``__call__(tokens, slots, positions, out_rows)`` runs one row per token (a decode token or a
    prompt token, see decode.c), writes every row's K/V to the cache and returns fp32 logits
    [len(out_rows), vocab] for the rows asked (all rows when ``out_rows`` is None). ``lib`` is a
    library from ``load_checked``/``load_library``, or a ``matvec.External`` (with a factory
    kernel); None picks the best checked path. Not thread-safe (one step at a time, like the
    engine).
    """

    def __init__(self, gg: GGUFModel, kv: KVCache, max_batch: int, threads: int, lib=None,
                 max_prompt: int = 0):
        hp = gg.hparams
        if any(t.dtype != torch.float32 for t in kv.kv):
            raise NativeUnavailable("native decoder needs an fp32 KV cache (kv_dtype: fp32)")
        self.hp, self.max_batch, self.max_prompt = hp, max_batch, max_prompt
        self.max_rows = max_batch + max_prompt
        self.fallbacks: list[str] = []
        if lib is None:  # first: a machine without a compiler fails fast
            lib, _, self.fallbacks = load_checked()
        self.lib = lib
        self._ext = getattr(lib, "ext", None) if not isinstance(lib, ctypes.CDLL) else None
        self.isa = self.lib.sf_isa().decode()
        self._keep: list = []
        mats = []

        def add(*names: str) -> None:
            mat, keep = pack(Weight([gg.tensor(n) for n in names]))
            mats.append(mat)
            self._keep.append(keep)

        norms = []
        for i in range(hp.n_layers):
            p = f"blk.{i}."
            add(p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight")
            add(p + "attn_output.weight")
            add(p + "ffn_gate.weight", p + "ffn_up.weight")
            add(p + "ffn_down.weight")
            norms += [p + "attn_norm.weight", p + "ffn_norm.weight"]
        norms.append("output_norm.weight")
        add("token_embd.weight" if hp.tied_embeddings else "output.weight")
        self._embed = gg.tensor("token_embd.weight")
        if mats[-1].rows != hp.vocab_size:
            raise NativeUnavailable(f"output head has {mats[-1].rows} rows for a vocabulary of {hp.vocab_size}")

        norm_t = [gg.tensor(n).dequantize().reshape(-1).float().contiguous() for n in norms]
        self._keep.append(norm_t)
        inv = 1.0 / (hp.rope_theta ** (torch.arange(0, hp.head_dim, 2).float() / hp.head_dim))
        self._inv_freq = inv.contiguous()
        self._mats = (_Mat * len(mats))(*mats)
        self._norms = (ctypes.c_void_p * len(norm_t))(*[t.data_ptr() for t in norm_t])
        self._kv_ptrs = (ctypes.c_void_p * len(kv.kv))(*[t.data_ptr() for t in kv.kv])
        self._kv = kv  # the pointers above stay valid while the cache lives
        self.threads = threads
        self._model = self.lib.sf_model_new(
            hp.n_layers, hp.dim, hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.ffn_dim, hp.vocab_size,
            hp.norm_eps, self.max_rows, kv.slots, kv.max_seq_len, ctypes.addressof(self._mats),
            ctypes.addressof(self._norms), ctypes.addressof(self._kv_ptrs), self._inv_freq.data_ptr(),
            threads, ctypes.byref(self._ext) if self._ext is not None else None)
        if not self._model:
            raise NativeUnavailable("native decoder does not support this model's dimensions")

    @torch.inference_mode()
    def __call__(self, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                 out_rows: torch.Tensor | None = None) -> torch.Tensor:
        B = tokens.shape[0]
        x = self._embed.take(tokens.numpy()).dequantize().contiguous()
        slots = slots.to(torch.int64).contiguous()
        positions = positions.to(torch.int64).contiguous()
        out_rows = torch.arange(B) if out_rows is None else out_rows.to(torch.int64).contiguous()
        logits = torch.empty(out_rows.shape[0], self.hp.vocab_size, dtype=torch.float32)
        rc = self.lib.sf_decode(self._model, B, x.data_ptr(), slots.data_ptr(), positions.data_ptr(),
                                out_rows.shape[0], out_rows.data_ptr(), logits.data_ptr())
        if rc == 1:  # the factory kernel failed its audit: this step was run again without it
            self.lib.dropped()
        elif rc != 0:
            raise ValueError(f"native step rejected its rows (rows {B} of at most {self.max_rows}, "
                             f"slots {slots.tolist()[:8]}, positions {positions.tolist()[:8]})")
        return logits

    def __del__(self):
        model, lib = getattr(self, "_model", None), getattr(self, "lib", None)
        if model and lib is not None:
            lib.sf_model_free(model)
            self._model = None
