"""The trusted worker: our own PyTorch baselines and eager references, never candidate code.

Started by ``sandbox.Worker`` as ``python -m swarmfactory.harness.worker IN_FD OUT_FD``. One
worker serves one baseline of one problem in every mode (eager, torch.compile) and at every thread
count: each request names its runner, ``[mode, threads]``, and the worker sets torch's thread count
to the runner's before it runs anything (one torch import per baseline, not one per thread count
and mode). It runs in the environment a user has (no OpenMP wait policy or thread count set for
it), and times its own loops: it is trusted, and a
self-timed loop carries none of the exchange overhead. Candidate code runs only in the C driver
(driver.c), which speaks a fixed binary format and nothing else.
"""

from __future__ import annotations

import gc
import sys
import time

from swarmfactory.harness import protocol
from swarmfactory.problems import problem_from_source


class BaselineRunner:
    """Runs one of a problem's PyTorch baselines (eager or torch.compile'd)."""

    def __init__(self, problem_source: str, name: str, mode: str, threads: int):
        import torch

        torch.set_num_threads(max(1, threads))
        self.threads = threads
        self.torch = torch
        self.problem = problem_from_source(problem_source)
        if name == "eager-reference":
            self.setup = self.problem.eager or (lambda t: (lambda: self.problem.reference(t)))
        else:
            self.setup = self.problem.baselines[name]
        self.mode = mode
        self.slots: dict = {}

    def set(self, slot, inputs: dict, out_shapes: dict) -> bool:
        """Bind the baseline to these inputs; True for the engine's own C (timed in a C loop)."""
        from swarmfactory.problems.spec import to_torch

        t = to_torch(inputs)
        fn = self.setup(t)
        if self.mode == "compile":
            if getattr(fn, "native", False):  # the engine's own C (engine/native/element_ops.py)
                raise RuntimeError("a native baseline has no torch.compile form (timed eager)")
            fn = self.torch.compile(fn, dynamic=False)
        # a tuple result is in the order of the problem's out args (the contract), whatever
        # order ``output_shapes`` lists them in
        outs = [a.name for a in self.problem.outputs] or list(out_shapes)
        self.slots[slot] = {"fn": fn, "outs": outs}
        return bool(getattr(fn, "native", False))

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
        if all(getattr(f, "native", False) for f in fns):
            # the engine's own C: its calls run in a C loop, as a candidate's in the driver (each
            # input set's share of the calls back to back, so its caches stay warm: never in the
            # candidate's favour)
            t0 = time.perf_counter_ns()
            for j, f in enumerate(fns):
                f.loop(iters // n + (1 if j < iters % n else 0))
            return {"ns": time.perf_counter_ns() - t0}
        with self.torch.inference_mode():
            gc.disable()
            t0 = time.perf_counter_ns()
            for i in range(iters):
                fns[i % n]()
            t1 = time.perf_counter_ns()
            gc.enable()
        return {"ns": t1 - t0}


def dispatch_ns(iters: int = 20000) -> float:
    """What one call costs a Python caller around any op (Python, the dispatcher, a tiny
    output): a one-element negation, the least of three loops, in nanoseconds per call."""
    import torch

    x = torch.zeros(1)
    best = float("inf")
    with torch.inference_mode():
        gc.disable()
        for _ in range(3):
            t0 = time.perf_counter_ns()
            for _ in range(iters):
                torch.neg(x)
            best = min(best, (time.perf_counter_ns() - t0) / iters)
        gc.enable()
    return best


class Runners:
    """The runners of one worker, keyed by (mode, threads); torch's thread count follows the
    runner a request names."""

    def __init__(self):
        self.problem: tuple | None = None  # (source, name) every runner of this worker serves
        self.runners: dict[tuple, BaselineRunner] = {}
        self.threads: int | None = None

    def load(self, msg: dict) -> None:
        ident = (msg["problem"], msg["name"])
        if self.problem not in (None, ident):
            raise ValueError(f"this worker serves {self.problem[1]} of {self.problem[0]}, not {ident}")
        self.problem = ident
        key = (msg["mode"], int(msg["threads"]))
        if key not in self.runners:
            self.runners[key] = BaselineRunner(msg["problem"], msg["name"], msg["mode"], msg["threads"])
            self.threads = max(1, int(msg["threads"]))

    def select(self, msg: dict) -> BaselineRunner:
        key = tuple(msg.get("runner") or ())
        if len(key) != 2 or (key[0], int(key[1])) not in self.runners:
            raise KeyError(f"no runner {key!r} loaded in this worker")
        runner = self.runners[(key[0], int(key[1]))]
        if self.threads != max(1, runner.threads):
            runner.torch.set_num_threads(max(1, runner.threads))
            self.threads = max(1, runner.threads)
        return runner


def serve(fd_in: int, fd_out: int) -> None:
    runners = Runners()
    while True:
        try:
            msg = protocol.recv(fd_in)
        except EOFError:
            return
        op = msg["op"]
        try:
            if op == "load_baseline":
                runners.load(msg)
                reply = {"ok": True}
            elif op == "set":
                native = runners.select(msg).set(msg["slot"], msg["inputs"], msg["out_shapes"])
                reply = {"ok": True, "native": native}
            elif op == "call":
                reply = runners.select(msg).call(msg["slot"], msg.get("poison", float("nan")))
            elif op == "time":
                reply = runners.select(msg).time(msg["slots"], msg["iters"], msg.get("outputs", False))
            elif op == "dispatch":
                reply = {"ns": dispatch_ns()}
            elif op == "exit":
                return
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # reported to the coordinator, which decides the outcome
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        protocol.send(fd_out, reply)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
