"""The harness worker: the only process that ever runs candidate code.

Started by ``sandbox.Worker`` as ``python -m swarmfactory.harness.worker IN_FD OUT_FD`` inside a
private temp dir, with resource limits and a stripped environment. It keeps input/output buffers
per *slot* (one per shape), so successive trials reuse the same addresses with new contents: a
kernel that caches results by pointer shows it. It never judges anything: it returns raw outputs
and raw timings, and the coordinator checks both.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import importlib
import importlib.util
import sys
import time

import numpy as np

from swarmfactory.harness import protocol

CTYPES = {"int": ctypes.c_int64, "float": ctypes.c_float}


def digest(arrays: dict) -> dict:
    return {k: hashlib.blake2b(np.ascontiguousarray(v).tobytes(), digest_size=16).hexdigest()
            for k, v in arrays.items() if isinstance(v, np.ndarray)}


def _load_problem(source: str):
    if source.endswith(".py"):
        spec = importlib.util.spec_from_file_location("sf_worker_problem", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(source)
    if getattr(module, "PROBLEM", None) is None and hasattr(module, "Model"):
        from swarmfactory.problems.kernelbench import from_kernelbench_module

        return from_kernelbench_module(module, source)
    return module.PROBLEM


class CandidateRunner:
    """Calls a C symbol with the problem's ABI on persistent numpy buffers."""

    def __init__(self, path: str, symbol: str, args: list):
        from swarmfactory.backends.c import CBackend

        self.args = args  # [(name, kind, dtype)]
        argtypes = [ctypes.c_void_p if kind in ("in", "out") else CTYPES[kind] for _, kind, _ in args]
        self.fn = CBackend.load(path, symbol, argtypes)
        self.slots: dict = {}

    def set(self, slot, inputs: dict, out_shapes: dict) -> None:
        old = self.slots.get(slot)
        if old is None or any(old["bufs"][k].shape != np.shape(v) for k, v in inputs.items()
                              if isinstance(v, np.ndarray)):
            bufs = {k: np.array(v, copy=True, order="C") for k, v in inputs.items()
                    if isinstance(v, np.ndarray)}
            bufs.update({k: np.empty(s, dtype=np.float32) for k, s in out_shapes.items()})
        else:
            bufs = old["bufs"]
            for k, v in inputs.items():
                if isinstance(v, np.ndarray):
                    np.copyto(bufs[k], v)
        call_args = []
        for name, kind, _ in self.args:
            if kind in ("in", "out"):
                call_args.append(bufs[name].ctypes.data)
            else:
                call_args.append(CTYPES[kind](inputs[name]))
        outs = [name for name, kind, _ in self.args if kind == "out"]
        self.slots[slot] = {"bufs": bufs, "call": call_args, "outs": outs}

    def call(self, slot, poison: float = float("nan")) -> dict:
        s = self.slots[slot]
        for k in s["outs"]:
            s["bufs"][k].fill(poison)
        self.fn(*s["call"])
        return {"outputs": {k: s["bufs"][k].copy() for k in s["outs"]},
                "inputs": digest({k: v for k, v in s["bufs"].items() if k not in s["outs"]})}

    def time(self, slots: list, iters: int, want_outputs: bool) -> dict:
        calls = [self.slots[s]["call"] for s in slots]
        for s in slots:
            for k in self.slots[s]["outs"]:
                self.slots[s]["bufs"][k].fill(float("nan"))
        fn, n = self.fn, len(calls)
        gc.disable()
        t0 = time.perf_counter_ns()
        for i in range(iters):
            fn(*calls[i % n])
        t1 = time.perf_counter_ns()
        gc.enable()
        out = {"ns": t1 - t0}
        if want_outputs:
            out["outputs"] = {s: {k: self.slots[s]["bufs"][k].copy() for k in self.slots[s]["outs"]}
                              for s in slots}
        return out


class BaselineRunner:
    """Runs one of a problem's PyTorch baselines (eager or torch.compile'd)."""

    def __init__(self, problem_source: str, name: str, mode: str, threads: int):
        import torch

        torch.set_num_threads(max(1, threads))
        self.torch = torch
        self.problem = _load_problem(problem_source)
        if name == "eager-reference":
            self.setup = self.problem.eager or (lambda t: (lambda: self.problem.reference(t)))
        else:
            self.setup = self.problem.baselines[name]
        self.mode = mode
        self.slots: dict = {}

    def set(self, slot, inputs: dict, out_shapes: dict) -> None:
        from swarmfactory.problems.spec import to_torch

        t = to_torch(inputs)
        fn = self.setup(t)
        if self.mode == "compile":
            fn = self.torch.compile(fn, dynamic=False)
        self.slots[slot] = {"fn": fn, "outs": list(out_shapes)}

    def call(self, slot, poison: float = float("nan")) -> dict:
        s = self.slots[slot]
        with self.torch.inference_mode():
            res = s["fn"]()
        if isinstance(res, dict):
            vals = [res[k] for k in s["outs"]]
        else:
            vals = list(res) if isinstance(res, (tuple, list)) else [res]
        return {"outputs": {k: self.torch.as_tensor(v).float().numpy().copy() for k, v in zip(s["outs"], vals)},
                "inputs": {}}

    def time(self, slots: list, iters: int, want_outputs: bool) -> dict:
        fns = [self.slots[s]["fn"] for s in slots]
        n = len(fns)
        with self.torch.inference_mode():
            gc.disable()
            t0 = time.perf_counter_ns()
            for i in range(iters):
                fns[i % n]()
            t1 = time.perf_counter_ns()
            gc.enable()
        return {"ns": t1 - t0}


def serve(fd_in: int, fd_out: int) -> None:
    runner = None
    while True:
        try:
            msg = protocol.recv(fd_in)
        except EOFError:
            return
        op = msg["op"]
        try:
            if op == "load_c":
                runner = CandidateRunner(msg["path"], msg["symbol"], msg["args"])
                reply = {"ok": True}
            elif op == "load_baseline":
                runner = BaselineRunner(msg["problem"], msg["name"], msg["mode"], msg["threads"])
                reply = {"ok": True}
            elif op == "set":
                runner.set(msg["slot"], msg["inputs"], msg["out_shapes"])
                reply = {"ok": True}
            elif op == "call":
                reply = runner.call(msg["slot"], msg.get("poison", float("nan")))
            elif op == "time":
                reply = runner.time(msg["slots"], msg["iters"], msg.get("outputs", False))
            elif op == "exit":
                return
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # reported to the coordinator, which decides the outcome
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        protocol.send(fd_out, reply)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
