"""The package's layers and the imports between them, read from the source (no import runs).

A *unit* is a subpackage of ``swarmfactory`` (``engine``, ``harness``...) or a module at its top
(``redact``, ``champions``...). ``LAYERS`` lists them from the bottom up: a unit may import its
own modules and units of lower layers only. Imports inside functions count as much as those at
the top of a module: a lazy import hides a layer break from a reader, not from this check.

Used by ``tests/test_layering.py`` (CI) and ``benchmarks/structure.py`` (the figures).
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "swarmfactory"

# From the bottom up. One line a layer; units on one line may not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("redact", "hardware", "outcome", "layouts", "config", "kernelref", "heap"),  # leaves: the standard library and pip only
    ("contention", "lifecycle"),  # processes: what is running, what we started
    ("backends",),  # build a source into something runnable (no store, no problem)
    ("tools",),  # tool versions (the C backend's compiler among them)
    ("llm", "bench"),  # HTTP clients: an OpenAI-compatible endpoint, the serving load generator
    ("engine",),  # the inference engine: receives built kernels, never opens the store
    ("evidence",),  # the store
    ("problems",),  # what a kernel must compute
    ("adversary",),
    ("validation",),
    ("harness",),  # verdicts
    ("knowledge",),  # lessons and the cost model, from the evidence
    ("agents",),  # proposers
    ("swarm",),  # the kernel factory's loop
    ("champions",),  # the corridor: which factory kernel may run here, built, and its wrongs reported
    ("enginefactory",),  # the engine factory
    ("report",),
    ("dashboard",),
    ("ui",),
    ("api",),
    ("optimize",),  # the whole stack for one model: derive, kernels, engine
    ("commandline",),  # what the command lines share: the store option, one error path
    ("tune_cli",),  # engine tune, engine profiles
    ("engine_cli",),  # engine serve, generate, calibrate, bench (mounts tune_cli's commands)
    ("cli",),  # the one command line (mounts engine_cli lazily)
    ("__init__",),  # the package's lazy attributes
]

RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> list[tuple[str, str, int, bool]]:
    """Every import of one of our modules: (importer, imported, line, inside a function)."""
    mods = modules()
    found = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f) if n is not f}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # `from swarmfactory import lifecycle` imports the module, not the package; the
                # package's version string is a constant of the root, not a reach up to its facade
                names = [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names
                         if not (target == "swarmfactory" and a.name == "__version__")]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for t in dict.fromkeys(names):
                if t in mods and t != name:
                    found.append((name, t, node.lineno, id(node) in inner))
    return found


def unit_graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = collections.defaultdict(set)
    for a, b, _, _ in imports():
        if unit(a) != unit(b):
            g[unit(a)].add(unit(b))
    return g


def upward() -> list[str]:
    """Imports that run against ``LAYERS`` (or name a unit it does not list), one line each."""
    bad = []
    for a, b, line, inner in imports():
        ua, ub = unit(a), unit(b)
        if ua == ub:
            continue
        if ua not in RANK or ub not in RANK:
            missing = ua if ua not in RANK else ub
            bad.append(f"{a}:{line} imports {b}: unit {missing!r} is in no layer of tests/layering.py")
        elif RANK[ub] >= RANK[ua]:
            where = " (inside a function)" if inner else ""
            bad.append(f"{a}:{line} imports {b}{where}: {ua} (layer {RANK[ua]}) may not import {ub} "
                       f"(layer {RANK[ub]})")
    return bad


def depth() -> int:
    """The longest chain of unit imports (its number of units), cycles broken where found."""
    g = unit_graph()
    memo: dict[str, int] = {}

    def longest(u: str, path: frozenset) -> int:
        if u in memo:
            return memo[u]
        best = 1 + max((longest(v, path | {u}) for v in g.get(u, ()) if v not in path), default=0)
        memo[u] = best
        return best

    return max((longest(u, frozenset()) for u in list(g)), default=0)
