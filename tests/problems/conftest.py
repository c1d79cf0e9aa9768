"""Compile rendered kernels with real gcc and call them through ctypes, for the problem tests.

The harness proper (swarmfactory/harness) does this in a sandboxed worker; these helpers are the
smallest honest version: build, call on poisoned outputs, compare with the reference.
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from swarmfactory.problems import Case, Problem
from swarmfactory.problems.spec import NP_DTYPES, to_torch

CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


class Compiler:
    """gcc with a per-session cache keyed by the source text; ``build_many`` uses two jobs."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.loaded: dict[str, ctypes.CDLL] = {}

    def _so_path(self, source: str) -> Path:
        return self.workdir / f"k{hashlib.sha256(source.encode()).hexdigest()[:16]}.so"

    def _compile(self, source: str) -> Path:
        so = self._so_path(source)
        if not so.exists():
            src = so.with_suffix(".c")
            src.write_text(source)
            res = subprocess.run(["gcc", *CFLAGS, str(src), "-o", str(so), "-lm"],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                raise AssertionError(f"gcc failed on {src}:\n{res.stderr}")
        return so

    def build_many(self, sources: Sequence[str]) -> None:
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(self._compile, sources))

    def load(self, problem: Problem, source: str):
        so = self._compile(source)
        lib = self.loaded.setdefault(str(so), ctypes.CDLL(str(so)))
        return getattr(lib, problem.name)


def call_kernel(problem: Problem, fn, inputs: Mapping, shape: Mapping) -> dict[str, np.ndarray]:
    """Call ``fn`` with the problem's ABI; outputs start as NaN so skipped work shows."""
    out_shapes = problem.output_shapes(shape)
    outs = {a.name: np.full(out_shapes[a.name], np.nan, dtype=NP_DTYPES[a.dtype])
            for a in problem.outputs}
    c_args = []
    for a in problem.args:
        if a.kind == "in":
            arr = np.ascontiguousarray(inputs[a.name], dtype=NP_DTYPES[a.dtype])
            inputs = {**inputs, a.name: arr}
            c_args.append(arr.ctypes.data_as(ctypes.c_void_p))
        elif a.kind == "out":
            c_args.append(outs[a.name].ctypes.data_as(ctypes.c_void_p))
        elif a.kind == "int":
            c_args.append(ctypes.c_int64(int(inputs[a.name])))
        else:
            c_args.append(ctypes.c_float(float(inputs[a.name])))
    fn.restype = None
    fn(*c_args)
    return outs


_TORCH_ERRORS: dict[tuple[str, int], tuple[Mapping, dict]] = {}


def compare(problem: Problem, got: Mapping, ref: Mapping, label: str, inputs: Mapping | None = None) -> None:
    """The harness's own comparison: NaN where the reference has NaN, the case's tolerance, and
    (given the inputs) at most K times torch's own fp32 error on them."""
    from swarmfactory.harness.accuracy import error_vs_torch, torch_errors
    from swarmfactory.harness.verify import case_tolerance
    from swarmfactory.harness.verify import compare as harness_compare

    expected = {k: torch.as_tensor(v).double().numpy() for k, v in ref.items()}
    atol = case_tolerance(problem, expected, dict(inputs or {}))[0]
    out = {k: np.asarray(got[k], dtype=np.float32) for k in expected}
    msg = harness_compare(problem, expected, out, label, atol)
    assert msg is None, msg
    if inputs is None:
        return
    key = (problem.name, id(inputs))  # the inputs are kept alive with their torch errors
    if any(k[0] != problem.name for k in _TORCH_ERRORS):  # one problem's at a time: memory stays bounded
        _TORCH_ERRORS.clear()
    if key not in _TORCH_ERRORS or _TORCH_ERRORS[key][0] is not inputs:
        _TORCH_ERRORS[key] = (inputs, torch_errors(problem, dict(inputs), expected, atol))
    _, msg = error_vs_torch(problem, expected, out, atol, _TORCH_ERRORS[key][1], label)
    assert msg is None, msg


class CaseData:
    """Inputs and reference outputs per case, computed once while a problem's tests run."""

    def __init__(self):
        self._cache: dict[tuple[str, str], tuple[dict, dict]] = {}

    def get(self, problem: Problem, case: Case) -> tuple[dict, dict]:
        key = (problem.name, case.key())
        if key not in self._cache and any(k[0] != problem.name for k in self._cache):
            self._cache.clear()  # one problem's cases at a time (tests run problem by problem)
        if key not in self._cache:
            inputs = problem.case_inputs(case)
            ref = problem.reference(to_torch(inputs))
            self._cache[key] = (inputs, ref)
        return self._cache[key]


@pytest.fixture(scope="session")
def compiler(tmp_path_factory) -> Compiler:
    return Compiler(tmp_path_factory.mktemp("kernels"))


@pytest.fixture(scope="session")
def case_data() -> CaseData:
    return CaseData()


@pytest.fixture(scope="session")
def kernel_call():
    """``kernel_call(problem, fn, inputs, shape) -> outputs``: see ``call_kernel``."""
    return call_kernel


@pytest.fixture(scope="session")
def assert_close():
    """``assert_close(problem, got, ref, label)``: outputs within the problem's tolerance."""
    return compare
