"""Backends by name: an in-tree map plus the ``swarmfactory.backends`` entry-point group.

Modules are imported only when a backend is asked for, so an optional dependency (Triton, CUDA)
loads only when used.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from swarmfactory.backends.base import Artifact, Backend, BuildError, CheatError

_IN_TREE = {"c": "swarmfactory.backends.c:CBackend", "triton": "swarmfactory.backends.triton:TritonBackend",
            "cuda": "swarmfactory.backends.cuda:CUDABackend", "ptx": "swarmfactory.backends.ptx:PTXBackend"}
_INSTANCES: dict[str, Backend] = {}

__all__ = ["Artifact", "Backend", "BuildError", "CheatError", "get_backend", "backend_names"]


def backend_names() -> list[str]:
    return sorted(set(_IN_TREE) | {ep.name for ep in entry_points(group="swarmfactory.backends")})


def get_backend(name: str) -> Backend:
    if name in _INSTANCES:
        return _INSTANCES[name]
    target = _IN_TREE.get(name)
    if target is None:
        eps = {ep.name: ep for ep in entry_points(group="swarmfactory.backends")}
        if name not in eps:
            raise ValueError(f"unknown backend {name!r}; known: {', '.join(backend_names())}")
        cls = eps[name].load()
    else:
        module, _, attr = target.partition(":")
        cls = getattr(importlib.import_module(module), attr)
    _INSTANCES[name] = cls()
    return _INSTANCES[name]
