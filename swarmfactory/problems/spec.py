"""The problem contract: what a kernel must compute, on which inputs, how well, and how fast.

A problem is one Python module (or file) that defines ``PROBLEM = Problem(...)``. Everything the
harness needs is declared here, so adding an op is adding one file. Contract:

* ``args`` is the exact C ABI, in order. Pointers are row-major and contiguous.
* ``make_inputs(shape, rng, dist)`` returns numpy arrays / Python scalars for every ``in`` and
  scalar arg; it must be deterministic in ``rng`` and valid for every shape in ``edge_shapes``
  and ``workload``.
* ``reference(inputs)`` takes torch tensors (float64 where precision matters) and returns the
  outputs as torch tensors; it is the semantics and must be well defined on every input
  ``make_inputs`` can produce.
* ``baselines`` map a name to ``setup(inputs) -> fn``: ``setup`` runs once, outside the timed
  region (weight packing and the like); ``fn()`` computes the op the fastest way a user has today
  in PyTorch. ``fn`` may allocate its result; it returns a tensor, or a tuple of tensors in
  the order of the ``out`` args.
* ``template`` is Jinja2 C source; rendered with ``knob_defaults`` it is a correct kernel. Its
  knobs make the problem a search space (space.py ``SearchSpace``: ``knobs``, ``knob_defaults``,
  ``knob_aspects``, ``valid_knobs``, ``render``) that the knob agents search.
* ``backend`` other than ``"c"`` (``triton``, ``cuda``, ``ptx``): the same args reach the kernel
  as torch tensors on the device and Python scalars (docs/gpu.md), so a candidate may be written
  in any of the three (``backends``; ``backend`` is what the template and the agents write); a
  Triton template renders ``{{ signature }}`` as the launcher's ``def`` line; ``interpret_shapes``
  are the small shapes verified under Triton's interpreter where there is no GPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

ArgKind = Literal["in", "out", "int", "float"]
Shape = Mapping[str, int]

MODEL_CASES_PER_DRAW = 1  # full-size model shapes added to each evaluation (Problem.model_cases)

NP_DTYPES = {"float32": np.float32, "uint8": np.uint8, "int8": np.int8, "int16": np.int16, "int64": np.int64}
C_TYPES = {"float32": "float", "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int64": "int64_t"}
GPU_BACKENDS = ("triton", "cuda", "ptx")  # one ABI: Problem.backends


@dataclass(frozen=True)
class Arg:
    """One argument of the C ABI: an input pointer, an output pointer or a scalar."""

    name: str
    kind: ArgKind
    dtype: str = "float32"
    # elements per unit when timed inputs are mutated between calls (one unit of every input is
    # replaced by a valid unit from another draw): 1 for plain arrays; a whole quantised block
    # (e.g. 20 bytes of Q4_1) where a single element alone would not be a valid value
    block: int = 1

    def c_decl(self) -> str:
        if self.kind == "in":
            return f"const {C_TYPES[self.dtype]} *{self.name}"
        if self.kind == "out":
            return f"{C_TYPES[self.dtype]} *{self.name}"
        return f"{'int64_t' if self.kind == 'int' else 'float'} {self.name}"


@dataclass(frozen=True)
class Tolerance:
    """Allowed deviation from the reference, with the reason it is this loose and no looser."""

    rtol: float
    atol: float
    reason: str


@dataclass(frozen=True)
class Case:
    """One validation input: a shape, a seed and a value distribution."""

    shape: Mapping[str, int]
    seed: int
    dist: str = "normal"
    origin: str = "seed"  # "seed" (bundled), "workload", or the agent that found it
    # scalar arguments fixed by the case (e.g. {"eps": 1e-3}); the others come from make_inputs
    params: Mapping[str, float] = field(default_factory=dict)

    def key(self) -> str:
        d = {"shape": dict(self.shape), "seed": self.seed, "dist": self.dist}
        if self.params:
            d["params"] = {k: float(v) for k, v in self.params.items()}
        return json.dumps(d, sort_keys=True)


@dataclass(frozen=True)
class Roofline:
    bytes: float
    flops: float


@dataclass(frozen=True)
class Problem:
    name: str
    version: int
    description: str
    args: tuple[Arg, ...]
    make_inputs: Callable[[Shape, np.random.Generator, str], dict[str, Any]]
    output_shapes: Callable[[Shape], dict[str, tuple[int, ...]]]
    reference: Callable[[dict[str, Any]], dict[str, Any]]
    baselines: Mapping[str, Callable[[dict[str, Any]], Callable[[], Any]]]
    tolerance: Tolerance
    workload: tuple[Mapping[str, int], ...]
    edge_shapes: tuple[Mapping[str, int], ...]
    dists: tuple[str, ...] = ("normal", "uniform", "large", "tiny")
    roofline: Callable[[Shape], Roofline] | None = None
    template: str | None = None
    knobs: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    knob_defaults: Mapping[str, Any] = field(default_factory=dict)
    knob_aspects: Mapping[str, str] = field(default_factory=dict)
    knob_constraint: Callable[[Mapping[str, Any]], bool] | None = None
    seeds_per_case: int = 2
    # The plain fp32 PyTorch composition a user would write by hand (setup -> fn, like a
    # baseline); timed for the "vs eager reference" column. None: time ``reference`` itself.
    eager: Callable[[dict[str, Any]], Callable[[], Any]] | None = None
    # Shapes the ABI admits beyond "every dim >= 1" (e.g. k % 32 == 0); new cases must satisfy it.
    shape_constraint: Callable[[Shape], bool] | None = None
    # Large shapes verified under a few distributions only (normal + special), to keep eval
    # affordable: rows of 16k-64k columns, 4x the largest workload, and the like.
    stress_shapes: tuple[Mapping[str, int], ...] = ()
    # How the workload shapes weigh in the `weighted` objective (the share of the engine's time
    # each takes in the model the problem comes from), in the order of ``workload``; empty:
    # equal weights. A verdict is still never `faster` while a shape is significantly slower.
    workload_weights: tuple[float, ...] = ()
    # Per-output absolute tolerance for one case, where a fixed atol cannot fit every magnitude
    # (atol_for(expected, inputs) -> {output: float or array}); None: tolerance.atol.
    atol_for: Callable[[dict, dict], dict] | None = None
    # Scalar arguments a case (or the adversary) may set, with their realistic range (lo, hi).
    param_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    source_path: str = ""
    note: str = ""  # e.g. how a KernelBench file was scaled down to fit
    # The op family (norm, gated_activation, softmax, rope, quantized_matvec, attention...): what
    # lessons and the cost model carry between problems; not part of the spec hash. "" unknown.
    family: str = ""
    # What a candidate is written in: "c" (the C ABI above), or a GPU backend ("triton", "cuda",
    # "ptx": the same args, as torch tensors on the device; see harness/gpu.py).
    backend: str = "c"
    # GPU problems: the small shapes verified under Triton's interpreter on a machine without a
    # GPU (the interpreter runs kernels in numpy, ~1e4x slower than a device).
    interpret_shapes: tuple[Mapping[str, int], ...] = ()
    # GPU problems: the model config the workload's shapes come from (e.g. "Llama-3-8B").
    shapes_from: str = ""
    # Torch's own fp32 answer (setup -> fn, like a baseline; fp32 inputs): its error against the
    # float64 reference bounds a candidate's on every case (harness/verify.py: at most
    # ``torch_error_multiple`` times it). None: the first baseline whose name does not end in
    # "_bf16", else ``eager``. Set it where that is not the op computed in fp32 (a quantised
    # op: dequantise, then multiply in fp32). Not part of the spec hash.
    fp32_torch: Callable[[dict[str, Any]], Callable[[], Any]] | None = None
    # The most threads a baseline is timed on (None: every count up to the CPUs measured on). A
    # kernel its user calls once per thread, on that thread's share (the engine's block kernels,
    # ``<type>_engine_matmul``), is compared one thread against one thread: a baseline on two
    # threads against a candidate that will run on one of two is not the comparison it will meet.
    baseline_threads: int | None = None
    # K of that bound; None: the harness default (verify.TORCH_ERROR_MULTIPLE); 0: no such bound
    # (a reference that is not computed in float64 has no error to measure torch's against).
    torch_error_multiple: float | None = None
    # The terms of the longest fp32 sum behind one output (inputs -> n), where the problem lets a
    # kernel add them in an order less accurate than torch's (its tolerance says so): that bound
    # then allows verify.REORDER_ULPS x sqrt(n) fp32 half-ulps more. None: no such allowance.
    fp32_sum_terms: Callable[[dict[str, Any]], int] | None = None
    # Shapes of real open models (problems/models.py). ``model_shapes``: a fixed, cheap sample
    # that is part of ``seed_cases`` (every catalogue value of every dimension at least once, the
    # other dimensions small; every batch 1..64); ``model_draws``: (label, shape) full-size real
    # combinations, drawn one per evaluation (``model_cases``), so a run covers them over time.
    model_shapes: tuple[Mapping[str, int], ...] = ()
    model_draws: tuple[tuple[str, Mapping[str, int]], ...] = ()
    # The kernel's function name (the C function, the GPU launcher or entry) where it is not the
    # problem's name: problems derived from a model (``problems/derive.py``) are named
    # ``<family problem>.<model>`` and keep the family problem's function, so one source serves
    # every model's variant of an op. "" : ``name``.
    symbol: str = ""

    @property
    def entry(self) -> str:
        """The kernel's function name: ``symbol``, else ``name``."""
        return self.symbol or self.name

    @property
    def backends(self) -> tuple[str, ...]:
        """What a candidate may be written in, ``backend`` (what the agents write) first. The GPU
        ABI is one for Triton, CUDA C++ and PTX (the args in order: tensors on the device, ints,
        floats; docs/gpu.md), so a GPU problem takes all three; a C problem takes C."""
        if self.backend in GPU_BACKENDS:
            return (self.backend, *(b for b in GPU_BACKENDS if b != self.backend))
        return (self.backend,)

    def backend_of(self, candidate) -> str:
        """What a recorded candidate (a store row, or a mapping with its ``backend``) is written
        in: its ``backend`` where this problem takes it (CUDA or PTX for a Triton problem, from
        `eval`), else ``backend``."""
        backend = candidate.get("backend") if isinstance(candidate, Mapping) else candidate.backend
        return backend if backend in self.backends else self.backend

    @property
    def c_signature(self) -> str:
        return f"void {self.entry}({', '.join(a.c_decl() for a in self.args)})"

    @property
    def py_signature(self) -> str:
        """The launcher a GPU candidate defines: the same args, in order, as torch tensors (in and
        out, on the device) and Python scalars."""
        return f"def {self.entry}({', '.join(a.name for a in self.args)})"

    @property
    def c_prototype(self) -> str:
        """The declaration every candidate is compiled against (``restrict`` is allowed on top)."""
        return self.c_signature

    @property
    def inputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.kind != "out")

    @property
    def outputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.kind == "out")

    def shape_label(self, shape: Shape) -> str:
        return "x".join(f"{k}={v}" for k, v in shape.items())

    def spec_hash(self) -> str:
        """Identity of the problem's semantics and yardstick: changes when the ABI, shapes,
        tolerance, template or the set of baselines change."""
        blob = json.dumps({
            "name": self.name, "version": self.version, "sig": self.c_signature,
            "workload": [dict(s) for s in self.workload], "edge": [dict(s) for s in self.edge_shapes],
            # only where set, so every problem without weights keeps its hash
            **({"weights": list(self.workload_weights)} if self.workload_weights else {}),
            "stress": [dict(s) for s in self.stress_shapes], "params": dict(self.param_ranges),
            "dists": self.dists, "tol": dataclasses.asdict(self.tolerance),
            "template": self.template, "knobs": {k: list(v) for k, v in self.knobs.items()},
            "baselines": sorted(self.baselines),  # speedups are relative to them
            **({"baseline_threads": self.baseline_threads} if self.baseline_threads else {}),  # only where set
            # only where set, so every C problem keeps the hash its evidence was recorded under
            **({"backend": self.backend, "interpret": [dict(s) for s in self.interpret_shapes]}
               if self.backend != "c" else {}),
        }, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def seed_cases(self) -> list[Case]:
        """The bundled validation set: every edge and workload shape under every distribution,
        the stress shapes under the first and the special-valued distributions. Scalar
        arguments are drawn per case by ``make_inputs`` (from the case's seed)."""
        cases: list[Case] = []
        for i, shape in enumerate(self.edge_shapes):
            for j, dist in enumerate(self.dists):
                for s in range(self.seeds_per_case if dist == "normal" else 1):
                    cases.append(Case(dict(shape), seed=1000 * i + 10 * j + s, dist=dist))
        stress_dists = [self.dists[0]] + [d for d in self.dists[1:] if d == "special"]
        for i, shape in enumerate(self.stress_shapes):
            for j, dist in enumerate(stress_dists):
                cases.append(Case(dict(shape), seed=500_000 + 1000 * i + j, dist=dist))
        cases += self.residue_sweep()
        # real models' dimensions, one case each under the first distribution (special values
        # would make many of them all-NaN rows that check nothing else; the drawn model cases
        # go through every distribution)
        for i, shape in enumerate(self.model_shapes):
            cases.append(Case(dict(shape), seed=600_000 + i, dist=self.dists[0], origin="model"))
        for i, shape in enumerate(self.workload):
            cases.append(Case(dict(shape), seed=777 + i, dist="normal", origin="workload"))
            # every distribution at the exact timed shapes too: a fast path taken only there
            # must be as right on special values as any other
            for j, dist in enumerate(self.dists[1:]):
                cases.append(Case(dict(shape), seed=880_000 + 100 * i + j, dist=dist, origin="workload"))
        return cases

    def residue_sweep(self, width: int = 16) -> list[Case]:
        """Each dimension of the smallest workload shape alone through ``width`` consecutive sizes
        (in units of the step the dimension always comes in), so every remainder modulo the
        widest vector (16 fp32 lanes) meets every loop's tail."""
        import math

        base = min(self.workload, key=lambda sh: math.prod(sh.values()))
        seen = (*self.workload, *self.edge_shapes, *self.stress_shapes)
        cases = []
        for i, dim in enumerate(base):
            step = math.gcd(*(int(sh[dim]) for sh in seen))
            for r in range(width, 2 * width):
                shape = {**dict(base), dim: r * step}
                if self.valid_shape(shape):
                    cases.append(Case(shape, seed=900_000 + 100 * i + r, dist=self.dists[0]))
        return cases

    def model_cases(self, draw: int, k: int = MODEL_CASES_PER_DRAW) -> list[Case]:
        """Draw number ``draw`` of the full-size model shapes: the next ``k`` of ``model_draws``
        (draw d takes entries d*k .. d*k+k-1, wrapping), so successive draws cover all of them,
        then again under the next distribution. Not part of the validation set's version: a
        caller adds them to the cases of one evaluation and records which it checked."""
        pool = self.model_draws
        cases = []
        for i in range(min(k, len(pool))):
            j = draw * k + i
            cycle, at = divmod(j, len(pool))
            label, shape = pool[at]
            cases.append(Case(dict(shape), seed=3_000_000 + j, dist=self.dists[cycle % len(self.dists)],
                              origin=f"model:{label}"))
        return cases

    def model_cycle(self, k: int = MODEL_CASES_PER_DRAW) -> int:
        """Draws until ``model_cases`` has drawn every entry of ``model_draws`` once."""
        return -(-len(self.model_draws) // k)

    def case_inputs(self, case: Case) -> dict[str, Any]:
        """The inputs of ``case``: the generator's draw, with the case's fixed scalars laid over."""
        inputs = self.make_inputs(dict(case.shape), np.random.default_rng(case.seed), case.dist)
        for k, v in case.params.items():
            kind = next((a.kind for a in self.args if a.name == k), None)
            if kind == "float":
                inputs[k] = float(np.float32(v))
            elif kind == "int":
                inputs[k] = int(v)
        return inputs

    def render(self, knobs: Mapping[str, Any] | None = None) -> str:
        """Render the template with ``knobs`` laid over the defaults."""
        if self.template is None:
            raise ValueError(f"problem {self.name!r} has no template")
        import jinja2

        values = {**self.knob_defaults, **(knobs or {})}
        unknown = set(values) - set(self.knobs)
        if unknown:
            raise ValueError(f"unknown knob(s) for {self.name}: {', '.join(sorted(unknown))}")
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True,
                                 lstrip_blocks=True, keep_trailing_newline=True)
        signature = self.c_signature if self.backend == "c" else self.py_signature
        return env.from_string(self.template).render(**values, signature=signature)

    def valid_shape(self, shape: Shape) -> bool:
        if set(shape) != set(self.workload[0]) or any(int(v) < 1 for v in shape.values()):
            return False
        return self.shape_constraint is None or bool(self.shape_constraint(shape))

    def knob_space_size(self) -> int:
        n = 1
        for v in self.knobs.values():
            n *= len(v)
        return n

    def valid_knobs(self, knobs: Mapping[str, Any]) -> bool:
        return self.knob_constraint is None or bool(self.knob_constraint(knobs))


def gen_values(rng: np.random.Generator, shape: tuple[int, ...], dist: str) -> np.ndarray:
    """fp32 values from a named distribution; the special ones exercise edge arithmetic."""
    if dist == "normal":
        a = rng.standard_normal(shape)
    elif dist == "uniform":
        a = rng.uniform(-1.0, 1.0, shape)
    elif dist == "large":
        a = rng.standard_normal(shape) * 1e4
    elif dist == "tiny":
        a = rng.standard_normal(shape) * 1e-4
    elif dist == "constant":
        a = np.full(shape, rng.uniform(-2, 2))
    elif dist == "alternating":
        a = np.ones(shape) * rng.uniform(0.5, 2.0)
        a.reshape(-1)[1::2] *= -1
    elif dist == "positive":
        a = np.abs(rng.standard_normal(shape)) + 0.1
    elif dist == "special":
        return with_specials(rng, gen_values(rng, shape, "normal"))
    else:
        raise ValueError(f"unknown distribution {dist!r}")
    return np.ascontiguousarray(a, dtype=np.float32)


SPECIALS = ("nan", "negzero", "denormal")


def with_specials(rng: np.random.Generator, a: np.ndarray, kinds: tuple[str, ...] = SPECIALS,
                  fraction: float = 0.01) -> np.ndarray:
    """``a`` (fp32) with special values at random positions: NaN, -0.0, denormals, and +-inf
    or -inf where a problem asks for them. At least one of each where ``a`` has room."""
    a = np.array(a, dtype=np.float32, copy=True)
    flat = a.reshape(-1)
    values = {"nan": np.float32(np.nan), "negzero": np.float32(-0.0), "inf": np.float32(np.inf),
              "neginf": np.float32(-np.inf)}
    n = max(1, int(flat.size * fraction))
    for kind in kinds:
        idx = rng.integers(0, flat.size, n)
        if kind == "denormal":
            flat[idx] = (rng.uniform(1e-45, 1e-38, n) * rng.choice([-1.0, 1.0], n)).astype(np.float32)
        else:
            flat[idx] = values[kind]
    return a


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """A scalar parameter drawn over its realistic range, as fp32 (what the C ABI receives)."""
    return float(np.float32(np.exp(rng.uniform(np.log(lo), np.log(hi)))))


def knob_key(knobs: dict[str, Any] | None) -> str:
    """One spelling of a knob setting: what dedupes proposals and keys the evidence per setting."""
    return "" if knobs is None else repr(sorted(knobs.items()))


# baseline name suffixes of lower-precision competitors: bf16 activations, 8-bit activations, and
# approximate math (the engine's own element ops: a polynomial exp clamped at +-88, one-pass fp32
# sums; engine/native/element_ops.py), right on the workload but not to fp32 on extreme inputs
LOWER_PRECISION = ("_bf16", "_int8", "_approx")


def lower_precision(baseline: str) -> bool:
    """Whether the baseline named so is a lower-precision competitor (bf16 activations, 8-bit
    activations, approximate math): timed as a yardstick, never the fp32 bound on a candidate's
    error, and checked to its own precision."""
    return baseline.endswith(LOWER_PRECISION)


def check_problem(problem: Problem) -> None:
    """Reject a problem definition that cannot judge a kernel (MEASURING.md rule 2)."""
    import torch

    w = problem.workload_weights
    if w and (len(w) != len(problem.workload) or not all(isinstance(x, (int, float)) and x > 0 for x in w)):
        raise ValueError(f"{problem.name}: workload_weights must be {len(problem.workload)} positive numbers, "
                         f"one per workload shape in order (got {list(w)!r})")
    if problem.template is not None:
        missing = set(problem.knob_defaults) ^ set(problem.knobs)
        if missing:
            raise ValueError(f"{problem.name}: knob defaults and knobs differ on {sorted(missing)}")
        for k, v in problem.knob_defaults.items():
            if v not in problem.knobs[k]:
                raise ValueError(f"{problem.name}: default {k}={v!r} is not among its values")
    # the shape that matters (an edge shape may be degenerate, 1x1); a GPU problem's workload
    # can be too large for a float64 reference on a CPU: its largest interpreter shape instead
    import math

    shape = (max(problem.interpret_shapes, key=lambda s: math.prod(s.values())) if problem.interpret_shapes
             else problem.workload[0])
    outs = []
    for seed in (1, 2):
        inputs = problem.make_inputs(shape, np.random.default_rng(seed), problem.dists[0])
        missing = {a.name for a in problem.inputs} - set(inputs)
        if missing:
            raise ValueError(f"{problem.name}: make_inputs lacks {sorted(missing)}")
        ref = problem.reference(to_torch(inputs))
        outs.append({k: torch.as_tensor(v).double() for k, v in ref.items()})
    if all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0]):
        raise ValueError(f"{problem.name}: the reference output does not depend on its inputs")


def to_torch(inputs: Mapping[str, Any]) -> dict[str, Any]:
    import torch

    return {k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v
            for k, v in inputs.items()}
