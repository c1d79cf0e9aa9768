"""Triton backend: a candidate is a Python module with ``@triton.jit`` kernels and a launcher
named after the problem, taking the problem's args in order (torch tensors and Python scalars).

``build`` never runs candidate code: it parses the module (a syntax error is `build_failed`),
checks the launcher's signature against the problem's and that every ``tl.X`` it names exists in
this Triton, and stores the source under a key over the source and the Triton version. Triton's
own compilation happens at the first launch, inside the GPU worker (gpu_worker.py, which imports
the module); a compile error there is reported as `build_failed` too. Without a GPU the worker
runs the kernels under Triton's interpreter. The static check is pystatic.py's.
"""

from __future__ import annotations

import ast
import hashlib
import os
from functools import cache

from swarmfactory.backends.base import Artifact, BuildError, Language, MissingTool
from swarmfactory.backends.c import cache_dir
from swarmfactory.backends.gputools import NvidiaBackend
from swarmfactory.backends.pystatic import check_python


def _tl_names() -> set[str] | None:
    try:
        import triton.language as tl
    except ImportError:
        return None
    return set(dir(tl))


def _launcher_args(prototype: str) -> list[str]:
    """``def name(a, b, c)`` -> [a, b, c]."""
    inner = prototype[prototype.index("(") + 1: prototype.rindex(")")]
    return [a.strip() for a in inner.split(",") if a.strip()]


def check_module(source: str, symbol: str, prototype: str | None) -> None:
    """Raise BuildError where the module cannot be the problem's kernel."""
    try:
        tree = ast.parse(source)
        compile(tree, "kernel.py", "exec")
    except SyntaxError as exc:
        raise BuildError(f"syntax error: kernel.py line {exc.lineno}: {exc.msg}",
                         f"{exc.msg}\n{exc.text or ''}") from None
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    launcher = funcs.get(symbol)
    if launcher is None:
        raise BuildError(f"no launcher `def {symbol}(...)` at the top level of the module"
                         + (f"; the problem's ABI is: {prototype}" if prototype else ""))
    if prototype:
        want = _launcher_args(prototype)
        got = [a.arg for a in launcher.args.args]
        if got != want:
            raise BuildError(f"the launcher takes ({', '.join(got)}); the problem's ABI is: {prototype}")
    jitted = [n for n in funcs.values() if any(
        (isinstance(d, ast.Attribute) and d.attr == "jit")
        or (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in ("jit", "autotune"))
        for d in n.decorator_list)]
    if not jitted:
        raise BuildError("no @triton.jit kernel in the module: the launcher must launch a Triton kernel")
    names = _tl_names()
    if names is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "tl" and node.attr not in names:
                raise BuildError(f"triton.language has no `{node.attr}` (kernel.py line {node.lineno})")


class TritonBackend(NvidiaBackend):
    name = "triton"
    extensions = (".py",)
    interpreter = "Triton interpreter on CPU"
    language = Language(name="Python (Triton)", fence="python", fences=("", "python", "py", "triton"),
                        system_prompt="system.triton.md.j2")

    def check(self, source: str) -> str | None:
        return check_python(source)

    def signature(self, problem) -> str:
        """The launcher's ``def``: the problem's args in order, as torch tensors and Python scalars."""
        return problem.py_signature

    @cache
    def versions(self) -> dict[str, str]:
        try:
            import triton

            return {"triton": triton.__version__}
        except ImportError:
            return {"triton": "missing"}

    def build(self, source: str, symbol: str, flags: tuple[str, ...] | None = None,
              prototype: str | None = None, checks: bool = False, load_checks: bool = True) -> Artifact:
        check_module(source, symbol, prototype)  # all but the `tl.X` names needs no Triton
        if self.versions()["triton"] == "missing":
            raise MissingTool("Triton is not installed here: pip install 'swarmfactory[gpu]' (or triton)")
        key = hashlib.sha256("\0".join([source, symbol, prototype or "", self.versions()["triton"]])
                             .encode()).hexdigest()[:24]
        out = cache_dir() / f"triton-{key}.py"
        if out.exists():
            return Artifact(str(out), symbol, key, cached=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(source)
        os.replace(tmp, out)
        return Artifact(str(out), symbol, key)
