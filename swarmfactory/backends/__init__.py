"""Backends by name: an in-tree map plus the ``swarmfactory.backends`` entry-point group.

Modules are imported only when a backend is asked for, so an optional dependency (Triton, CUDA)
loads only when used. A backend is its static check, its build, the runner of what it built and
its language (base.py); the harness and the agents take all of that from here.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from pathlib import PurePath

from swarmfactory.backends.base import Artifact, Backend, BuildError, CheatError, Language, MissingTool

_IN_TREE = {"c": "swarmfactory.backends.c:CBackend", "triton": "swarmfactory.backends.triton:TritonBackend",
            "cuda": "swarmfactory.backends.cuda:CUDABackend", "ptx": "swarmfactory.backends.ptx:PTXBackend"}
_INSTANCES: dict[str, Backend] = {}

__all__ = ["Artifact", "Backend", "BuildError", "CheatError", "Language", "MissingTool", "get_backend",
           "backend_names", "source_backend"]


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


def source_backend(problem, filename: str, backend: str | None = None) -> str:
    """The backend the source file ``filename`` is written in, one of ``problem.backends``:
    ``backend`` where given (unless the file's extension is another backend's), else the one
    whose extensions the name ends with. ValueError, one line for the user, where the file
    cannot be a kernel of ``problem``."""
    takes = {b: get_backend(b).extensions for b in problem.backends}
    suffix = PurePath(filename).suffix.lower()
    if backend is None:
        found = next((b for b in problem.backends if suffix in takes[b]), None)
        if found is None:
            exts = [e for b in problem.backends for e in takes[b]]
            listed = ", ".join(exts[:-1]) + " or " + exts[-1] if len(exts) > 1 else "".join(exts)
            what = f"a {suffix} file" if suffix else "a file without an extension"
            raise ValueError(f"{filename}: {what} is not a kernel for {problem.name} (it takes {listed})")
        return found
    if backend not in takes:
        known = backend_names()
        why = (f"{problem.name} takes " + ", ".join(f"{b} ({' '.join(takes[b])})" for b in problem.backends)
               if backend in known else f"unknown backend; known: {', '.join(known)}")
        raise ValueError(f"--backend {backend}: {why}")
    other = next((b for b in backend_names() if b != backend and suffix and suffix in _extensions(b)), None)
    if other is not None:
        raise ValueError(f"{filename}: --backend {backend}, but a {suffix} file is a {other} kernel: rename it "
                         f"({' or '.join(takes[backend])}) or drop --backend")
    return backend


def _extensions(name: str) -> tuple[str, ...]:
    try:
        return get_backend(name).extensions
    except Exception:  # a plug-in that does not load claims no extension
        return ()
