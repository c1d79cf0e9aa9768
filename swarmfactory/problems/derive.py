"""The kernel problems a model's engine runs, derived from its GGUF file.

``derive(path)`` reads the file's metadata and tensor table (no weights are read) and walks one
engine step the way ``engine/models/decoder.py`` computes it, using the architecture's own hooks
(``qk_norm``, ``sandwich_norms``, ``activation_name``, ``layer_window``, ``layer_rope``,
``attention_scale``), so the ops, their shapes and their variants are the engine's, not a
catalogue's. Each op maps to a family problem of the bundled suite that computes it with the same
ABI:

| engine op | family problem | shape |
| --- | --- | --- |
| residual add + RMSNorm (input, pre-FFN, final) | ``add_rmsnorm`` | rows = tokens, cols = hidden |
| RMSNorm (first layer's input; Gemma's post-attention and post-FFN norms) | ``rmsnorm`` | rows = tokens, cols = hidden |
| q/k head norm (Qwen3, Gemma 3) | ``rmsnorm`` | rows = tokens x (heads + kv heads), cols = head_dim |
| linear layers, per GGUF block type of each part (fused q|k|v, o, gate|up, down, the output head) | ``<type>_engine_matmul`` where qlinear.c's kernels run the model, else ``<type>_matmul`` | n = rows of that type, k = in features, batch = tokens |
| SwiGLU / GELU-tanh gate | ``swiglu`` / ``geglu`` | n = tokens x ffn |
| RoPE of q and k | ``rope`` | tokens, heads + kv heads, head_dim (theta: a case parameter) |
| decode attention (GQA; a sliding window bounds its KV) | ``attention_decode`` | batch, heads, kv heads, seq, head_dim |

Ops no family computes yet (prefill attention, dense fp32/f16/bf16 weights, a block type without
a problem) are listed as ``uncovered`` with their share, so a user sees what the list leaves out.

**The call mix** is a serving scenario (``Scenario``: prompt and output lengths, the
concurrencies served): per request, one prefill call of ``prompt`` tokens (``prefill`` at most)
and ``output / c`` decode steps of ``c`` rows at each concurrency ``c``, with decode attention
over the average context (``prompt + output / 2``, a sliding window's at most). Call counts are
exact for that scenario; the time of one call is an estimate from the family's roofline at
nominal machine figures (``BANDWIDTH``, ``PEAK``), so a problem's ``workload_weights`` and its
``share`` are the engine's estimated time per shape. ``optimize`` measures them instead.

**A derived problem** is its family problem with the model's shapes as the workload (repeated
shapes merged, weights summed), named ``<family>.<model>`` (``q4_k_matmul.gemma-3-270m-q4_k_m``),
keeping the family's kernel function (``Problem.symbol``) so a family source runs on every
model's variant. The engine's own kernel is a baseline of every matmul family; the
``<type>_engine_matmul`` families take its numerics too (activations quantised to 8 bits per
block of 32, or of 256 with sums per 16 for the K-quants; exact integer block products), so their
champions can replace it (``EngineConfig.native_matmul``); decode.c's models (plain llama in
Q4_1/Q8_0, run on its own packed layout) keep the fp32-activation ``<type>_matmul`` families. A
derived ``<type>_matmul.MODEL`` whose engine-numerics twin was derived loads with the twin's
shapes and weights (the engine's per-op seam takes fp32-activation kernels). Its validation cases are the family's (edge, model and stress shapes) plus its
workload. A shape too large for a float64 reference (an output head of 262144 rows) keeps its
columns and is cut to ``MAX_ELEMENTS`` in rows; its weight stays the real call's.
``register`` writes a model's derived problems to the derived registry (``derived/<model>.json``
under the cache root) so ``load_problem`` finds them by name; a worker process rebuilds one from
its ``source_path`` (``derived:`` + its JSON), so nothing but the name and that line travels.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

SOURCE_PREFIX = "derived:"
BANDWIDTH = 20e9  # bytes/s: a nominal memory bandwidth for the time estimate of one call
PEAK = 100e9  # flop/s: a nominal fp32 throughput for the same
MAX_ELEMENTS = 1 << 22  # a derived matmul shape's weight elements at most (the largest bundled workload's)


class DeriveError(ValueError):
    """A file the derivation cannot read (the message names the file and what is wrong)."""


@dataclass(frozen=True)
class Scenario:
    """The serving load the call mix is counted for."""

    prompt: int = 128
    output: int = 128
    concurrency: tuple[int, ...] = (1, 16)
    prefill: int = 256  # tokens of one prefill call at most (the engine's chunk)

    def __post_init__(self):
        if self.prompt < 1 or self.output < 1 or self.prefill < 1 or not self.concurrency \
                or any(c < 1 for c in self.concurrency):
            raise ValueError(f"a scenario needs positive lengths and concurrencies, got {self}")


@dataclass
class DerivedProblem:
    """One family problem with a model's shapes: what ``problem()`` builds and ``register`` stores."""

    family: str
    model: str
    ops: list[str] = field(default_factory=list)  # the engine ops it stands for
    shapes: list[dict] = field(default_factory=list)  # workload, in first-seen order
    weights: list[float] = field(default_factory=list)  # estimated seconds per scenario request, per shape
    params: dict = field(default_factory=dict)  # the model's scalar arguments (eps, theta, scale)
    cut: list[str] = field(default_factory=list)  # shapes cut to fit, said in the problem's note
    share: float = 0.0  # of the whole step's estimated time

    @property
    def name(self) -> str:
        return f"{self.family}.{self.model}"

    def add(self, op: str, shape: dict, seconds: float, **params) -> None:
        if op not in self.ops:
            self.ops.append(op)
        for k, v in params.items():
            self.params.setdefault(k, set()).add(float(v))
        if shape in self.shapes:
            self.weights[self.shapes.index(shape)] += seconds
        else:
            self.shapes.append(shape)
            self.weights.append(seconds)

    def spec(self) -> dict:
        return {"family": self.family, "model": self.model, "ops": self.ops, "shapes": self.shapes,
                "weights": [float(w) for w in self.weights], "cut": self.cut,
                "params": {k: sorted(v) for k, v in self.params.items()}, "share": self.share}

    def problem(self):
        return problem_from_spec(self.spec())


@dataclass
class Derivation:
    path: str
    model: str  # the slug in every derived problem's name
    architecture: str
    scenario: Scenario
    problems: list[DerivedProblem]
    uncovered: list[dict]  # {"op", "why", "share"}
    total_seconds: float

    def to_json(self) -> dict:
        return {"path": self.path, "model": self.model, "architecture": self.architecture,
                "scenario": dataclasses.asdict(self.scenario),
                "problems": [{"name": p.name, **p.spec()} for p in self.problems],
                "uncovered": self.uncovered, "estimated_seconds_per_request": self.total_seconds}


def slug(text: str) -> str:
    """A model's name as it appears in problem names: lower case, [a-z0-9_-] only."""
    s = re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-")
    return re.sub(r"-{2,}", "-", s) or "model"


def _seconds(family: str, shape: dict) -> float:
    from swarmfactory.problems import load_problem

    roof = load_problem(family).roofline
    if roof is None:
        return 0.0
    r = roof(shape)
    return max(r.bytes / BANDWIDTH, r.flops / PEAK)


def _runs(parts) -> list[tuple[str, int]]:
    """(type name, rows) of consecutive parts of one type: one call of a per-type kernel each."""
    out: list[tuple[str, int]] = []
    for qtype, rows in parts:
        if out and out[-1][0] == qtype:
            out[-1] = (qtype, out[-1][1] + rows)
        else:
            out.append((qtype, rows))
    return out


def _view(hp):
    """The architecture's decoder class with ``hp`` only: its hooks (windows, rope sets, scale)
    without a weight loaded."""
    from swarmfactory.engine.models import model_class

    cls = model_class(hp.architecture)
    view = cls.__new__(cls)
    view.hp = hp
    view.n_heads, view.n_kv, view.hd = hp.n_heads, hp.n_kv_heads, hp.head_dim
    return cls, view


def derive(path: str | Path, scenario: Scenario | None = None, model: str | None = None) -> Derivation:
    """The derived problems (and the uncovered ops) of the GGUF at ``path`` under ``scenario``."""
    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.models.decoder import head_weight, op_weights
    from swarmfactory.engine.native_ops import ACTIVATIONS  # the engine's activation -> its problem
    from swarmfactory.engine.config import ENGINE_MATMUL_FAMILIES, NATIVE_FAMILIES
    from swarmfactory.engine.native import unsupported as decode_c_unsupported

    # GGUF block types with a family problem (``<type>_matmul``); dense types run on torch's sgemm
    matmul_families = {qtype: problem for problem, qtype in NATIVE_FAMILIES.items()}

    scenario = scenario or Scenario()
    path = Path(path)
    try:
        gg = load_gguf(path)
    except FileNotFoundError:
        raise DeriveError(f"model file not found: {path}") from None
    except (ValueError, KeyError, OSError) as e:
        raise DeriveError(f"{path.name}: {e}") from None
    hp = gg.hparams
    cls, view = _view(hp)
    if decode_c_unsupported(gg, cls.native_decoder) is not None:
        # qlinear.c's kernels run the model (the block step, qnative ops): the problems with its
        # numerics (8-bit activations), whose champions replace its kernel: on the packed copies
        # it runs a type on where this CPU's build packs it (qengine_packed.py), else on the stored blocks
        from swarmfactory.engine.native.qlinear import engine_matmul_families

        for qtype in dict.fromkeys(ENGINE_MATMUL_FAMILIES.values()):
            matmul_families[qtype] = engine_matmul_families(qtype)[0]
    name = slug(model or path.stem)
    H, KV, D, L = hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.n_layers
    problems: dict[str, DerivedProblem] = {}
    uncovered: dict[tuple, float] = defaultdict(float)

    def prob(family: str) -> DerivedProblem:
        if family not in problems:
            problems[family] = DerivedProblem(family, name)
        return problems[family]

    def tensor(n: str):
        t = gg.tensors.get(n)
        if t is None:
            raise DeriveError(f"{path.name}: tensor {n} is missing")
        return t

    def linear(op: str, names: list[str], tokens: int, calls: float):
        ts = [tensor(n) for n in names]
        for qtype, rows in _runs([(t.qtype.name, t.rows) for t in ts]):
            k = ts[0].cols
            family = matmul_families.get(qtype)
            if family is None:
                uncovered[(op, f"{qtype} weights: no family problem (they run on torch)")] += \
                    calls * max(rows * k * 4 / BANDWIDTH, 2 * rows * k * tokens / PEAK)
                continue
            n_shape = rows
            p = prob(family)
            if rows * k > MAX_ELEMENTS:
                n_shape = max(64, MAX_ELEMENTS // k // 64 * 64)
                note = f"{op}: {rows} rows cut to {n_shape} (weight of the real call kept)"
                if note not in p.cut:
                    p.cut.append(note)
            real = {"n": rows, "k": k, "batch": tokens}
            p.add(op, {"n": n_shape, "k": k, "batch": tokens}, calls * _seconds(family, real))

    # the calls of one scenario request: (tokens per call, calls, decode context or None)
    calls: list[tuple[int, float, int | None]] = []
    chunk = min(scenario.prompt, scenario.prefill)
    calls.append((chunk, scenario.prompt / chunk, None))
    ctx = scenario.prompt + scenario.output // 2
    for c in scenario.concurrency:  # c requests share each decode step
        calls.append((c, scenario.output / c, ctx))
    eps = hp.norm_eps
    act = ACTIVATIONS.get(cls.activation_name)
    ropes = view.rope_sets(gg)
    for tokens, n_calls, context in calls:
        for li in range(L):
            prob("rmsnorm" if li == 0 else "add_rmsnorm").add(
                "input norm" if li == 0 else "residual add + input norm", {"rows": tokens, "cols": hp.dim},
                n_calls * _seconds("rmsnorm" if li == 0 else "add_rmsnorm", {"rows": tokens, "cols": hp.dim}),
                eps=eps)
            linear("q|k|v", op_weights("qkv", li), tokens, n_calls)
            if cls.qk_norm:
                shape = {"rows": tokens * (H + KV), "cols": D}
                prob("rmsnorm").add("q/k head norm", shape, n_calls * _seconds("rmsnorm", shape), eps=eps)
            rope = ropes[view.layer_rope(li)]
            shape = {"tokens": tokens, "heads": H + KV, "head_dim": D}
            if rope.factors is not None or rope.linear != 1.0:
                uncovered[("rope", "scaled frequencies: the rope family computes unscaled ones")] += \
                    n_calls * _seconds("rope", shape)
            else:
                prob("rope").add("rope", shape, n_calls * _seconds("rope", shape), theta=rope.theta)
            window = view.layer_window(li)
            if context is None:
                uncovered[("prefill attention", "no family problem yet (it runs on torch)")] += \
                    n_calls * 4.0 * tokens * tokens * H * D / PEAK
            else:
                seq = min(context, window) if window else context
                shape = {"batch": tokens, "heads": H, "kv_heads": KV, "seq": seq, "head_dim": D}
                prob("attention_decode").add("decode attention" + (" (sliding window)" if window else ""), shape,
                                             n_calls * _seconds("attention_decode", shape),
                                             scale=view.attention_scale())
            linear("o", op_weights("o", li), tokens, n_calls)
            if cls.sandwich_norms:
                shape = {"rows": tokens, "cols": hp.dim}
                prob("rmsnorm").add("post-attention norm", shape, n_calls * _seconds("rmsnorm", shape), eps=eps)
            shape = {"rows": tokens, "cols": hp.dim}
            prob("add_rmsnorm").add("residual add + pre-FFN norm", shape, n_calls * _seconds("add_rmsnorm", shape),
                                    eps=eps)
            linear("gate|up", op_weights("gate_up", li), tokens, n_calls)
            shape = {"n": tokens * hp.ffn_dim}
            if act:
                prob(act).add(f"{cls.activation_name} gate", shape, n_calls * _seconds(act, shape))
            linear("down", op_weights("down", li), tokens, n_calls)
            if cls.sandwich_norms:
                shape = {"rows": tokens, "cols": hp.dim}
                prob("rmsnorm").add("post-FFN norm", shape, n_calls * _seconds("rmsnorm", shape), eps=eps)
        # the output head runs on the rows that sample: the last of a prefill, every decode row
        rows = 1 if context is None else tokens
        shape = {"rows": rows, "cols": hp.dim}
        prob("add_rmsnorm").add("residual add + final norm", shape, n_calls * _seconds("add_rmsnorm", shape),
                                eps=eps)
        linear("output head", [head_weight(gg.tensors)], rows, n_calls)

    step = [p for p in problems.values() if p.weights]
    total = sum(sum(p.weights) for p in step) + sum(uncovered.values())
    for p in step:
        p.share = sum(p.weights) / total if total else 0.0
    step.sort(key=lambda p: -p.share)
    unc = [{"op": op, "why": why, "share": s / total if total else 0.0} for (op, why), s in uncovered.items()]
    unc.sort(key=lambda u: -u["share"])
    return Derivation(str(path), name, hp.architecture, scenario, step, unc, total)


# --- derived problems as problems ----------------------------------------------------------------

def _widened(ranges: dict, params: dict) -> dict:
    """The family's case-parameter ranges, stretched to hold the model's own values."""
    out = dict(ranges)
    for k, vals in params.items():
        if k in out and vals:
            lo, hi = out[k]
            out[k] = (min(lo, min(vals)), max(hi, max(vals)))
    return out


def problem_from_spec(spec: dict):
    """The ``Problem`` a derived spec describes: its family with the model's workload."""
    from swarmfactory.problems import ProblemError, load_problem

    family = load_problem(spec["family"])
    shapes = tuple(dict(s) for s in spec["shapes"])
    bad = [s for s in shapes if family.shape_constraint and not family.shape_constraint(s)]
    if bad:
        raise ProblemError(f"{spec['family']}.{spec['model']}: shapes {bad} are outside {family.name}'s ABI")
    weights = tuple(max(float(w), 1e-12) for w in spec["weights"])
    params = {k: set(v) for k, v in spec.get("params", {}).items()}
    used = ", ".join(f"{k} {'/'.join(f'{x:g}' for x in sorted(v))}" for k, v in params.items())
    note = (f"derived from {spec['model']} ({', '.join(spec['ops'])})" + (f"; the model's {used}" if used else "")
            + "".join(f"; {c}" for c in spec.get("cut", [])))
    compact = json.dumps({k: spec[k] for k in ("family", "model", "ops", "shapes", "weights", "params", "cut")
                          if k in spec}, separators=(",", ":"), sort_keys=True)
    return dataclasses.replace(
        family, name=f"{spec['family']}.{spec['model']}", symbol=family.entry, workload=shapes,
        workload_weights=weights, param_ranges=_widened(dict(family.param_ranges), params),
        source_path=SOURCE_PREFIX + compact, note=note,
        description=f"{family.description} Shapes and weights of {spec['model']}'s engine.")


def registry_dir() -> Path:
    """``derived/`` under the cache directory (beside the calibrations and model digests)."""
    from swarmfactory.hardware import cache_dir

    return cache_dir() / "derived"


def register(derivation: Derivation) -> Path:
    """Write the derivation to the registry (atomically); returns the file."""
    d = registry_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{derivation.model}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(derivation.to_json(), indent=1))
    os.replace(tmp, path)
    return path


def registered(name: str) -> dict | None:
    """The registered spec of derived problem ``name`` (``<family>.<model>``), or None."""
    family, dot, model = name.partition(".")
    if not dot or slug(model) != model:
        return None
    f = registry_dir() / f"{model}.json"
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    problems = data.get("problems", [])
    spec = next((p for p in problems if p.get("family") == family), None)
    if spec is None:
        # another matmul family of a type whose problem was derived: the same shapes and weights
        # (the fp32-activation family, whose kernels the engine's per-op seam takes; the engine's
        # numerics on the stored blocks or on its packed copies, whichever this CPU's derivation did not pick)
        twin = next((p for s in _twins(family) for p in problems if p.get("family") == s), None)
        if twin is not None:
            spec = {**twin, "family": family, "name": f"{family}.{model}"}
    return spec


def _twins(family: str) -> tuple[str, ...]:
    """The matmul families of ``family``'s block type with the same shapes, best first."""
    for suffix in ("_engine_packed_matmul", "_engine_matmul", "_matmul"):
        if family.endswith(suffix):
            base = family[:-len(suffix)]
            return tuple(base + s for s in ("_engine_matmul", "_engine_packed_matmul") if base + s != family)
    return ()


def registered_models() -> dict[str, list[str]]:
    """Model slug -> the derived problem names registered for it."""
    out = {}
    d = registry_dir()
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            out[f.stem] = [p["name"] for p in json.loads(f.read_text()).get("problems", [])]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
