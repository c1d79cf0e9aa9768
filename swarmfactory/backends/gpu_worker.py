"""The GPU candidate's process, the runner of the NVIDIA backends: loads one artifact (a Triton
module, or a cubin launched through the CUDA driver API) and calls it on the inputs the trusted
side sends; nothing here decides anything. The backends cuda and ptx check a source's launch
geometry at build (``parse_launch``) with the evaluator the worker launches it with.

Started by harness/gpu.py as a script (``python -I gpu_worker.py``), so it imports nothing of
swarmfactory (and this module imports nothing of ours, wherever it runs): the problem, its
reference and the comparison stay in the trusted process. On a machine without a GPU it runs
with ``TRITON_INTERPRET=1`` (Triton's interpreter, CPU tensors). Every output buffer is filled
with the poison the trusted side names before the call; inputs arrive as raw bytes for every
call (fresh draws). The protocol is framed JSON headers plus raw array bytes, on a file
descriptor of its own (stdout is pointed at stderr, so a candidate's prints cannot forge replies).
Nothing executable is ever sent either way.

Replies carry ``error`` = ``build`` (import error, syntax error, Triton compile error) or
``crash`` (anything else the candidate raised) with the message.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import traceback

MAX_HEADER = 1 << 20


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        b = os.read(fd, min(left, 1 << 24))
        if not b:
            raise EOFError
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def recv(fd: int) -> tuple[dict, list[bytes]]:
    (n,) = struct.unpack("<Q", _read_exact(fd, 8))
    if n > MAX_HEADER:
        raise ValueError("header too large")
    head = json.loads(_read_exact(fd, n))
    blobs = [_read_exact(fd, int(k)) for k in head.get("sizes", [])]
    return head, blobs


def send(fd: int, head: dict, blobs: list[bytes] = ()) -> None:
    head = dict(head, sizes=[len(b) for b in blobs])
    raw = json.dumps(head).encode()
    os.write(fd, struct.pack("<Q", len(raw)) + raw)
    for b in blobs:
        view = memoryview(b)
        while view:
            n = os.write(fd, view)
            view = view[n:]


def _error_kind(exc: BaseException) -> str:
    """``build`` where Triton (or Python) rejected the kernel's code itself: an import or syntax
    error, a compile error, or, under the interpreter, a check of the kernel language (a
    non-power-of-2 arange, a type error in ``tl``) that the compiler would have failed."""
    if isinstance(exc, (SyntaxError, ImportError)):
        return "build"
    name = type(exc).__name__
    if "CompilationError" in name:
        return "build"
    cause = exc.__cause__
    if name == "InterpreterError" and cause is not None:
        frames = traceback.extract_tb(cause.__traceback__)
        if frames and "/triton/language/" in frames[-1].filename.replace(os.sep, "/"):
            return "build"
    return "crash"


def _message(exc: BaseException, limit: int = 2000) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    # the candidate's own frames say most; keep the end of the trace
    text = "".join(tb[-6:])
    return text[-limit:]


# -- raw cubins (backends cuda and ptx) ----------------------------------------------------------
LAUNCH_PREFIX = "launch:"


def parse_launch(source: str) -> str:
    """The launch geometry a CUDA/PTX source declares in a comment line:
    ``// launch: grid=(cdiv(rows, 4), 1, 1) block=(128, 1, 1) shared=0`` (expressions over the
    problem's integer arguments: + - * // %, cdiv, min, max). Returns the spec (after "launch:");
    ValueError with what is wrong."""
    for line in source.splitlines():
        text = line.strip().lstrip("/").strip()
        if text.startswith(LAUNCH_PREFIX):
            spec = text[len(LAUNCH_PREFIX):].strip()
            launch_geometry(spec, None)  # syntax only
            return spec
    raise ValueError("no launch geometry: add a comment line `// launch: grid=(X, Y, Z) block=(X, Y, Z)` "
                     "(expressions over the integer arguments; cdiv, min, max)")


def launch_geometry(spec: str, ints: dict | None) -> tuple[tuple, tuple, int]:
    """(grid, block, shared bytes) from ``spec`` with the integer arguments ``ints`` (None: check
    the syntax only). A tiny evaluator: names, integers, + - * // %, cdiv/min/max; nothing else."""
    import ast
    import re

    parts = {}
    for m in re.finditer(r"\b(grid|block|shared)\s*=\s*", spec):
        i = m.end()
        if spec[i:i + 1] == "(":  # a balanced parenthesised group
            depth, j = 0, i
            while j < len(spec):
                depth += {"(": 1, ")": -1}.get(spec[j], 0)
                j += 1
                if depth == 0:
                    break
            parts[m.group(1)] = spec[i:j] if depth == 0 else None
        else:
            parts[m.group(1)] = spec[i:].split()[0] if spec[i:].split() else None
    if not parts.get("grid") or not parts.get("block"):
        raise ValueError(f"launch geometry {spec!r} needs grid=(...) and block=(...)")
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}
    funcs = {"cdiv": lambda a, b: -(-a // b), "min": min, "max": max}

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if ints is None:
                return 1
            if node.id not in ints:
                raise ValueError(f"launch geometry names {node.id!r}, not an integer argument")
            return int(ints[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in funcs:
            return funcs[node.func.id](*[ev(a) for a in node.args])
        raise ValueError(f"launch geometry: {ast.unparse(node)!r} is not allowed (integers, argument names, "
                         "+ - * // %, cdiv, min, max)")

    def triple(text):
        tree = ast.parse(text, mode="eval").body
        items = tree.elts if isinstance(tree, ast.Tuple) else [tree]
        dims = [max(1, ev(e)) for e in items][:3]
        return tuple(dims + [1] * (3 - len(dims)))

    try:
        return triple(parts["grid"]), triple(parts["block"]), int(parts.get("shared", "0"))
    except SyntaxError as exc:
        raise ValueError(f"launch geometry {spec!r}: {exc.msg}") from None


def load_cubin(path: str, symbol: str, launch: str, args_meta: list | None = None):
    """A callable launching ``symbol`` from the cubin at ``path`` through the CUDA driver API on
    torch's current stream: pointers for tensors, int64 for ints, fp32 for floats."""
    import ctypes

    import torch

    torch.empty(1, device="cuda")  # the primary context, current on this thread
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(status, what):
        if status != 0:
            msg = ctypes.c_char_p()
            cuda.cuGetErrorString(status, ctypes.byref(msg))
            raise RuntimeError(f"CUDA driver: {what}: {(msg.value or b'?').decode()}")

    data = open(path, "rb").read()
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(module), data), "cuModuleLoadData")
    check(cuda.cuModuleGetFunction(ctypes.byref(fn), module, symbol.encode()), f"cuModuleGetFunction({symbol})")

    def launcher(*args):
        params = []
        for a in args:
            if isinstance(a, torch.Tensor):
                params.append(ctypes.c_uint64(a.data_ptr()))
            elif isinstance(a, int):
                params.append(ctypes.c_int64(a))
            else:
                params.append(ctypes.c_float(a))
        ints = {n: a for n, a in zip(launcher.names, args) if isinstance(a, int)}
        grid, block, shared = launch_geometry(launch, ints)
        ptrs = (ctypes.c_void_p * len(params))(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(cuda.cuLaunchKernel(fn, *grid, *block, shared, stream, ptrs, None), "cuLaunchKernel")
    launcher.names = [a["name"] for a in args_meta] if args_meta else []
    return launcher


def main() -> None:
    fd_in, fd_out = int(sys.argv[1]), int(sys.argv[2])
    os.dup2(2, 1)  # the candidate's prints go to the log, never into the protocol
    import numpy as np
    import torch

    torch.set_num_threads(1)
    device = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available() else "cpu"
    fn = None
    while True:
        try:
            head, blobs = recv(fd_in)
        except EOFError:
            return
        op = head["op"]
        if op == "load":
            try:
                if head.get("launch"):  # a cubin (cuda, ptx): the driver API, on a device only
                    fn = load_cubin(head["path"], head["symbol"], head["launch"], head.get("args"))
                else:
                    import importlib.util

                    spec = importlib.util.spec_from_file_location("sf_candidate", head["path"])
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    fn = getattr(module, head["symbol"])
                send(fd_out, {"ok": True, "device": device})
            except BaseException as exc:  # noqa: BLE001 - everything the candidate does is reported
                send(fd_out, {"error": _error_kind(exc), "message": _message(exc)})
        elif op == "call":
            args, outs = [], []
            it = iter(blobs)
            for a in head["args"]:
                if a["kind"] == "in":
                    arr = np.frombuffer(next(it), dtype=a["dtype"]).reshape(a["shape"]).copy()
                    args.append(torch.from_numpy(arr).to(device))
                elif a["kind"] == "out":
                    t = torch.empty(a["shape"], dtype=getattr(torch, a["dtype"]), device=device)
                    t.fill_(float(head["poison"]))
                    args.append(t)
                    outs.append((a["name"], t))
                else:
                    args.append(int(a["value"]) if a["kind"] == "int" else float(a["value"]))
            try:
                fn(*args)
                if device == "cuda":
                    torch.cuda.synchronize()
            except BaseException as exc:  # noqa: BLE001
                send(fd_out, {"error": _error_kind(exc), "message": _message(exc)})
                continue
            back = [t.detach().cpu().contiguous().numpy().tobytes() for _, t in outs]
            ins = [args[i].detach().cpu().contiguous().numpy().tobytes()
                   for i, a in enumerate(head["args"]) if a["kind"] == "in"]
            send(fd_out, {"ok": True, "outputs": [n for n, _ in outs]}, back + ins)
        elif op == "time":
            from importlib.util import module_from_spec, spec_from_file_location

            spec = spec_from_file_location("sf_gputimer", head["timer"])
            timer = module_from_spec(spec)
            spec.loader.exec_module(timer)
            try:
                result, back = timer.time_in_worker(fn, head, blobs, device)
                send(fd_out, {"ok": True, **result}, back)
            except BaseException as exc:  # noqa: BLE001
                send(fd_out, {"error": _error_kind(exc), "message": _message(exc)})
        else:
            send(fd_out, {"error": "crash", "message": f"unknown op {op!r}"})


if __name__ == "__main__":
    main()
