"""A compact inference engine for decoder-only GGUF checkpoints (Llama, Qwen2, Qwen3, Gemma 3;
see docs/engine.md).

The names below load on first use, so ``swarmfactory.engine_cli`` (and ``swarmfactory engine
--help``) start without importing torch.
"""

from importlib import import_module

__all__ = ["Engine", "EngineConfig", "SamplingParams", "Completion", "RequestError"]

_WHERE = {"Engine": ".engine", "Completion": ".engine", "RequestError": ".engine",
          "EngineConfig": ".config", "SamplingParams": ".sequence"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
