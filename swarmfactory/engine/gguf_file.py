"""The GGUF container, read directly: metadata as Python values, tensors as memory-mapped arrays.

gguf-py's ``GGUFReader`` builds a numpy view per array element, which for a 262k-token
vocabulary (Gemma 3) costs ~20 s before the first weight is read; this reader decodes the same
file in well under a second. Layout (GGUF v2/v3, little-endian): magic ``GGUF``, version,
tensor count, metadata count; the metadata (key, value type, value); the tensor infos (name,
dims, type, offset); then, aligned to ``general.alignment`` (32), the tensor data.

A tensor's array is what ``GGUFReader`` gives for it, so the loader and ``quants.dequantize``
read either: float32/float16/integer types as their numpy dtype in shape [rows, cols], every
other type (block-quantised, BF16) as uint8 [rows, bytes per row].
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# value type -> struct format (scalars); 8 is a string, 9 an array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
          12: "<f8"}
_STRING, _ARRAY = 8, 9
# tensor types stored as plain numbers (the rest are read as bytes)
_PLAIN = {QT.F32: np.float32, QT.F16: np.float16, QT.F64: np.float64, QT.I8: np.int8, QT.I16: np.int16,
          QT.I32: np.int32, QT.I64: np.int64}


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands (one line, naming the file)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: [cols, rows, ...]
    qtype: QT
    data: np.ndarray  # memory-mapped: see the module docstring


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, object]
    tensors: list[TensorInfo]


class _Cursor:
    def __init__(self, buf, name: str):
        self.buf, self.pos, self.name = buf, 0, name

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise GGUFError(f"{self.name}: truncated GGUF file (needs {end} bytes, has {len(self.buf)})")
        view = memoryview(self.buf)[self.pos:end]
        self.pos = end
        return view

    def scalar(self, fmt: str):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        return bytes(self.take(n)).decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if etype in _NUMPY:
                dt = np.dtype(_NUMPY[etype])
                arr = np.frombuffer(self.take(count * dt.itemsize), dtype=dt)
                return arr.astype(bool).tolist() if etype == 7 else arr.tolist()
            if etype == _STRING:
                return self._strings(count)
            return [self.value(etype) for _ in range(count)]
        raise GGUFError(f"{self.name}: unknown GGUF value type {vtype}")

    def _strings(self, count: int) -> list[str]:
        """``count`` strings (a vocabulary): one pass over the bytes, no per-item views."""
        buf, pos, out = self.buf, self.pos, []
        unpack = struct.Struct("<Q").unpack_from
        try:
            for _ in range(count):
                (n,) = unpack(buf, pos)
                pos += 8
                out.append(buf[pos:pos + n].decode("utf-8", errors="replace"))
                pos += n
        except struct.error:
            raise GGUFError(f"{self.name}: truncated GGUF file (in a string array)") from None
        if pos > len(buf):
            raise GGUFError(f"{self.name}: truncated GGUF file (in a string array)")
        self.pos = pos
        return out


def read(path: str | Path) -> GGUFFile:
    """Metadata and tensor infos of a GGUF file; tensor data stays memory-mapped (read-only)."""
    path = Path(path)
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise GGUFError(f"{path.name}: not a GGUF file (empty)") from None
    if buf[:4] != MAGIC:
        raise GGUFError(f"{path.name}: not a GGUF file (no GGUF magic at its start)")
    c = _Cursor(buf, path.name)
    c.take(4)
    version = c.scalar("<I")
    if version not in (2, 3):
        raise GGUFError(f"{path.name}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = c.scalar("<Q"), c.scalar("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = c.string()
        metadata[key] = c.value(c.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = tuple(c.scalar("<Q") for _ in range(c.scalar("<I")))
        infos.append((name, dims, c.scalar("<I"), c.scalar("<Q")))
    align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-c.pos // align) * align
    data = np.frombuffer(buf, dtype=np.uint8)
    tensors = []
    for name, dims, tcode, offset in infos:
        try:
            qtype = QT(tcode)
        except ValueError:
            raise GGUFError(f"{path.name}: tensor {name} has unknown GGUF type {tcode}") from None
        rows_shape = tuple(reversed(dims))  # numpy order: [..., rows, cols]
        n = int(np.prod(dims)) if dims else 1
        if qtype in _PLAIN:
            dt = np.dtype(_PLAIN[qtype]).newbyteorder("<")
            nbytes, shape = n * dt.itemsize, rows_shape
        else:
            block, size = GGML_QUANT_SIZES[qtype]
            if dims[0] % block:
                raise GGUFError(f"{path.name}: tensor {name} ({qtype.name}) has {dims[0]} columns, "
                                f"not a multiple of its block of {block}")
            dt, nbytes = np.dtype(np.uint8), n // block * size
            shape = (*rows_shape[:-1], dims[0] // block * size)
        lo = start + offset
        if lo + nbytes > len(buf):
            raise GGUFError(f"{path.name}: truncated GGUF file (tensor {name} ends past the end of the file)")
        tensors.append(TensorInfo(name, dims, qtype, data[lo:lo + nbytes].view(dt).reshape(shape)))
    return GGUFFile(path, version, metadata, tensors)
