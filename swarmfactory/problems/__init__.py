"""Problem registry: bundled suites by name, user problems by file path or entry point."""

from __future__ import annotations

import importlib
import importlib.util
from importlib.metadata import entry_points
from pathlib import Path

from swarmfactory.problems.spec import Arg, Case, Problem, Roofline, Tolerance, check_problem
from swarmfactory.problems.suites.cpu import BLOCK_NAMES, ENGINE_NAMES
from swarmfactory.problems.suites.cpu import NAMES as CPU_NAMES
from swarmfactory.problems.suites.gpu import NAMES as GPU_NAMES

__all__ = ["Arg", "Case", "Problem", "Roofline", "Tolerance", "load_problem", "list_problems",
           "resolve_problems", "ProblemError"]

_CACHE: dict[str, Problem] = {}


class ProblemError(ValueError):
    """A problem that cannot be found or loaded; the message says what to do."""


def _from_module(module, origin: str) -> Problem:
    problem = getattr(module, "PROBLEM", None)
    if not isinstance(problem, Problem):
        raise ProblemError(f"{origin} defines no PROBLEM = Problem(...)")
    return problem


def _load_file(path: Path) -> Problem:
    if not path.is_file():
        raise ProblemError(f"problem file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"swarmfactory_user_problem_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a user's file: report, don't crash
        raise ProblemError(f"cannot load problem file {path}: {type(exc).__name__}: {exc}") from exc
    if getattr(module, "PROBLEM", None) is None and hasattr(module, "Model"):
        from swarmfactory.problems.kernelbench import from_kernelbench_module

        return from_kernelbench_module(module, path)
    problem = _from_module(module, str(path))
    return _with_source(problem, str(path.resolve()))


def _with_source(problem: Problem, source: str) -> Problem:
    import dataclasses

    return dataclasses.replace(problem, source_path=source)


def load_problem(name_or_path: str) -> Problem:
    """A bundled problem by name, a user's problem by ``.py`` path, or one from an entry point."""
    if name_or_path in _CACHE:
        return _CACHE[name_or_path]
    if name_or_path.endswith(".py") or "/" in name_or_path:
        problem = _load_file(Path(name_or_path))
    elif name_or_path in CPU_NAMES or name_or_path in BLOCK_NAMES or name_or_path in ENGINE_NAMES:
        module = importlib.import_module(f"swarmfactory.problems.suites.cpu.{name_or_path}")
        problem = _with_source(_from_module(module, name_or_path), f"swarmfactory.problems.suites.cpu.{name_or_path}")
    elif name_or_path in GPU_NAMES:
        module = importlib.import_module(f"swarmfactory.problems.suites.gpu.{name_or_path}")
        problem = _with_source(_from_module(module, name_or_path), f"swarmfactory.problems.suites.gpu.{name_or_path}")
    elif _derived_name(name_or_path):
        from swarmfactory.problems.derive import problem_from_spec, registered

        spec = registered(name_or_path)
        if spec is None:
            raise ProblemError(f"unknown problem {name_or_path!r}: no model's derived problems name it; derive "
                               "them first (swarmfactory problems --from-model FILE.gguf)")
        problem = problem_from_spec(spec)
    else:
        eps = {ep.name: ep for ep in entry_points(group="swarmfactory.problems")}
        if name_or_path not in eps:
            known = ", ".join(list(CPU_NAMES) + list(BLOCK_NAMES) + list(ENGINE_NAMES) + list(GPU_NAMES) + sorted(eps))
            raise ProblemError(f"unknown problem {name_or_path!r}; known: {known} (or pass a .py path, or a "
                               "problem derived from a model: FAMILY.MODEL)")
        obj = eps[name_or_path].load()
        problem = obj if isinstance(obj, Problem) else _from_module(obj, name_or_path)
    try:
        check_problem(problem)
    except ValueError as exc:
        raise ProblemError(f"invalid problem {name_or_path!r}: {exc}") from exc
    _CACHE[name_or_path] = problem
    return problem


def _derived_name(name: str) -> bool:
    """Whether ``name`` is FAMILY.MODEL with a bundled family (``problems/derive.py``)."""
    family, dot, model = name.partition(".")
    return bool(dot and model) and family in CPU_NAMES + BLOCK_NAMES + ENGINE_NAMES


def problem_from_source(source: str) -> Problem:
    """The problem a ``Problem.source_path`` names (a ``.py`` file or an importable module, a
    KernelBench file included, or a derived problem's ``derived:`` line): how a worker process
    gets the problem its parent holds."""
    from swarmfactory.problems.derive import SOURCE_PREFIX

    if source.startswith(SOURCE_PREFIX):
        import json

        from swarmfactory.problems.derive import problem_from_spec

        return problem_from_spec(json.loads(source[len(SOURCE_PREFIX):]))
    if source.endswith(".py"):
        return _load_file(Path(source))
    module = importlib.import_module(source)
    if getattr(module, "PROBLEM", None) is None and hasattr(module, "Model"):
        from swarmfactory.problems.kernelbench import from_kernelbench_module

        return from_kernelbench_module(module, source)
    return _with_source(_from_module(module, source), source)


def list_problems(gpu: bool = False) -> list[str]:
    """The CPU suite and entry points; with ``gpu`` the GPU suite too (``all`` stays the CPU
    suite: the GPU problems are named one by one, or as ``gpu``)."""
    names = list(CPU_NAMES) + (list(GPU_NAMES) if gpu else [])
    names += sorted(ep.name for ep in entry_points(group="swarmfactory.problems") if ep.name not in names)
    return names


def resolve_problems(spec: str) -> list[Problem]:
    """``all`` (the CPU suite), ``gpu`` (the GPU suite) or a comma-separated list of names and paths."""
    if spec.strip() == "gpu":
        items = list(GPU_NAMES)
    else:
        items = list_problems() if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise ProblemError("no problems given; use --problems all or a comma-separated list")
    return [load_problem(i) for i in items]
