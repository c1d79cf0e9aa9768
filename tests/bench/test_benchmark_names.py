"""A benchmark script's folder is first on ``sys.path`` when it runs, so a script named like a
module some library imports shadows it: ``benchmarks/kernels.py`` made transformers (which
imports the optional package ``kernels`` where it finds one) fail to load the HF model in
``engine_vs_peers.py``."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# optional packages our dependencies import when present (transformers: hub kernels, flash attention...)
PROBED = {"kernels", "accelerate", "flash_attn", "bitsandbytes", "optimum", "peft", "safetensors", "tokenizers",
          "sentencepiece", "triton", "numba", "yaml", "jinja2", "gguf", "torch", "numpy", "transformers"}


def test_no_benchmark_script_shadows_a_module_a_library_imports():
    stems = {p.stem for p in BENCHMARKS.glob("*.py")}
    assert stems, "no benchmark scripts found"
    shadows = sorted(stems & (set(sys.stdlib_module_names) | PROBED))
    assert not shadows, f"benchmarks/ scripts named like modules libraries import: {shadows}"
