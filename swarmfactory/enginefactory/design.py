"""Engine designs: the engine factory's candidates.

A design is an ``EngineConfig`` (engine/config.py) with the model and the weights format fixed by
the tune run, and every other choice open: native decode batch and prompt tokens, dense-copy
thresholds, threads, KV dtype, prefill chunk, max batch, attention, the kernel factory's kernels.
Each knob is declared once, on the ``EngineConfig`` field it sets (``engine.config.Knob``);
``knob_table`` reads the declarations, and everything else is derived from it: ``KNOBS`` (the
values the agents choose from; ``None`` keeps the engine's own per-machine calibration for that
key), ``DEFAULT_KNOBS`` (the fields' defaults), the design space (space.py), the LLM's knob lines
(llm_designs.py) and the ``--set`` help (``set_help``). A design's identity is the content hash
of its config's non-default fields, so the evidence store dedupes designs the way it dedupes
kernels, and a field added to ``EngineConfig`` with a default leaves every recorded design's
identity as it was.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

from swarmfactory import kernelref
from swarmfactory.engine.config import ENGINE_MATMUL_FAMILIES, ConfigError, EngineConfig, Knob


@dataclass(frozen=True)
class KnobField:
    """A design knob as declared on its EngineConfig field: its name, the field it sets, the
    declaration, and its default (the knob value of the field's default)."""

    name: str
    field: str
    knob: Knob
    default: Any

    @property
    def values(self) -> tuple:
        return self.knob.values

    @property
    def meaning(self) -> str:
        return self.knob.meaning

    def to_field(self, value: Any) -> Any:
        """The field value a knob value sets (its preset, else the value itself)."""
        return next((f for v, f in self.knob.presets if v == value), value)


@functools.cache
def knob_table(config: type[EngineConfig] = EngineConfig) -> dict[str, KnobField]:
    """The design knobs ``config`` declares, by knob name, in field order (read-only). A field
    whose default is none of its knob's values is a declaration error, raised here."""
    out = {}
    for field, info in config.model_fields.items():
        knob = next((m for m in info.metadata if isinstance(m, Knob)), None)
        if knob is None:
            continue
        default = info.get_default(call_default_factory=True)
        value = next((v for v, f in knob.presets if f == default), default)
        if value not in knob.values:
            raise ValueError(f"{config.__name__}.{field}: its default {default!r} is none of its knob's values "
                             f"{list(knob.values)}")
        out[knob.name or field] = KnobField(knob.name or field, field, knob, value)
    return out


KNOBS: dict[str, tuple] = {name: kf.values for name, kf in knob_table().items()}
DEFAULT_KNOBS: dict[str, Any] = {name: kf.default for name, kf in knob_table().items()}


def set_help(config: type[EngineConfig] = EngineConfig) -> str:
    """The help of ``engine tune --set``: every knob with its values (``calibrated``: the engine's
    own measurement, ``None`` in the config)."""
    knobs = ", ".join(f"{name}={'|'.join('calibrated' if v is None else str(v) for v in kf.values)}"
                      for name, kf in knob_table(config).items())
    return f"KNOB=VALUE fixed by the deployment, e.g. threads=1 (repeatable; knobs: {knobs})"

# ops stored as Q4_1 in a q4_1 GGUF (the output head is Q8_0): where a q4_1_matmul champion plugs in
CHAMPION_OPS = ("qkv", "o", "gate_up", "down")
CHAMPION_PROBLEM = "q4_1_matmul"
MATVEC_PROBLEM = "q4_1_packed_matvec"  # the native decoder's hot loop (engine/native/matvec.py)
ENGINE_MATMUL = "<type>_engine_matmul"  # the block kernels' problems with the engine's numerics (native/qext.py)
# design knob -> the kernel-factory problem whose champion "champion" plugs in ("kernels" and
# "qmatmul": one per block type of the model's weights)
CHAMPION_KNOBS = {"kernels": CHAMPION_PROBLEM, "matvec": MATVEC_PROBLEM, "qmatmul": ENGINE_MATMUL}


class NoChampion(ConfigError):
    """A design asks for the kernel factory's champion where there is none."""


def op_types(model: str | None) -> dict[str, tuple[str, ...]]:
    """op -> the GGUF block types its weights are stored in, over every layer (the file's
    metadata only; cached per file)."""
    from swarmfactory.engine.gguf_loader import load_gguf, resolve_model_path
    from swarmfactory.engine.models.decoder import OP_TENSORS, head_weight, op_weights

    gg = load_gguf(resolve_model_path(model))
    out = {op: tuple(sorted({gg.tensor(n).qtype.name for i in range(gg.hparams.n_layers) for n in op_weights(op, i)}))
           for op in OP_TENSORS}
    return {**out, "lm_head": (gg.tensor(head_weight(gg.tensors)).qtype.name,)}


def matmul_problems(model: str | None) -> dict[str, list[str]]:
    """Block type of ``model``'s weights -> the kernel-factory problems whose champion may run its
    rows, best first: the problem derived from this model for it (``<type>_matmul.<model>``,
    problems/derive.py, where registered), then the type's own."""
    from swarmfactory.engine.gguf_loader import resolve_model_path
    from swarmfactory.engine.native_seam import FAMILIES
    from swarmfactory.problems.derive import registered, slug

    stem = slug(resolve_model_path(model).stem)
    types = {t for ts in op_types(model).values() for t in ts}
    return {qt.name: [p for p in (f"{family}.{stem}", family) if "." not in p or registered(p) is not None]
            for family, qt in FAMILIES.items() if qt.name in types}


def engine_matmul_problems(model: str | None) -> dict[str, list[str]]:
    """Block type of ``model``'s weights -> the ``<type>_engine_matmul`` problems whose champion may
    run its rows in the engine's block kernels (``native_matmul``), best first: the problem derived
    from this model, then the type's own. None where decode.c computes the model (it runs its own
    packed kernels, not qlinear.c's)."""
    from swarmfactory.engine.gguf_loader import load_gguf, resolve_model_path
    from swarmfactory.engine.native.qlinear import engine_matmul_families
    from swarmfactory.engine.models import model_class
    from swarmfactory.engine.native import unsupported
    from swarmfactory.problems.derive import registered, slug

    path = resolve_model_path(model)
    gg = load_gguf(path)
    if unsupported(gg, model_class(gg.hparams.architecture).native_decoder) is None:
        return {}
    stem = slug(path.stem)
    types = {t for ts in op_types(model).values() for t in ts}
    # a type's kernel on the engine's packed copies first, where this CPU's build packs it, then
    # on the stored blocks (engine_matmul_families)
    return {qt: [p for family in engine_matmul_families(qt) for p in (f"{family}.{stem}", family)
                 if "." not in p or registered(p) is not None]
            for qt in dict.fromkeys(ENGINE_MATMUL_FAMILIES.values()) if qt in types}


def engine_matmul(problem: str) -> bool:
    """A problem of an engine-numerics matmul family (stored or packed layout), derived or not:
    what ``qmatmul`` pins, not ``kernels``."""
    return problem.split(".", 1)[0] in ENGINE_MATMUL_FAMILIES


def champion_native_matmul(model: str | None, champions: dict[str, str]) -> str:
    """The ``native_matmul`` value ``qmatmul=champion`` sets: per block type, the first of
    ``engine_matmul_problems`` with a champion in ``champions``, joined; "" where none has one."""
    return kernelref.JOIN.join(spec for probs in engine_matmul_problems(model).values()
                               if (spec := next((f"champion:{p}@{champions[p]}" for p in probs if champions.get(p)),
                                                "")))


def element_problems(model: str | None) -> dict[str, list[str]]:
    """Non-linear op (``config.ELEMENT_OPS``) -> the kernel-factory problems whose champion may run
    it in ``model``'s engine, best first: the problem derived from this model, then the family
    (the activation the model's FFN uses: ``swiglu`` or ``geglu``)."""
    from swarmfactory.engine.gguf_loader import load_gguf, resolve_model_path
    from swarmfactory.engine.models import model_class
    from swarmfactory.engine.native_ops import families
    from swarmfactory.problems.derive import registered, slug

    path = resolve_model_path(model)
    stem = slug(path.stem)
    ops = families(model_class(load_gguf(path).hparams.architecture).activation_name)
    return {op: [p for p in (f"{f}.{stem}", f) if "." not in p or registered(p) is not None]
            for op, f in ops.items()}


def champion_kernels(model: str | None, champions: dict[str, str]) -> dict[str, str]:
    """op -> the kernel-factory champions ``kernels=champion`` runs it on: for each block type its
    weights are stored in, the first of ``matmul_problems`` with a champion in ``champions``,
    joined (``kernelref.JOIN``); for each non-linear op, the first of ``element_problems`` with
    one. Ops with no such champion keep the engine's own kernels."""
    by_type = {t: next((f"champion:{p}@{champions[p]}" for p in probs if champions.get(p)), None)
               for t, probs in matmul_problems(model).items()}
    out = {op: kernelref.JOIN.join(by_type[t] for t in types if by_type.get(t))
           for op, types in op_types(model).items()}
    out.update({op: next((f"champion:{p}@{champions[p]}" for p in probs if champions.get(p)), "")
                for op, probs in element_problems(model).items()})
    return {op: v for op, v in out.items() if v}


def kernel_problems(model: str | None) -> list[str]:
    """The kernel-factory problems whose champions a design of ``model`` may pin: the block-type
    matmuls of its weights' types (``matmul_problems``), the problems of its non-linear ops
    (``element_problems``) and the native decoder's matvec."""
    return [*(p for probs in matmul_problems(model).values() for p in probs),
            *(p for probs in element_problems(model).values() for p in probs), MATVEC_PROBLEM,
            *(p for probs in engine_matmul_problems(model).values() for p in probs)]


def pins(cfg: EngineConfig) -> dict[str, str]:
    """problem -> candidate id of every kernel-factory champion ``cfg`` pins (``champion:P@ID``)."""
    return kernelref.pins([*cfg.kernels.values(), cfg.native_matvec or "", cfg.native_matmul or ""])


# the knobs ``Design.describe`` spells out; any other is named where it is not at its default
DESCRIBED = ("native_decode", "native_prefill", "dense", "kv_dtype", "prefill_chunk", "max_batch", "threads",
             "attention", *CHAMPION_KNOBS)


@dataclass(frozen=True)
class Design:
    knobs: dict
    config: EngineConfig

    @property
    def key(self) -> str:
        return design_key(self.config)

    def describe(self) -> str:
        k = self.knobs
        nd = "calibrated" if k["native_decode"] is None else k["native_decode"]
        np_ = "calibrated" if k["native_prefill"] is None else k["native_prefill"]
        out = (f"native_decode={nd} native_prefill={np_} dense={k['dense']} kv={k['kv_dtype']} "
               f"chunk={k['prefill_chunk']} max_batch={k['max_batch']} threads={k['threads'] or 'all'}")
        if k.get("attention", "padded") != "padded":
            out += f" attention={k['attention']}"
        for knob, problem in CHAMPION_KNOBS.items():
            if k.get(knob, "builtin") == "builtin":
                continue
            if knob == "kernels":
                linear = {p: c for p, c in self.pins.items() if p != MATVEC_PROBLEM and not engine_matmul(p)}
                out += f" {knob}=" + (",".join(f"{p}@{c[:12]}" for p, c in sorted(linear.items())) or "?")
            elif knob == "qmatmul":
                mine = {p: c for p, c in self.pins.items() if engine_matmul(p)}
                out += f" {knob}=" + (",".join(f"{p}@{c[:12]}" for p, c in sorted(mine.items())) or "?")
            else:
                out += f" {knob}={problem}@{(self.pins.get(problem) or '?')[:12]}"
        for name, kf in knob_table(type(self.config)).items():  # knobs declared since, where set
            if name not in DESCRIBED and k.get(name, kf.default) != kf.default:
                out += f" {name}={k[name]}"
        return out

    @property
    def pins(self) -> dict[str, str]:
        """problem -> the kernel-factory candidate this design runs (pinned in its config)."""
        return pins(self.config)

    @property
    def champion(self) -> str | None:
        """The q4_1_matmul candidate this design's Q4_1 ops run, or None."""
        return self.pins.get(CHAMPION_PROBLEM)


def design_key(cfg: EngineConfig) -> str:
    """The design's identity: the hash of the fields of ``cfg`` that are not at their default, so a
    field added with a default never changes the key of a design recorded before it."""
    fields = type(cfg).model_fields
    data = {k: v for k, v in cfg.model_dump().items() if v != fields[k].get_default(call_default_factory=True)}
    blob = json.dumps(data, sort_keys=True)
    return hashlib.sha256(("engine-design\n" + blob).encode()).hexdigest()[:20]


def build(knobs: dict, base: EngineConfig, champions: dict[str, str] | str | None = None) -> Design:
    """The design for ``knobs`` on top of the run's base config (model, weights, max_seq_len).

    ``champions``: problem -> candidate id of this hardware's kernel-factory champions the engine
    may take (``champions.current``: none confirmed on a busy machine; a bare id
    is the ``q4_1_matmul`` one). ``kernels=champion`` runs the Q4_1 ops on the ``q4_1_matmul``
    champion (``champion:q4_1_matmul@ID`` per op, the native decoder off); ``matvec=champion``
    compiles the ``q4_1_packed_matvec`` champion into the native decoder
    (``native_matvec: champion:q4_1_packed_matvec@ID``; only where the native decoder runs). Pinned
    in the config, the id names the exact kernel, so a new champion makes a new design, verified
    afresh. Raises ConfigError for a combination the engine refuses (e.g. native decode with a
    bf16 KV cache) and NoChampion for a champion knob without a champion; agents treat either as
    a proposal to drop, never as an evaluation."""
    if isinstance(champions, str):
        champions = {CHAMPION_PROBLEM: champions}
    champions = champions or {}
    table = knob_table(type(base))
    unknown = set(knobs) - set(table)
    if unknown:
        raise ConfigError(f"unknown design knob(s): {', '.join(sorted(unknown))} (known: {', '.join(table)})")
    k = {**{name: kf.default for name, kf in table.items()}, **knobs}
    for name, val in k.items():
        if val not in table[name].values:
            raise ConfigError(f"design knob {name}={val!r} is not one of {list(table[name].values)}")
    data = base.model_dump()
    for name, kf in table.items():
        if name not in CHAMPION_KNOBS:  # pinned below, by candidate id
            data[kf.field] = kf.to_field(k[name])
    if base.weights != "q4_1":  # these keys mean nothing for bf16/fp32: pin them so designs dedupe
        data.update(native_decode=0, native_prefill=0, dense_above=None)
        k.update(native_decode=0, native_prefill=0, dense="calibrated", kernels="builtin")
    linear = (champion_kernels(base.model, champions) if base.weights == "q4_1" and k["kernels"] == "champion"
              else {})
    if data["kv_dtype"] != "fp32":  # the attention kernel reads an fp32 cache in place
        linear.pop("attention", None)
    qmatmul = (champion_native_matmul(base.model, champions) if base.weights == "q4_1" and k["qmatmul"] == "champion"
               else "")
    for knob, problem in CHAMPION_KNOBS.items():
        have = bool(linear) if knob == "kernels" else bool(qmatmul) if knob == "qmatmul" \
            else bool(champions.get(problem))
        if base.weights == "q4_1" and k[knob] == "champion" and not have:
            wanted = [probs[-1] for probs in matmul_problems(base.model).values()] if knob == "kernels" \
                else [probs[-1] for probs in engine_matmul_problems(base.model).values()] if knob == "qmatmul" \
                else [problem]
            raise NoChampion(f"no {' or '.join(wanted)} champion on this hardware for {knob}=champion, or none "
                             f"confirmed under low contention (swarmfactory run --problems {','.join(wanted)} makes "
                             "and confirms one)")
    if base.weights != "q4_1":
        k["matvec"] = k["qmatmul"] = "builtin"
    elif qmatmul:
        data["native_matmul"] = qmatmul
    elif k["kernels"] == "champion":
        # the named kernels must run, so the native decoder (its own kernels) is off
        data.update(native_decode=0, native_prefill=0, kernels={**base.kernels, **linear})
        k.update(native_decode=0, native_prefill=0)
    elif k["kv_dtype"] != "fp32" or k["native_decode"] == 0:
        data.update(native_decode=0, native_prefill=0)
        k.update(native_decode=0, native_prefill=0)
    if data["native_prefill"]:
        data["native_prefill"] = min(data["native_prefill"], data["prefill_chunk"])
    if (data["native_decode"] and data["native_decode"] >= data["max_batch"] and data["native_prefill"]
            and data["native_prefill"] >= data["prefill_chunk"]):
        # every step on the native decoder (always exact): torch's attention never runs
        data["attention"], k["attention"] = "padded", "padded"
    if k["matvec"] == "champion":
        if data["native_decode"] == 0:  # no native decoder: nothing to plug it into
            k["matvec"] = "builtin"
        else:
            data["native_matvec"] = f"champion:{MATVEC_PROBLEM}@{champions[MATVEC_PROBLEM]}"
    return Design(k, type(base).from_dict(data))


def torch_path(knobs: dict) -> bool:
    """Whether the design runs every step on torch (no native decoder)."""
    return knobs["native_decode"] == 0 or knobs["kv_dtype"] != "fp32" or knobs.get("kernels") == "champion"


def batch_invariant(knobs: dict, weights: str = "q4_1") -> bool:
    """Whether every row of a step is computed by the same operations whatever else is in the
    step. bf16 and fp32 weights (one dense matmul per op, no path to switch): exact decode
    attention. q4_1: the native decoder for every decode batch and every prompt chunk, or torch for
    everything with one kernel per op (no dense copies: torch's int4 kernel, or the kernel
    factory's champion) and exact decode attention (each sequence over its own context, not
    padded to the longest in the step). A q4_1 design that mixes paths by batch size, or pads
    attention, gives a sequence different tokens at near ties under load (verify.py catches it
    when one falls in its prompts: with a factory kernel on every Q4_1 op and padded attention,
    prompt 2 diverged at token 8 batched on a Zen 4)."""
    if weights != "q4_1":
        return knobs.get("attention", "padded") == "exact"
    if torch_path(knobs):
        return knobs["dense"] == "none" and knobs.get("attention", "padded") == "exact"
    return (knobs["native_decode"] is not None and knobs["native_decode"] >= knobs["max_batch"]
            and knobs["native_prefill"] is not None and knobs["native_prefill"] >= knobs["prefill_chunk"])


def make_invariant(knobs: dict, rng: random.Random, weights: str = "q4_1") -> dict:
    """The nearest batch-invariant design: for q4_1 all native (decode batch up to max_batch,
    every prompt chunk) or all int4; for bf16 and fp32 exact attention."""
    k = dict(knobs)
    if batch_invariant(k, weights):
        return k
    if weights != "q4_1":
        k["attention"] = "exact"
        return k
    if k.get("kernels") == "champion":  # the champion for every row: no dense copies, exact attention
        k.update(dense="none", attention="exact")
        return k
    native_ok = [c for c in KNOBS["prefill_chunk"] if c in KNOBS["native_prefill"]]
    if k["kv_dtype"] == "fp32" and rng.random() < 0.6 and native_ok:
        k["max_batch"] = min(k["max_batch"], max(v for v in KNOBS["native_decode"] if v))
        k["native_decode"] = min(v for v in KNOBS["native_decode"] if v and v >= k["max_batch"])
        if k["prefill_chunk"] not in native_ok:
            k["prefill_chunk"] = rng.choice(native_ok)
        k["native_prefill"] = k["prefill_chunk"]
    else:
        k.update(native_decode=0, native_prefill=0, dense="none", attention="exact")
    return k

