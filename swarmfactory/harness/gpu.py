"""The GPU line of the harness: verification and measurement of the artifacts of the backends
whose runner is ``gpu`` (triton, cuda, ptx); their static checks and builds are their own and run
in the one pipeline of ``Harness.prepare`` (evaluate.py).

Same rules as for C (MEASURING.md), with a Python worker instead of the C driver:

* the candidate runs only in a fresh worker process (backends/gpu_worker.py, started as a script
  so it imports nothing of ours: no problem, no reference), in its own session and private temp dir,
  with an environment reduced to an allow-list and resource limits; a hang past the deadline
  kills its process group (`timed_out`), a death or an exception is `crashed`;
* inputs are drawn here for every case (fresh seeds, several distributions) and sent as bytes;
  every output buffer is poisoned before every call (NaN, then a large finite value);
* outputs and the inputs as the kernel left them come back as bytes and are compared here
  against the float64 reference (verify.compare: the same tolerances and trivial-answer checks as
  for C); an input changed is `cheated`; the first case of each shape runs twice (determinism);
* a GPU problem's candidate may be Triton, CUDA C++ or PTX (``Problem.backends``; the caller
  says which, default ``problem.backend``);
* without a GPU, a backend with an interpreter (Triton: ``TRITON_INTERPRET=1``) runs on the
  problem's small ``interpret_shapes`` and the verdict is `verified` (not timed: never `faster`);
  one without (cuda, ptx) is built for real (ptxas, NVRTC) and ends as `needs_device`; on a GPU a
  cubin is loaded and launched through the driver API with the geometry the source declares;
  where the backend's tool (Triton, NVRTC, ptxas) is missing, a candidate that passes the checks
  that run without it is `needs_device` too, the detail naming the tool (never `build_failed`).

On a GPU, ``measure`` runs the timing protocol of docs/gpu.md (gputimer.py).
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import numpy as np

from swarmfactory import lifecycle
from swarmfactory.backends import MissingTool, get_backend, gpu_worker
from swarmfactory.outcome import Outcome, Rejected, Verdict
from swarmfactory.harness.sandbox import worker_env, worker_limits
from swarmfactory.harness.verify import CASES, compare, describe, order_cases
from swarmfactory.problems.spec import NP_DTYPES, Case, Problem

WORKER = Path(gpu_worker.__file__)  # the GPU backends' runner, started as a script
MAX_REPLY = 1 << 30
LOAD_TIMEOUT_S = 120.0         # importing torch and triton, and the module
INTERPRET_SLOWDOWN = 6.0      # a call's deadline under the interpreter: case_timeout_s times this


@cache
def cuda_available() -> bool:
    """A usable NVIDIA GPU here (torch sees one). SWARMFACTORY_NO_GPU=1 forces the CPU path."""
    if os.environ.get("SWARMFACTORY_NO_GPU") == "1":
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


class GpuWorker:
    """One candidate process; every request has a deadline and a bounded reply."""

    def __init__(self, interpret: bool, mem_gb: float = 16.0):
        self.tmp = lifecycle.temp_dir("tmp")  # the candidate's TMPDIR: a name that gives nothing away
        env = worker_env(self.tmp)
        env.pop("PYTHONPATH", None)  # the worker imports torch and triton, never swarmfactory
        env.update(TRITON_CACHE_DIR=os.path.join(self.tmp, "triton"), OMP_NUM_THREADS="1")
        if interpret:
            env["TRITON_INTERPRET"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif "CUDA_VISIBLE_DEVICES" in os.environ:
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        to_r, self.fd_w = os.pipe()
        self.fd_r, from_w = os.pipe()
        # CUDA reserves far more address space than it uses: no RLIMIT_AS with a device
        mem = int(mem_gb * (1 << 30)) if interpret else resource_infinity()
        self.proc = lifecycle.Child([sys.executable, "-I", str(WORKER), str(to_r), str(from_w)], "gpu worker",
                                    env=env, cwd=self.tmp, limits=worker_limits(mem, 3600, True, 64 << 20),
                                    log=os.path.join(self.tmp, "worker.log"), pass_fds=(to_r, from_w))
        os.close(to_r)
        os.close(from_w)

    def request(self, head: dict, blobs: list[bytes], timeout: float, stage: str,
                max_bytes: int = MAX_REPLY) -> tuple[dict, list[bytes]]:
        """Send; return (reply, blobs) or raise Rejected (timed_out / crashed / build_failed)."""
        deadline = time.monotonic() + timeout
        raw = json.dumps({**head, "sizes": [len(b) for b in blobs]}).encode()
        try:
            os.write(self.fd_w, struct.pack("<Q", len(raw)) + raw)
            for b in blobs:
                view = memoryview(b)
                while view:
                    view = view[os.write(self.fd_w, view):]
        except OSError:
            raise self._death(stage) from None
        reply = json.loads(self._read(8 + 0, deadline, stage, header=True, max_bytes=1 << 20))
        sizes = reply.get("sizes", [])
        if not isinstance(sizes, list) or sum(int(s) for s in sizes) > max_bytes:
            raise Rejected(Outcome.CRASHED, f"the worker's reply during {stage} is malformed", stage)
        out = [self._read(int(s), deadline, stage) for s in sizes]
        if "error" in reply:
            msg = str(reply.get("message", ""))[-2000:]
            if reply["error"] == "build":
                raise Rejected(Outcome.BUILD_FAILED, f"{stage}: {msg.strip().splitlines()[-1] if msg.strip() else ''}",
                               "build", log=msg)
            raise Rejected(Outcome.CRASHED, f"the kernel raised during {stage}: "
                           f"{msg.strip().splitlines()[-1] if msg.strip() else '?'}", stage, log=msg)
        return reply, out

    def _read(self, n: int, deadline: float, stage: str, header: bool = False, max_bytes: int = 0) -> bytes:
        if header:
            (n,) = struct.unpack("<Q", self._read(8, deadline, stage))
            if n > max_bytes:
                raise Rejected(Outcome.CRASHED, f"the worker's reply during {stage} is too large", stage)
        chunks, left = [], n
        while left:
            wait = deadline - time.monotonic()
            ready = select.select([self.fd_r], [], [], max(0.0, wait))[0] if wait > 0 else []
            if not ready:
                self.kill()
                raise Rejected(Outcome.TIMED_OUT, f"no answer within the deadline during {stage}; "
                               "the worker was killed", stage)
            b = os.read(self.fd_r, min(left, 1 << 24))
            if not b:
                raise self._death(stage)
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)

    def _death(self, stage: str) -> Rejected:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        what = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
                else f"exited with status {code}")
        tail = self.log_tail()
        return Rejected(Outcome.CRASHED, f"the worker {what} during {stage}"
                        + (f"; its output ends: {tail}" if tail else ""), stage, exit_code=code)

    def log_tail(self, n: int = 400) -> str:
        return self.proc.log_tail(n)

    def kill(self) -> None:
        self.proc.close(timeout=10)

    def close(self) -> None:
        self.kill()
        for fd in (self.fd_r, self.fd_w):
            try:
                os.close(fd)
            except OSError:
                pass
        lifecycle.remove_dir(self.tmp)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def resource_infinity() -> int:
    import resource

    return resource.RLIM_INFINITY


# -- calls --------------------------------------------------------------------------------------
def call_message(problem: Problem, shape, inputs: dict, poison: float) -> tuple[dict, list[bytes]]:
    args, blobs = [], []
    out_shapes = problem.output_shapes(shape)
    for a in problem.args:
        if a.kind == "in":
            arr = np.ascontiguousarray(inputs[a.name], dtype=NP_DTYPES[a.dtype])
            args.append({"name": a.name, "kind": "in", "dtype": a.dtype, "shape": list(arr.shape)})
            blobs.append(arr.tobytes())
        elif a.kind == "out":
            args.append({"name": a.name, "kind": "out", "dtype": a.dtype, "shape": list(out_shapes[a.name])})
        else:
            args.append({"name": a.name, "kind": a.kind, "value": inputs[a.name]})
    return {"op": "call", "args": args, "poison": poison}, blobs


def decode_call(problem: Problem, shape, inputs: dict, blobs: list[bytes]) -> tuple[dict, dict]:
    """(outputs, inputs as the kernel left them) from a call's reply, sizes checked here."""
    out_shapes = problem.output_shapes(shape)
    outs, ins, it = {}, {}, iter(blobs)
    for a in problem.outputs:
        b = next(it, b"")
        want = int(np.prod(out_shapes[a.name])) * np.dtype(NP_DTYPES[a.dtype]).itemsize
        if len(b) != want:
            raise Rejected(Outcome.WRONG, f"output {a.name} came back with {len(b)} bytes, expected {want}", "verify")
        outs[a.name] = np.frombuffer(b, dtype=NP_DTYPES[a.dtype]).reshape(out_shapes[a.name])
    for a in problem.args:
        if a.kind == "in":
            arr = np.asarray(inputs[a.name], dtype=NP_DTYPES[a.dtype])
            b = next(it, b"")
            if len(b) != arr.nbytes:
                raise Rejected(Outcome.CHEATED, f"input {a.name} came back resized", "verify")
            ins[a.name] = np.frombuffer(b, dtype=arr.dtype).reshape(arr.shape)
    return outs, ins


POISONS = (float("nan"), 3.0e38)


def run_case(worker: GpuWorker, problem: Problem, case: Case, timeout: float, twice: bool) -> None:
    data = CASES.get(problem, case)
    where = describe(problem, case)
    got = []
    for poison in POISONS[: 2 if twice else 1]:
        head, blobs = call_message(problem, case.shape, data.inputs, poison)
        _, back = worker.request(head, blobs, timeout, f"verify ({where})")
        outs, ins = decode_call(problem, case.shape, data.inputs, back)
        for name, arr in ins.items():
            if not np.array_equal(arr, np.asarray(data.inputs[name]), equal_nan=True):
                raise Rejected(Outcome.CHEATED, f"the kernel modified its input `{name}` on {where} "
                               "(inputs are read-only)", "verify")
        failure = compare(problem, data.expected, outs, where, data.atol)
        if failure:
            raise Rejected(Outcome.WRONG, failure, "verify")
        got.append(outs)
    if len(got) == 2:
        for name, out in got[0].items():
            if not np.array_equal(out, got[1][name], equal_nan=True):
                raise Rejected(Outcome.WRONG, f"nondeterministic: two calls on identical inputs gave "
                               f"different `{name}` on {where} (uninitialised or racy reads)", "verify")


def interpret_cases(problem: Problem, cases: list[Case]) -> tuple[list[Case], int]:
    """The cases the interpreter can afford: the problem's interpreter shapes, and found cases no
    larger than the largest of them. Returns (kept, dropped)."""
    if not problem.interpret_shapes:
        return list(cases), 0
    small = [dict(s) for s in problem.interpret_shapes]
    limit = max(int(np.prod(list(s.values()))) for s in small)
    kept = [c for c in cases if dict(c.shape) in small
            or (c.origin not in ("seed", "workload") and int(np.prod(list(c.shape.values()))) <= limit)]
    if any(c.origin in ("seed", "workload") for c in cases):  # a validation set, not a few found cases
        covered = [dict(c.shape) for c in kept]
        kept += [Case(dict(s), seed=990_000 + 10 * i + j, dist=d)  # an interpreter shape no bundled case has
                 for i, s in enumerate(small) if s not in covered for j, d in enumerate(problem.dists)]
    return kept, len(cases) - len([c for c in cases if c in kept])


def load_message(problem: Problem, artifact) -> dict:
    """What the worker loads: a Triton module, or a cubin with its launch geometry."""
    head = {"op": "load", "path": artifact.path, "symbol": problem.entry}
    if artifact.info.get("launch"):
        head.update(launch=artifact.info["launch"], args=[{"name": a.name} for a in problem.args])
    return head


def verify(harness, prep, cases: list[Case]) -> int:
    """Every case in a fresh worker: compiled on a GPU; without one, under the backend's
    interpreter on the cases it can afford (``interpret_cases``), or `needs_device` where the
    backend has none. Returns the cases checked; Rejected on the first failure."""
    problem, backend = prep.problem, get_backend(prep.backend)
    device = cuda_available()
    if backend.interpreter is None and not device:
        arch = prep.artifact.info.get("arch", "?")
        raise Rejected(Outcome.NEEDS_DEVICE, f"built for {arch} ({prep.backend}); verification "
                       "and timing need a device: no NVIDIA GPU here", "verify",
                       **{"gpu tools": gpu_tools(prep.backend)})
    interpreter = None if device else backend.interpreter
    if interpreter:
        cases, dropped = interpret_cases(problem, cases)
        prep.extra["interpreter"] = {"cases": len(cases), "dropped (GPU shapes)": dropped}
    n = run_cases(problem, prep.artifact, cases, interpreter, harness.config.case_timeout_s, prep.extra)
    prep.extra["interpret"] = interpreter is not None
    return n


def run_cases(problem: Problem, artifact, cases: list[Case], interpreter: str | None,
              case_timeout: float, prep_extra: dict) -> int:
    """``cases`` in one fresh worker, compiled on the device or under ``interpreter``."""
    timeout = case_timeout * INTERPRET_SLOWDOWN if interpreter else case_timeout
    with GpuWorker(interpreter is not None) as worker:
        prep_extra["isolation"] = ("process boundary: own session, private temp dir, env allow-list, "
                                   "rlimits" + (f"; {interpreter}" if interpreter else ""))
        worker.request(load_message(problem, artifact), [], LOAD_TIMEOUT_S, "load")
        seen: set[str] = set()
        for case in order_cases(cases):
            key = json.dumps(dict(case.shape), sort_keys=True)
            try:
                # the first call of a shape also compiles (or traces) the kernel: a longer deadline
                run_case(worker, problem, case, timeout * (3 if key not in seen else 1), key not in seen)
            except Rejected as rej:
                if rej.stage != "build":
                    rej.stage = "verify"
                rej.evidence.setdefault("case", case.key())
                raise
            seen.add(key)
    return len(cases)


def missing_tool(backend: str, exc: MissingTool) -> Rejected:
    """`needs_device`, never `build_failed`: the machine lacks the backend's tool (Triton, NVRTC,
    ptxas), and the checks that run without it passed."""
    return Rejected(Outcome.NEEDS_DEVICE, f"not built ({backend}): {exc}; the checks that run without "
                    f"it passed{'' if cuda_available() else '; no NVIDIA GPU here either'}", "build",
                    **{"gpu tools": gpu_tools(backend)})


def measure(harness, prep) -> Verdict:
    """Time a verified candidate against the problem's baselines on the GPU; without one the
    verdict is `verified` (no speed claim)."""
    t0 = time.monotonic()
    if prep.extra.get("interpret", True) or not cuda_available():
        info = prep.extra.get("interpreter", {})
        dropped = info.get("dropped (GPU shapes)", 0)
        detail = (f"verified under the Triton interpreter on {prep.cases_checked} cases (small shapes"
                  f"{f'; {dropped} cases at GPU shapes not run' if dropped else ''}); not measured: "
                  "timing needs an NVIDIA GPU")
        verdict = Verdict(Outcome.VERIFIED, detail, "measure", cases_checked=prep.cases_checked,
                          evidence={"isolation": prep.extra.get("isolation"), **({"interpreter": info} if info else {})})
        verdict.evidence["gpu tools"] = gpu_tools(prep.backend)
    else:
        from swarmfactory.harness.gputimer import measure_candidate

        with harness.measure_lock:
            try:
                verdict = measure_candidate(harness, prep)
            except Rejected as rej:
                verdict = Verdict(rej.outcome, rej.detail, rej.stage, evidence=rej.evidence)
        verdict.cases_checked = prep.cases_checked
        verdict.evidence["gpu tools"] = gpu_tools(prep.backend)
    verdict.seconds = prep.seconds + time.monotonic() - t0
    return verdict


def gpu_tools(backend: str) -> dict:
    """What can change a GPU result, beside the CPU fingerprint every record carries: the
    backend's tool versions and the device (or the interpreter)."""
    builder = get_backend(backend)
    tools = dict(builder.versions())
    if cuda_available():
        import torch

        tools["device"] = torch.cuda.get_device_name()
        tools["cuda"] = str(torch.version.cuda)
    else:
        tools["device"] = f"none: {builder.interpreter}" if builder.interpreter else "none"
    return tools
