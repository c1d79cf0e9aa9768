"""The Triton backend's static checks on a candidate (Python source): a first, cheap `cheated`.

The protection is the process boundary and the trusted comparison (harness/gpu.py): the
candidate runs only in a worker process that never sees the reference, on fresh inputs per call,
into poisoned outputs. This filter only turns the obvious attempts into a verdict with a reason:

* imports beyond ``triton``, ``triton.language``, ``torch`` and ``math``, and attribute chains
  into Triton's runtime or compiler (``triton.runtime...`` reaches ``os`` and ``subprocess``);
* ``exec``/``eval``/``open``/``__import__``/``getattr``..., and any dunder attribute (the way
  to builtins, globals and frames);
* assignments to attributes of ``torch``/``triton``/``math`` (monkey-patching);
* the launcher computing with torch instead of a kernel: ``torch.X`` beyond allocation, dtypes and
  sizes, tensor methods that compute (``.softmax()``, ``.sum()``...) and ``@``.
"""

from __future__ import annotations

import ast

ALLOWED_IMPORTS = {"triton", "triton.language", "torch", "math"}
FORBIDDEN_NAMES = {"exec", "eval", "compile", "open", "__import__", "getattr", "setattr", "delattr",
                   "globals", "locals", "vars", "breakpoint", "input", "memoryview", "__builtins__"}
# what a launcher may use from torch: allocation, dtypes, devices, sizes
TORCH_ALLOWED = {"empty", "empty_like", "zeros", "zeros_like", "empty_strided", "float32", "float16",
                 "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool", "Tensor",
                 "device", "Size", "dtype"}
# tensor methods that compute an op (in the launcher, outside any @triton.jit function)
COMPUTE_METHODS = {"softmax", "log_softmax", "matmul", "mm", "bmm", "mv", "addmm", "einsum", "sum", "mean",
                   "exp", "log", "sqrt", "rsqrt", "pow", "sigmoid", "silu", "tanh", "norm", "var", "std",
                   "cumsum", "cumprod", "max", "min", "amax", "amin", "prod", "square", "mul", "add", "sub",
                   "div", "addcmul", "lerp", "where", "masked_fill", "scaled_dot_product_attention",
                   "rms_norm", "layer_norm", "gelu", "relu", "baddbmm", "cos", "sin", "abs", "neg",
                   "reciprocal", "clamp", "float", "double", "to", "copy_", "mul_", "add_", "div_",
                   "exp_", "sub_", "numpy", "tolist", "item", "cpu", "cuda", "__matmul__"}
PATCHABLE_ROOTS = {"torch", "triton", "tl", "math"}


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else None


TRITON_ALLOWED = {"jit", "language", "cdiv", "next_power_of_2", "autotune", "Config", "heuristics"}
# the kernel language's own namespaces: what may stand left of the last dot in tl.X.Y chains
LANGUAGE_NAMESPACES = {"triton.language", "tl.math", "triton.language.math", "tl.extra", "tl.extra.cuda",
                       "tl.extra.cuda.libdevice", "triton.language.extra", "triton.language.extra.cuda",
                       "triton.language.extra.cuda.libdevice"}


def _kernel_language(node: ast.Attribute) -> bool:
    return ast.unparse(node.value) in LANGUAGE_NAMESPACES


def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if isinstance(d, ast.Attribute) and d.attr in ("jit", "autotune", "heuristics"):
            return True
        if isinstance(d, ast.Name) and d.id in ("jit", "autotune", "heuristics"):
            return True
    return False


def check_python(source: str) -> str | None:
    """None, or why the source is rejected as `cheated`. A syntax error is not judged here (the
    build reports it)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    torch_aliases = {"torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name not in ALLOWED_IMPORTS:
                    return f"imports {a.name} (a candidate may import only {', '.join(sorted(ALLOWED_IMPORTS))})"
                if a.name == "torch" and a.asname:
                    torch_aliases.add(a.asname)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level or mod not in ALLOWED_IMPORTS:
                return f"imports from {'.' * node.level}{mod} (a candidate may import only " \
                       f"{', '.join(sorted(ALLOWED_IMPORTS))})"
            for a in node.names:
                full = f"{mod}.{a.name}"
                if mod == "torch" and a.name not in TORCH_ALLOWED:
                    return f"imports torch.{a.name}: the kernel must compute in Triton, not torch"
                if mod == "triton" and a.name not in ("jit", "language", "cdiv", "next_power_of_2",
                                                       "autotune", "Config", "heuristics"):
                    return f"imports {full} (only the kernel language and launch helpers are allowed)"
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return f"uses `{node.id}` (no dynamic code, files or reflection in a kernel)"
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("__") and node.attr.endswith("__"):
                return f"touches `{node.attr}` (dunder attributes lead to builtins, globals and frames)"
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and _root(sub) in PATCHABLE_ROOTS | torch_aliases:
                        return f"assigns to {ast.unparse(sub)} (monkey-patching the framework)"
        elif isinstance(node, ast.Global) and any(n in PATCHABLE_ROOTS for n in node.names):
            return "rebinds a framework module globally"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and _root(node) in ("triton", "tl") and not _kernel_language(node):
            return (f"reaches into {ast.unparse(node)} (a kernel uses the kernel language, not "
                    "Triton's runtime or compiler)")
    jit_nodes = {id(n) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and _is_jit(fn)
                 for n in ast.walk(fn)}
    for node in ast.walk(tree):
        if id(node) in jit_nodes:
            continue
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "triton" \
                and node.attr not in TRITON_ALLOWED:
            return f"uses triton.{node.attr} in the launcher (only {', '.join(sorted(TRITON_ALLOWED))})"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in torch_aliases and node.attr not in TORCH_ALLOWED:
            return f"calls torch.{node.attr} outside a kernel: the kernel must compute in Triton, not torch"
        if isinstance(node, ast.Attribute) and _root(node) in torch_aliases and isinstance(node.value, ast.Attribute):
            return f"uses {ast.unparse(node)} outside a kernel: the kernel must compute in Triton, not torch"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in COMPUTE_METHODS and _root(node.func) not in ("tl", "triton", "math"):
            return (f"calls .{node.func.attr}() in the launcher: the kernel must compute in Triton, "
                    "not torch")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return "uses @ in the launcher: the kernel must compute in Triton, not torch"
    return None
