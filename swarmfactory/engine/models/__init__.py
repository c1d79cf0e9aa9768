"""One decoder per architecture, on a shared skeleton (``decoder.py``), chosen by the GGUF's
``general.architecture``.

``ARCHITECTURES`` maps that name to the module and class that compute it; adding one is adding
a module that subclasses ``Decoder`` and sets the hooks its model needs (see ``decoder.py``),
and a line here. Modules load when first asked for (the loader checks a file's architecture
here before reading its tensors).
"""

from __future__ import annotations

import importlib

ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "Llama"),
    "qwen2": ("qwen2", "Qwen2"),
    "qwen3": ("qwen3", "Qwen3"),
    "gemma3": ("gemma3", "Gemma3"),
}


def check_architecture(arch, where: str = "") -> None:
    """ValueError, one line, unless the engine computes ``arch``."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"{where}architecture {arch!r} is not supported "
                         f"(supported: {', '.join(ARCHITECTURES)})")


def model_class(arch: str) -> type:
    """The ``Decoder`` subclass for ``arch``."""
    check_architecture(arch)
    module, name = ARCHITECTURES[arch]
    return getattr(importlib.import_module(f".{module}", __name__), name)


def build(gg, cfg, dense_above: dict[str, int] | None = None, classes: dict | None = None):
    """The model for a loaded GGUF (``gguf_loader.load_gguf``) under an ``EngineConfig``."""
    return model_class(gg.hparams.architecture)(gg, cfg, dense_above, classes)
