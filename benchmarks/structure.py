"""The package's shape, as a new engineer meets it: layers, imports running back up, long
functions, big modules, imports of our own modules hidden inside functions.

    .venv/bin/python benchmarks/structure.py [--root DIR]   # DIR: a checkout (default: this one)

The layers are those stated in tests/layering.py (the CI test that fails on a new import running
back up); ``--root`` measures another checkout against the same statement, e.g. an older commit
(``git worktree add /tmp/old COMMIT``).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import layering  # noqa: E402

LONG_FUNCTION = 80
BIG_MODULE = 400


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    args = ap.parse_args(argv)
    layering.PACKAGE = Path(args.root).resolve() / "swarmfactory"
    long_fns, big = [], []
    for path in sorted(layering.PACKAGE.rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(layering.PACKAGE.parent)
        if len(text.splitlines()) > BIG_MODULE:
            big.append((len(text.splitlines()), str(name)))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LONG_FUNCTION:
                    long_fns.append((n, f"{name}::{node.name}"))
    found = layering.imports()
    inner = [f for f in found if f[3]]
    up = layering.upward()
    print(f"package: {layering.PACKAGE}")
    print(f"units: {len({layering.unit(m) for m in layering.modules()})}, "
          f"longest chain of unit imports: {layering.depth()}")
    print(f"imports running back up (against tests/layering.py): {len(up)}")
    for line in up:
        print("  " + line)
    print(f"imports of our own modules inside functions: {len(inner)}")
    print(f"functions over {LONG_FUNCTION} lines: {len(long_fns)}")
    for n, f in sorted(long_fns, reverse=True):
        print(f"  {n:4d} {f}")
    print(f"modules over {BIG_MODULE} lines: {len(big)}")
    for n, f in sorted(big, reverse=True):
        print(f"  {n:4d} {f}")


if __name__ == "__main__":
    main()
