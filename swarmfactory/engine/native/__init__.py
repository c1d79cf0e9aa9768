"""The native decoder: a whole decode step of a Q4_1/Q8_0 model in one C call.

``decode.c`` (beside this file) holds the kernel (see its header for the numerics). This module packs the
GGUF blocks into its layout once, builds it with the C backend (gcc, -O3 -march=native,
cached per source, flags, compiler and CPU), and calls it for decode-only steps of up to
``EngineConfig.native_decode`` sequences. Prompt chunks and larger batches stay on torch;
both paths share the KV cache.
"""

from __future__ import annotations

import ctypes
from importlib.resources import files

import torch
from gguf import GGMLQuantizationType as QT

from ..gguf_loader import GGUFModel
from ..kernels import Weight
from ..kv_cache import KVCache

SYMBOL = "sf_decode"
_TYPES = {QT.Q4_1: 0, QT.Q8_0: 1}


class NativeUnavailable(RuntimeError):
    """The native decoder cannot run this model or machine; the message says why."""


class _Mat(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int64), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
                ("data", ctypes.c_void_p)]


def source() -> str:
    return files(__name__).joinpath("decode.c").read_text()


def load_library(flags: tuple[str, ...] | None = None):
    """Build (or reuse) decode.c for this machine and load it with ctypes."""
    from swarmfactory.backends.base import BuildError
    from swarmfactory.backends.c import DEFAULT_FLAGS, CBackend

    try:
        art = CBackend().build(source(), SYMBOL, tuple(flags or DEFAULT_FLAGS))
    except BuildError as e:
        raise NativeUnavailable(f"native decoder did not build: {e}") from None
    lib = ctypes.CDLL(art.path, mode=ctypes.RTLD_LOCAL)
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.sf_model_new.restype = p
    lib.sf_model_new.argtypes = [i64] * 7 + [ctypes.c_float] + [i64] * 3 + [p, p, p, p, ctypes.c_int]
    lib.sf_decode.restype = ctypes.c_int
    lib.sf_decode.argtypes = [p, i64, p, p, p, p]
    lib.sf_model_free.restype = None
    lib.sf_model_free.argtypes = [p]
    lib.sf_isa.restype = ctypes.c_char_p
    lib.sf_linear.restype = ctypes.c_int
    lib.sf_linear.argtypes = [p, i64, p, p, ctypes.c_int]
    return lib


def linear(lib, weight: Weight, x: torch.Tensor, threads: int = 1) -> torch.Tensor:
    """x [B, K] fp32 @ weight.T with the decoder's numerics (int8 activations): for tests and
    for checking a machine's build against a reference."""
    mat, keep = pack(weight)
    x = x.float().contiguous()
    y = torch.empty(x.shape[0], weight.rows, dtype=torch.float32)
    if lib.sf_linear(ctypes.byref(mat), x.shape[0], x.data_ptr(), y.data_ptr(), threads) != 0:
        raise ValueError("sf_linear rejected its arguments")
    return y


ROWS = 8  # rows per group in decode.c's layout


def pack(weight: Weight) -> tuple[_Mat, torch.Tensor]:
    """The weight in decode.c's layout (see its Mat comment): groups of 8 rows interleaved by
    quads of 4 elements, one record per block of 32 columns with the rows' fp16 scales after
    the quants (Q4_1: 128 + 16 + 16 bytes; Q8_0, w + 128 stored unsigned: 256 + 16 bytes)."""
    qt = weight.qtype
    if qt not in _TYPES:
        got = ", ".join(sorted(q.name for q in weight.qtypes))
        raise NativeUnavailable(f"native decoder needs Q4_1 or Q8_0 weights; {weight.name} is {got}")
    if weight.cols % 32:
        raise NativeUnavailable(f"{weight.name}: {weight.cols} columns is not a multiple of 32")
    nb, groups = weight.cols // 32, -(-weight.rows // ROWS)
    b = weight.blocks().view(weight.rows, nb, -1)
    if groups * ROWS != weight.rows:  # zero rows (d = m = 0) fill the last group
        b = torch.cat([b, b.new_zeros(groups * ROWS - weight.rows, nb, b.shape[-1])])
    b = b.view(groups, ROWS, nb, -1).transpose(1, 2)  # [groups, nb, rows, block bytes]

    def interleave(q: torch.Tensor) -> torch.Tensor:  # [g, nb, rows, 4k] -> [g, nb, k, rows, 4]
        return q.reshape(groups, nb, ROWS, -1, 4).transpose(2, 3).reshape(groups, nb, -1)

    d = b[..., 0:2].reshape(groups, nb, 2 * ROWS)
    if qt == QT.Q4_1:
        rec = torch.cat([interleave(b[..., 4:20]), d, b[..., 2:4].reshape(groups, nb, 2 * ROWS)], -1)
    else:
        q = b[..., 2:34].contiguous().view(torch.int8).to(torch.int16).add(128).to(torch.uint8)
        rec = torch.cat([interleave(q), d], -1)
    rec = rec.contiguous()
    return _Mat(_TYPES[qt], weight.rows, weight.cols, rec.data_ptr()), rec


class NativeDecoder:
    """Decode steps of up to ``max_batch`` sequences for one model and one KV cache.

    ``__call__(tokens, slots, positions)`` appends each sequence's token to the cache and returns
    fp32 logits [B, vocab]. Not thread-safe (one step at a time, like the engine).
    """

    def __init__(self, gg: GGUFModel, kv: KVCache, max_batch: int, threads: int,
                 flags: tuple[str, ...] | None = None):
        hp = gg.hparams
        if any(t.dtype != torch.float32 for t in kv.kv):
            raise NativeUnavailable("native decoder needs an fp32 KV cache (kv_dtype: fp32)")
        self.hp, self.max_batch = hp, max_batch
        self.lib = load_library(flags)  # first: a machine without a compiler fails fast
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
            hp.norm_eps, max_batch, kv.slots, kv.max_seq_len, ctypes.addressof(self._mats),
            ctypes.addressof(self._norms), ctypes.addressof(self._kv_ptrs), self._inv_freq.data_ptr(),
            threads)
        if not self._model:
            raise NativeUnavailable("native decoder does not support this model's dimensions")

    @torch.inference_mode()
    def __call__(self, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        B = tokens.shape[0]
        x = self._embed.take(tokens.numpy()).dequantize().contiguous()
        slots = slots.to(torch.int64).contiguous()
        positions = positions.to(torch.int64).contiguous()
        logits = torch.empty(B, self.hp.vocab_size, dtype=torch.float32)
        rc = self.lib.sf_decode(self._model, B, x.data_ptr(), slots.data_ptr(), positions.data_ptr(),
                                logits.data_ptr())
        if rc != 0:
            raise ValueError(f"native decode rejected the step (batch {B}, slots {slots.tolist()}, "
                             f"positions {positions.tolist()})")
        return logits

    def __del__(self):
        model, lib = getattr(self, "_model", None), getattr(self, "lib", None)
        if model and lib is not None:
            lib.sf_model_free(model)
            self._model = None
