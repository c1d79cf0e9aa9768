"""A compact Llama-family inference engine for GGUF checkpoints (see docs/engine.md)."""

from .config import EngineConfig
from .engine import Completion, Engine, RequestError
from .sequence import SamplingParams

__all__ = ["Engine", "EngineConfig", "SamplingParams", "Completion", "RequestError"]
