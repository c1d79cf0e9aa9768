"""KernelBench-format files as fixed-shape problems, held to the same standard as the bundled ones.

A KernelBench file defines ``class Model(nn.Module)``, ``get_inputs()`` and
``get_init_inputs()``. It becomes a problem with one shape (the one ``get_inputs`` makes), whose C
ABI is ``void <stem>(const float *in0, ..., const float *p0, ..., float *out0, ...)``: the fp32
tensors of ``get_inputs()`` in order, then the model's parameters and buffers in
``named_parameters()``/``named_buffers()`` order (a kernel cannot compute a Linear without its
weight), then the outputs. All are fp32, contiguous, row-major; anything else is refused.

* Inputs: the file's own distribution ("normal": ``get_inputs()`` under a seed drawn from the
  case), and beyond it, at the same shapes, signed (standard normal), large, tiny and
  special-valued (NaN, -0.0, denormals) inputs: ``torch.rand`` is never negative, so a copy would
  pass as a ReLU on the file's own inputs alone.
* Parameters: drawn per case around the seeded model's initial values (their spread, or half
  their magnitude where they are constant, as LayerNorm's ones and zeros are), so a kernel that
  ignores a weight or a bias is wrong.
* Reference: the model in float64 (``model.double()``, the case's parameters) when it runs in
  float64, else in fp32. Baseline and the "vs reference" column: the fp32 model in eager mode,
  with the case's parameters loaded.
* Torch's own error: the fp32 model's forward on the same inputs and parameters, against the
  float64 one; a candidate's error may be at most a small multiple of it on every case
  (harness/verify.py). A model without a float64 forward (an op without float64 support, or
  a cast back to fp32 inside) has no such bound, and its note says so.
* Tolerance: KernelBench's own check (``torch.allclose`` with rtol = atol = 1e-2) unless the file
  sets ``RTOL`` and ``ATOL``; where a trivial output would pass a case under it (softmax rows of
  16k columns are all below 1e-2), the harness tightens that case.
* Size: a file whose inputs and parameters do not fit in ``MAX_BYTES`` is scaled down, by
  halving its module-level integer sizes until they fit; the problem says so in its note.
"""

from __future__ import annotations

import copy
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from swarmfactory.problems.spec import Arg, Problem, Tolerance, gen_values, with_specials

KERNELBENCH_TOL = 1e-2
MAX_BYTES = 256 << 20          # inputs + parameters + outputs, fp32
KB_DISTS = ("normal", "signed", "large", "tiny", "special")


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


def _footprint(module) -> int:
    """Bytes of fp32 inputs, parameters and outputs, computed on the meta device (no memory)."""
    import torch

    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        example = list(module.get_inputs())
        outs = _as_tuple(model(*example))
    tensors = [*example, *model.parameters(), *model.buffers(), *outs]
    return sum(t.numel() * 4 for t in tensors if isinstance(t, torch.Tensor))


def scale_to_fit(module, limit: int = MAX_BYTES) -> str:
    """Halve the module's integer sizes (largest first) until the problem fits in ``limit``
    bytes; returns what was changed, or "" if nothing had to be."""
    try:
        size = _footprint(module)
    except Exception:
        return ""  # sizes unknown without running: load as is
    if size <= limit:
        return ""
    original = {k: v for k, v in vars(module).items()
                if isinstance(v, int) and not isinstance(v, bool) and v > 1 and not k.startswith("_")}
    for _ in range(200):
        if size <= limit:
            break
        shrunk = False
        for name in sorted(original, key=lambda k: -getattr(module, k)):
            value = getattr(module, name)
            if value <= 1:
                continue
            setattr(module, name, max(1, value // 2))
            try:
                smaller = _footprint(module)
            except Exception:
                smaller = size
            if smaller < size:
                size, shrunk = smaller, True
                break
            setattr(module, name, value)
        if not shrunk:
            break
    changed = [f"{k} {v} -> {getattr(module, k)}" for k, v in original.items() if getattr(module, k) != v]
    if size > limit:
        raise _error(f"the problem needs {size / 2**20:.0f} MiB even after scaling its sizes down "
                     f"({', '.join(changed) or 'no module-level integer sizes found'}); "
                     f"the limit is {limit / 2**20:.0f} MiB")
    return (f"scaled down to fit {limit >> 20} MiB: {', '.join(changed)} "
            f"({size / 2**20:.0f} MiB of inputs, parameters and outputs)")


def from_kernelbench_module(module, path) -> Problem:
    """The problem a KernelBench module describes; ``ProblemError`` if it cannot be one."""
    path = Path(path)
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise _error(f"{path}: a KernelBench file needs Model, get_inputs and "
                         f"get_init_inputs; {attr} is missing")
    note = scale_to_fit(module)
    model, example, params, outs = _run_model(module, path)
    n_in, n_par = len(example), len(params)
    param_names = list(params)
    fixed_params = {f"p{i}": params[n].detach().contiguous().numpy().copy()
                    for i, n in enumerate(param_names)}
    shape = {f"in{i}_d{j}": int(s) for i, t in enumerate(example) for j, s in enumerate(t.shape)}
    if not shape:  # 0-d inputs only: the shape still needs a key
        shape = {"scalar": 1}
    out_shapes = {f"out{i}": tuple(int(s) for s in o.shape) for i, o in enumerate(outs)}
    make_inputs = _input_maker(module, [tuple(t.shape) for t in example], fixed_params)
    ref_model, ref_dtype, in_float64 = _float64_model(model, example)
    reference, fp32_torch, baseline_eager = _model_calls(model, ref_model, ref_dtype, n_in, param_names)
    doc = (module.__doc__ or module.Model.__doc__ or "").strip().splitlines()
    if not in_float64:
        note = "; ".join(filter(None, [note, "the model has no float64 forward (its reference is computed in "
                                             "fp32): no bound from torch's own fp32 error"]))
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
        eager=baseline_eager,
        fp32_torch=fp32_torch,
        torch_error_multiple=None if in_float64 else 0.0,
        tolerance=_tolerance(module),
        workload=(shape,),
        edge_shapes=(shape,),
        dists=KB_DISTS,
        seeds_per_case=4,
        source_path=str(path.resolve()),
        note=note,
    )


def _run_model(module, path: Path) -> tuple[Any, list, dict, tuple]:
    """(model, example inputs, parameters and buffers by name, outputs): the module's model built
    and run once under seed 0, every tensor fp32; ``ProblemError`` otherwise."""
    import torch

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
    return model, example, params, outs


def _float64_model(model, example: list) -> tuple[Any, Any, bool]:
    """(reference model, its dtype, whether its outputs are float64): the model in float64 where
    it runs so, else the fp32 model itself."""
    import torch

    ref_model, ref_dtype, in_float64 = model, torch.float32, False
    try:
        m64 = copy.deepcopy(model).double()
        with torch.no_grad():
            outs64 = _as_tuple(m64(*[t.double() for t in example]))
        ref_model, ref_dtype = m64, torch.float64
        # a forward that casts back to fp32 inside has no float64 answer to measure torch's by
        in_float64 = all(getattr(o, "dtype", None) == torch.float64 for o in outs64)
    except Exception:  # an op without float64 support: fp32 it is
        pass
    return ref_model, ref_dtype, in_float64


def _input_maker(module, in_shapes: list[tuple], fixed_params: dict[str, np.ndarray]):
    """``make_inputs`` of the problem: the file's own ``get_inputs()`` under the case's seed, or
    values of another distribution at its shapes, and the parameters drawn around their initial
    values."""
    import torch

    def make_inputs(_shape, rng: np.random.Generator, dist: str) -> dict[str, Any]:
        if dist not in KB_DISTS:
            raise ValueError(f"unknown distribution {dist!r} for a KernelBench problem; known: {KB_DISTS}")
        with torch.random.fork_rng():
            torch.manual_seed(int(rng.integers(0, 2**62)))
            tensors = list(module.get_inputs())
        got = [tuple(t.shape) for t in tensors]
        if got != in_shapes:
            raise ValueError(f"get_inputs() changed shape: {got} != {in_shapes}")
        arrays = [t.detach().contiguous().numpy().copy() for t in tensors]
        if dist != "normal":  # beyond the file's own distribution, at its shapes
            base = "normal" if dist in ("signed", "special") else dist
            arrays = [gen_values(rng, a.shape, base) for a in arrays]
            if dist == "special":
                arrays = [with_specials(rng, a) for a in arrays]
        params_now = {k: _perturb(v, rng) for k, v in fixed_params.items()}
        return {**{f"in{i}": a for i, a in enumerate(arrays)}, **params_now}

    return make_inputs


def _model_calls(model, ref_model, ref_dtype, n_in: int, param_names: list[str]):
    """(reference, fp32_torch, baseline_eager) of the problem: the model run on a case's inputs
    and parameters (``in<i>``, ``p<i>``)."""
    import torch
    from torch.func import functional_call

    lock = threading.Lock()  # functional_call swaps the module's tensors while it runs

    def _call(m, t, dtype):
        args = [t[f"in{i}"].to(dtype) for i in range(n_in)]
        state = {n: t[f"p{i}"].to(dtype) for i, n in enumerate(param_names)}
        with lock, torch.no_grad():
            return _as_tuple(functional_call(m, state, tuple(args)))

    def reference(t):
        return {f"out{i}": o for i, o in enumerate(_call(ref_model, t, ref_dtype))}

    def fp32_torch(t):
        """The fp32 model on the case's inputs and parameters: torch's own answer."""
        return lambda: _call(model, t, torch.float32)

    def baseline_eager(t):
        """The fp32 model with the case's parameters loaded (outside the timed call)."""
        args = [t[f"in{i}"] for i in range(n_in)]
        m = copy.deepcopy(model)
        with torch.no_grad():
            for i, n in enumerate(param_names):
                _tensor_at(m, n).copy_(t[f"p{i}"])

        def fn():
            with torch.no_grad():
                return m(*args)

        return fn

    return reference, fp32_torch, baseline_eager


def _tolerance(module) -> Tolerance:
    """KernelBench's own check, unless the file sets ``RTOL`` and ``ATOL``."""
    rtol = float(getattr(module, "RTOL", KERNELBENCH_TOL))
    atol = float(getattr(module, "ATOL", KERNELBENCH_TOL))
    reason = ("set by the file (RTOL, ATOL)" if hasattr(module, "RTOL")
              else "KernelBench's own correctness check (torch.allclose, rtol = atol = 1e-2); "
                   "the op is arbitrary, so no tighter bound can be derived")
    return Tolerance(rtol, atol, reason)


def _perturb(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A parameter drawn around its initial value: its spread, or half its magnitude (at least
    0.5) where it is constant, so every parameter matters in every case."""
    spread = float(p.std()) if p.size > 1 else 0.0
    if not spread > 0:
        spread = 0.5 * max(float(np.abs(p).mean()) if p.size else 0.0, 1.0)
    return (p + rng.standard_normal(p.shape) * spread).astype(np.float32)


def _tensor_at(model, dotted: str):
    obj = model
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
