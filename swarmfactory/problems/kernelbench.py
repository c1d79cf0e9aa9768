"""KernelBench-format files as fixed-shape problems.

A KernelBench file defines ``class Model(nn.Module)``, ``get_inputs()`` and
``get_init_inputs()``. It becomes a problem with one shape (the one ``get_inputs`` makes), whose C
ABI is ``void <stem>(const float *in0, ..., const float *p0, ..., float *out0, ...)``: the fp32
tensors of ``get_inputs()`` in order, then the model's parameters and buffers in
``named_parameters()``/``named_buffers()`` order (a kernel cannot compute a Linear without its
weight), then the outputs. All are fp32, contiguous, row-major; anything else is refused.

* Weights: ``torch.manual_seed(0)`` before ``Model(*get_init_inputs())``, so they are the same
  on every load; they stay fixed across cases (they are part of the problem, like a checkpoint).
* Inputs: every case calls ``get_inputs()`` under a torch seed drawn from the case's rng, so the
  values follow the file's own distribution (its one dist is called "normal").
* Reference: the model in float64 when it runs in float64, else in fp32; baseline: the fp32
  model in eager mode.
* Tolerance: KernelBench's own check (``torch.allclose`` with rtol = atol = 1e-2) unless the file
  sets ``RTOL`` and ``ATOL``.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import numpy as np

from swarmfactory.problems.spec import Arg, Problem, Tolerance

KERNELBENCH_TOL = 1e-2


def _error(msg: str):
    from swarmfactory.problems import ProblemError

    return ProblemError(msg)


def _c_name(stem: str) -> str:
    name = re.sub(r"\W", "_", stem)
    return f"kb_{name}" if not name or name[0].isdigit() else name


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _check_fp32(tensors, what: str, path: Path) -> None:
    import torch

    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise _error(f"{path}: {what}[{i}] is of type {type(t).__name__}; only fp32 tensors are "
                         f"supported (make it a tensor or a constant inside Model)")
        if t.dtype != torch.float32:
            raise _error(f"{path}: {what}[{i}] is {t.dtype}; only torch.float32 is supported")


def from_kernelbench_module(module, path) -> Problem:
    """The problem a KernelBench module describes; ``ProblemError`` if it cannot be one."""
    import torch
    from torch.func import functional_call

    path = Path(path)
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise _error(f"{path}: a KernelBench file needs Model, get_inputs and "
                         f"get_init_inputs; {attr} is missing")
    try:
        torch.manual_seed(0)
        model = module.Model(*module.get_init_inputs()).eval()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            example = list(module.get_inputs())
        _check_fp32(example, "get_inputs()", path)
        params = dict(model.named_parameters())
        params.update(dict(model.named_buffers()))
        _check_fp32(list(params.values()), "parameters and buffers", path)
        with torch.no_grad():
            outs = _as_tuple(model(*example))
        _check_fp32(outs, "Model outputs", path)
    except Exception as exc:
        if type(exc).__name__ == "ProblemError":
            raise
        raise _error(f"{path}: cannot build or run Model: {type(exc).__name__}: {exc}") from exc

    n_in, n_par = len(example), len(params)
    param_names = list(params)
    fixed_params = {f"p{i}": params[n].detach().contiguous().numpy().copy()
                    for i, n in enumerate(param_names)}
    shape = {f"in{i}_d{j}": int(s) for i, t in enumerate(example) for j, s in enumerate(t.shape)}
    if not shape:  # 0-d inputs only: the shape still needs a key
        shape = {"scalar": 1}
    out_shapes = {f"out{i}": tuple(int(s) for s in o.shape) for i, o in enumerate(outs)}
    in_shapes = [tuple(t.shape) for t in example]

    ref_model, ref_dtype = model, torch.float32
    try:
        m64 = copy.deepcopy(model).double()
        with torch.no_grad():
            m64(*[t.double() for t in example])
        ref_model, ref_dtype = m64, torch.float64
    except Exception:  # an op without float64 support: fp32 it is
        pass

    def make_inputs(_shape, rng: np.random.Generator, dist: str) -> dict[str, Any]:
        if dist != "normal":
            raise ValueError(f"KernelBench problems have one distribution, 'normal', not {dist!r}")
        with torch.random.fork_rng():
            torch.manual_seed(int(rng.integers(0, 2**62)))
            tensors = list(module.get_inputs())
        got = [tuple(t.shape) for t in tensors]
        if got != in_shapes:
            raise ValueError(f"get_inputs() changed shape: {got} != {in_shapes}")
        return {**{f"in{i}": t.detach().contiguous().numpy().copy() for i, t in enumerate(tensors)},
                **fixed_params}

    def _call(m, t, dtype):
        args = [t[f"in{i}"].to(dtype) for i in range(n_in)]
        state = {n: t[f"p{i}"].to(dtype) for i, n in enumerate(param_names)}
        with torch.no_grad():
            return _as_tuple(functional_call(m, state, tuple(args)))

    def reference(t):
        return {f"out{i}": o for i, o in enumerate(_call(ref_model, t, ref_dtype))}

    def baseline_eager(t):
        args = [t[f"in{i}"] for i in range(n_in)]

        def fn():
            with torch.no_grad():
                return model(*args)

        return fn

    rtol = float(getattr(module, "RTOL", KERNELBENCH_TOL))
    atol = float(getattr(module, "ATOL", KERNELBENCH_TOL))
    reason = ("set by the file (RTOL, ATOL)" if hasattr(module, "RTOL")
              else "KernelBench's own correctness check (torch.allclose, rtol = atol = 1e-2); "
                   "the op is arbitrary, so no tighter bound can be derived")
    doc = (module.__doc__ or module.Model.__doc__ or "").strip().splitlines()
    return Problem(
        name=_c_name(path.stem),
        version=1,
        description=(doc[0] if doc else f"KernelBench problem {path.name}") + " (KernelBench format)",
        args=tuple([Arg(f"in{i}", "in") for i in range(n_in)]
                   + [Arg(f"p{i}", "in") for i in range(n_par)]
                   + [Arg(f"out{i}", "out") for i in range(len(outs))]),
        make_inputs=make_inputs,
        output_shapes=lambda _s: dict(out_shapes),
        reference=reference,
        baselines={"eager": baseline_eager},
        tolerance=Tolerance(rtol, atol, reason),
        workload=(shape,),
        edge_shapes=(shape,),
        dists=("normal",),
        source_path=str(path.resolve()),
    )
