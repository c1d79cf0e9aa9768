"""EngineConfig: everything that determines how an engine is built.

A config is a frozen value: two engines built from equal configs on the same machine
compute the same thing at the same speed, so an engine factory can search over configs
and key its results by them. Unknown keys are rejected with a message naming the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from swarmfactory.config import ConfigError  # noqa: F401 (one error type for every bad config, re-exported)
from swarmfactory import kernelref
from swarmfactory.kernelref import KernelRef

WeightFormat = Literal["fp32", "bf16", "q4_1"]

# The linear layers of a Llama block plus the output head; each runs one kernel (kernels.py).
OPS = ("qkv", "o", "gate_up", "down", "lm_head")

# Fallbacks for the per-machine thresholds (engine/calibrate.py measures them at first load;
# these apply only to points a calibration had no time for). Measured on a 2-core Zen 4
# (AVX-512 BF16): rows above which torch's int4 kernel loses to a dense bf16 matmul, per op
# (the int4 kernel's cost grows linearly with rows, the dense matmul is bound by reading 4x more
# weight bytes until it becomes compute-bound), and the decode batch up to which the native
# decoder beat torch's q4_1 step (3.6 vs 12.7 ms at one sequence, 56.2 vs 56.4 at 32).
DEFAULT_DENSE_ABOVE = {"qkv": 8, "o": 8, "gate_up": 12, "down": 8, "lm_head": 3}
DEFAULT_NATIVE_DECODE = 32

# Kernel names with a prefix (swarmfactory/kernelref.py) name a native shared object with the
# ABI of one of the kernel factory's block-type matmuls (engine/native_seam.py) instead of a
# registered kernel class: one problem per GGUF block type, all with q4_1_matmul's ABI, and the
# problems derived from a model's (FAMILY.MODEL, problems/derive.py). Each problem here, with the
# name of the GGUF block type it takes (the seam, the config's validation and the derivation read
# this one table).
NATIVE_FAMILIES = {"q4_1_matmul": "Q4_1", "q4_0_matmul": "Q4_0", "q5_0_matmul": "Q5_0", "q8_0_matmul": "Q8_0",
                   "q4_k_matmul": "Q4_K", "q5_k_matmul": "Q5_K", "q6_k_matmul": "Q6_K"}
NATIVE_PROBLEMS = tuple(NATIVE_FAMILIES)


def native_family(problem: str) -> str | None:
    """The block-type matmul ``problem`` is (itself, or the family of FAMILY.MODEL), or None."""
    family = problem.partition(".")[0]
    return family if family in NATIVE_PROBLEMS else None


# The engine's non-linear ops a kernel-factory kernel can run (engine/native_ops.py), and the
# problems whose ABI each calls: the norms (the first layer's input norm, Gemma's sandwich norms,
# the q/k head norms), the residual add fused with the norm after it, the gated activation (the
# one the model's FFN uses), RoPE of the q and k heads, decode attention over the KV cache.
ELEMENT_OPS: dict[str, tuple[str, ...]] = {"norm": ("rmsnorm",), "add_norm": ("add_rmsnorm",),
                                           "act": ("swiglu", "geglu"), "rope": ("rope",),
                                           "attention": ("attention_decode",)}


def element_family(op: str, problem: str) -> str | None:
    """The problem family of ``problem`` (itself, or of FAMILY.MODEL) if it can run ``op``."""
    family = problem.partition(".")[0]
    return family if family in ELEMENT_OPS.get(op, ()) else None
# The kernel factory's problems with the engine's own numerics for its block types (8-bit
# activations per block of 32, or of 256 with sums per 16 for the K-quants; problems/suites/cpu/
# qengine.py), whose kernels run inside qlinear.c's kernels for weight parts of that type
# (native_matmul, engine/native/qext.py): problem -> type.
ENGINE_MATMUL_FAMILIES = {"q4_0_engine_matmul": "Q4_0", "q4_1_engine_matmul": "Q4_1",
                          "q5_0_engine_matmul": "Q5_0", "q5_1_engine_matmul": "Q5_1",
                          "q8_0_engine_matmul": "Q8_0", "q4_k_engine_matmul": "Q4_K",
                          "q5_k_engine_matmul": "Q5_K", "q6_k_engine_matmul": "Q6_K",
                          # the same kernels on the packed copies the engine runs where the CPU has
                          # vpdpbusd (qengine_packed.py): called on a part's packed copy
                          "q4_0_engine_packed_matmul": "Q4_0", "q4_1_engine_packed_matmul": "Q4_1",
                          "q5_0_engine_packed_matmul": "Q5_0", "q5_1_engine_packed_matmul": "Q5_1",
                          "q8_0_engine_packed_matmul": "Q8_0"}
PACKED_MATMUL_FAMILIES = frozenset(f for f in ENGINE_MATMUL_FAMILIES if "_packed_" in f)


def parse_native_matmul(spec: str) -> list[KernelRef]:
    """The champions a ``native_matmul`` value names (``champion:<type>_engine_matmul[.MODEL][@ID]``
    joined with ``+``, one per block type); ValueError if it names anything else."""
    refs, types = [], set()
    for piece in spec.split(kernelref.JOIN):
        try:
            ref = KernelRef.parse(piece.strip(), " in native_matmul")
        except ValueError as e:
            raise ValueError(str(e)) from None
        family = ref.target.partition(".")[0]
        if ref.kind != "champion" or family not in ENGINE_MATMUL_FAMILIES:
            raise ValueError(f"native_matmul {piece!r}: expected 'champion:PROBLEM[@CANDIDATE_ID]' of "
                             f"{', '.join(ENGINE_MATMUL_FAMILIES)} (or one derived from a model, PROBLEM.MODEL)")
        qtype = ENGINE_MATMUL_FAMILIES[family]
        if qtype in types:
            raise ValueError(f"native_matmul {spec!r} names two kernels for {qtype}")
        types.add(qtype)
        refs.append(ref)
    return refs


# The kernel factory's problem whose kernels run inside the native decoder (native_matvec).
NATIVE_MATVEC_PROBLEM = "q4_1_packed_matvec"


def parse_native_matvec(spec: str) -> str | None:
    """The candidate id a ``native_matvec`` value pins (None: the champion); ValueError if it
    names nothing valid."""
    prefix = f"champion:{NATIVE_MATVEC_PROBLEM}"
    try:
        ref = KernelRef.parse(spec)
    except ValueError:
        ref = None
    if ref is None or ref.kind != "champion" or ref.target != NATIVE_MATVEC_PROBLEM:
        raise ValueError(f"native_matvec {spec!r}: expected {prefix!r} or '{prefix}@CANDIDATE_ID'")
    return ref.pin



@dataclass(frozen=True)
class Knob:
    """An ``engine tune`` design knob, declared on the EngineConfig field it sets
    (``Annotated[type, Knob(...)]``). Nothing else declares it: the design space, its defaults, the
    LLM's knob lines and the ``--set`` help are read from here (enginefactory/design.py
    ``knob_table``), so a knob is added by declaring it on its field.

    - ``values``: what a design may set, in order (``None``: the engine's own calibration).
    - ``meaning``: what the knob does, as the LLM proposing designs is told.
    - ``aspect``: the knob agent that moves it (``agents/knobs.py`` ``ASPECTS``).
    - ``name``: the knob's name where it is not the field's.
    - ``presets``: (knob value, field value) pairs where the knob names field values; any other
      value is the field's value itself, except ``champion``: the kernel factory's champion, which
      the design pins by candidate id (enginefactory/design.py ``build``). The field's default is
      the default knob value.
    """

    values: tuple
    meaning: str
    aspect: str
    name: str = ""
    presets: tuple[tuple[Any, Any], ...] = ()


# dense_above presets the `dense` knob names: calibrated (measured here), none, or the defaults moved
DENSE_PRESETS = (("calibrated", None), ("none", {}),
                 ("early", {op: max(1, v // 2) for op, v in DEFAULT_DENSE_ABOVE.items()}),
                 ("late", {op: v * 4 for op, v in DEFAULT_DENSE_ABOVE.items()}))


class EngineConfig(BaseModel):
    """How to build an engine. A field annotated with a ``Knob`` is a design knob of ``engine tune``.

    - ``model``: path to a GGUF file; ``None`` means the bundled SmolLM2-135M-Instruct.
    - ``weights``: fp32 (exact: matches the HF fp32 reference), bf16, or q4_1 (4-bit, group 32).
    - ``threads``: torch intra-op threads; 0 means one per available core.
    - ``max_batch``: sequences decoded together (also the number of KV-cache slots).
    - ``max_seq_len``: tokens per sequence (prompt + output) the KV cache holds.
    - ``prefill_chunk``: most prompt tokens processed in one engine step; longer prompts are
      split, so running sequences keep decoding while a long prompt is read.
    - ``kernels``: op -> kernel name for ops in ``OPS``; ops not named use the format's default
      (see ``kernels.default_kernel``). Names come from the kernel registry, or name a native
      shared object with the ABI of the kernel factory's block-type matmuls
      (``engine/native_seam.py``): ``so:PATH`` (a built library on disk exporting one or more of
      ``q4_1_matmul``, ``q4_k_matmul``...) or ``champion:q4_k_matmul`` (the evidence store's
      current champion for this hardware, built with the C backend; a problem derived from a
      model, ``champion:q4_k_matmul.MODEL``, too); ``champion:PROBLEM@ID`` pins candidate ``ID``
      (it must have passed the harness on this hardware), which is how an engine design names the
      champion it was verified with. A library runs the parts of the op's weight stored in its
      block type; the op's other parts run the engine's default kernel. The non-linear ops
      (``ELEMENT_OPS``: ``norm``, ``add_norm``, ``act``, ``rope``, ``attention``) take ``so:PATH``
      or a champion of ``rmsnorm``, ``add_rmsnorm``, ``swiglu``/``geglu``, ``rope``,
      ``attention_decode`` (or one derived from them) the same way (``engine/native_ops.py``).
    - ``kv_dtype``: dtype of the KV cache. fp32 costs twice the memory of bf16 but CPU bmm in
      fp32 is much cheaper per call than in bf16, which dominates decode attention here. int8:
      each token's k and v of each kv head quantised to int8 with its own fp32 scale
      (absmax / 127), read back to fp32 for attention: a quarter of fp32's memory (plus 4 bytes
      per head per token), for long contexts or many sequences where the cache is what runs out.
    - ``dense_above``: q4_1 only; op -> rows. A call of that op with more rows (tokens in the
      step; logit rows for lm_head) runs a dense copy of the weight (bf16 oneDNN, or fp32 sgemm
      where bf16 is unavailable) instead of the op's kernel (faster once compute-bound). Ops not
      listed keep no dense copy. ``None``: measured on this machine (engine/calibrate.py).
    - ``native_decode``: q4_1 with an fp32 KV cache only; the native decoder takes up to this
      many decode sequences in one C call, the whole step (``engine/native``); more run in several
      calls, never on torch. ``None``: measured on this machine whether it is on (then it takes
      up to ``max_batch`` a call) where it applies (falling back to torch, with a log
      line, where no C compiler builds it or no ISA path passes its check) and off elsewhere,
      including when ``kernels`` names kernels (they must run); 0 turns it off; a number > 0
      requires it.
    - ``native_prefill``: prompt tokens a native call takes along with its decode rows (at most
      ``prefill_chunk``); a step with more runs its chunks in several calls, only a chunk longer
      than this on torch. ``None``: measured on this machine whether the native step wins on
      prompts (then it takes every chunk, ``prefill_chunk``); 0: prompts always run on torch. Needs the native decoder.
    - ``attention``: torch decode attention. ``padded`` (default): one batched matmul over the
      longest context in the step, shorter ones masked, so a sequence's softmax and sums run
      over a length that depends on the others (bitwise, not mathematically: tokens can flip at
      near ties when the batch changes). ``exact``: each sequence over exactly its own context,
      the same operations whatever else is in the step (batch invariant; one small matmul per
      sequence, slower at large batch). The native decoder is always exact.
    - ``native_matvec``: what runs the native decoder's Q4_1 matrices. ``None``: its built-in
      loop; ``champion:q4_1_packed_matvec``: the evidence store's champion of the kernel
      factory's problem for this hardware; ``champion:q4_1_packed_matvec@ID``: candidate ID,
      which needs a correct evaluation on this hardware (``engine/native/matvec.py``). Compiled
      into the decoder and checked before use; an error if it fails, never a silent fallback.
      Needs the native decoder.
    - ``native_matmul``: what runs the weight parts of a block type (Q4_0, Q4_1, Q5_0, Q5_1,
      Q8_0, Q4_K, Q5_K, Q6_K) in the engine's block kernels (``qnative`` ops and the native block
      step). ``None``: the engine's own; ``champion:q8_0_engine_matmul`` (``.MODEL`` for the
      problem derived from a model, ``@ID`` to pin a candidate), several types' joined with
      ``+``: the kernel factory's champion of that problem with the engine's numerics, checked at
      load and audited while serving (``engine/native/qext.py``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str | None = None
    weights: WeightFormat = "q4_1"
    threads: Annotated[int, Knob(
        (0, 1), "torch intra-op threads; 0 = one per available core", "threading")] = Field(default=0, ge=0)
    max_batch: Annotated[int, Knob(
        (16, 32, 64, 128), "sequences decoded together (KV cache slots); further requests wait",
        "blocking")] = Field(default=32, ge=1, le=1024)
    max_seq_len: int = Field(default=2048, ge=16)
    prefill_chunk: Annotated[int, Knob(
        (64, 128, 256, 512), "prompt tokens per engine step (chunked prefill: smaller chunks interleave long "
        "prompts with the decode of other sequences)", "blocking")] = Field(default=256, ge=16)
    kernels: Annotated[dict[str, str], Knob(
        ("builtin", "champion"), "builtin = the engine's own kernels; champion = every op with a kernel-factory "
        "champion for this machine runs it (the block-type matmuls of its weights, the norms, the activation; "
        "native decoder off; offered only where a champion exists)", "algorithm", presets=(("builtin", {}),))] = Field(default_factory=dict)
    kv_dtype: Annotated[Literal["fp32", "bf16", "int8"], Knob(
        ("fp32", "bf16", "int8"), "KV cache dtype; bf16 halves its memory, int8 (a scale per head and token) "
        "quarters it, and the native decoder needs fp32", "algorithm")] = "fp32"
    dense_above: Annotated[dict[str, int] | None, Knob(
        tuple(v for v, _ in DENSE_PRESETS), "q4_1 weights: above how many rows an op uses a dense copy of its "
        "weights (bf16 oneDNN, or fp32 sgemm where bf16 is not available) instead of torch's int4 kernel; "
        "calibrated = measured on this machine, none = every call on the int4 kernel, early = half the default "
        "thresholds, late = four times them", "algorithm", name="dense", presets=DENSE_PRESETS)] = None
    native_decode: Annotated[int | None, Knob(
        (None, 0, 8, 16, 32, 64), "q4_1 with an fp32 KV cache: decode sequences one call of the native C "
        "decoder (SIMD for this CPU) takes, more in several calls; null = on where measured faster at load "
        "(then up to max_batch a call), 0 = off (torch)", "algorithm")] = Field(default=None, ge=0)
    native_prefill: Annotated[int | None, Knob(
        (None, 0, 16, 64, 128), "prompt tokens one native call takes along with its decode rows (at most "
        "prefill_chunk; a longer chunk runs on torch); null = every chunk where measured faster, 0 = prompts on torch",
        "algorithm")] = Field(default=None, ge=0)
    attention: Annotated[Literal["padded", "exact"], Knob(
        ("padded", "exact"), "torch decode attention: padded = one batched matmul over the longest context, "
        "masked (fast, not batch invariant bitwise); exact = each sequence over its own context (batch "
        "invariant, one small matmul per sequence); the native decoder is always exact", "algorithm")] = "padded"
    native_matvec: Annotated[str | None, Knob(
        ("builtin", "champion"), "builtin = the native decoder's own Q4_1 loop; champion = the kernel factory's "
        "q4_1_packed_matvec champion for this machine compiled into the native decoder (only where the native "
        "decoder runs; offered only where a champion exists)", "algorithm", name="matvec",
        presets=(("builtin", None),))] = None
    native_matmul: Annotated[str | None, Knob(
        ("builtin", "champion"), "builtin = the engine's own block kernels; champion = the kernel factory's "
        "<type>_engine_matmul champions for this machine (the engine's numerics) run the weights of their block "
        "types in the native block step and the qnative ops (offered only where a champion exists)",
        "algorithm", name="qmatmul", presets=(("builtin", None),))] = None

    @model_validator(mode="after")
    def _native_applies(self) -> "EngineConfig":
        if self.native_decode and (self.weights != "q4_1" or self.kv_dtype != "fp32"):
            raise ValueError("native_decode needs weights q4_1 and kv_dtype fp32 "
                             f"(got weights {self.weights}, kv_dtype {self.kv_dtype}); set it to 0 or leave it unset")
        if "attention" in self.kernels and self.kv_dtype != "fp32":
            raise ValueError(f"kernels.attention reads the KV cache in place as fp32 (the attention_decode ABI); "
                             f"kv_dtype is {self.kv_dtype}: set kv_dtype fp32 or leave the attention op to the engine")
        if self.native_decode and self.kernels:
            raise ValueError("native_decode runs its own kernels for every op, so it cannot be combined "
                             "with kernels; set native_decode to 0 to run the named kernels")
        if self.native_prefill and not self.native_applies():
            raise ValueError("native_prefill needs the native decoder (weights q4_1, kv_dtype fp32, no kernels, "
                             "native_decode not 0)")
        if self.native_matmul is not None:
            parse_native_matmul(self.native_matmul)
            if self.weights != "q4_1":
                raise ValueError(f"native_matmul runs inside the engine's block kernels, which run quantised "
                                 f"weights (weights q4_1); got weights {self.weights}")
        if self.native_matvec is not None:
            parse_native_matvec(self.native_matvec)
            if not self.native_applies():
                raise ValueError("native_matvec needs the native decoder (weights q4_1, kv_dtype fp32, no kernels, "
                                 "native_decode not 0)")
        return self

    def native_applies(self) -> bool:
        """Whether this config may run the native decoder at all."""
        return (self.weights == "q4_1" and self.kv_dtype == "fp32" and not self.kernels
                and self.native_decode != 0)

    @field_validator("kernels", "dense_above")
    @classmethod
    def _known_ops(cls, v: dict | None, info) -> dict | None:
        known = OPS + tuple(ELEMENT_OPS) if info.field_name == "kernels" else OPS
        for op, val in (v or {}).items():
            if op not in known:
                raise ValueError(f"unknown op {op!r} in {info.field_name} (known: {', '.join(known)})")
            if info.field_name == "dense_above" and val < 0:
                raise ValueError(f"dense_above[{op!r}] must be >= 0")
            if info.field_name == "kernels":
                problem = _kernel_name_problem(op, val)
                if problem:
                    raise ValueError(problem)
        return v

    def resolved_threads(self) -> int:
        if self.threads:
            return self.threads
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            return os.cpu_count() or 1

    @classmethod
    def from_dict(cls, data: dict) -> "EngineConfig":
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ConfigError(_one_line(e)) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> "EngineConfig":
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys")
        return cls.from_dict(data)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(), sort_keys=True)


def _kernel_name_problem(op: str, name: str) -> str | None:
    """What is wrong with kernel name ``name`` for ``op`` as far as can be told without loading
    anything (a prefixed name's file or champion is looked up when the engine loads)."""
    if not name:
        return f"empty kernel name for op {op!r}"
    if op in ELEMENT_OPS:
        families = ", ".join(ELEMENT_OPS[op])
        if not KernelRef.names_one(name):
            return (f"{name!r} for op {op!r}: the {op} op runs the engine's own code or a kernel-factory kernel "
                    f"(so:PATH or champion:PROBLEM) of {families}")
        if len(kernelref.pieces(name)) > 1:
            return f"{name!r} for op {op!r}: one kernel runs the {op} op (no '{kernelref.JOIN}')"
        try:
            ref = KernelRef.parse(name, f" for op {op!r}")
        except ValueError as e:
            return str(e)
        if ref.kind == "champion" and element_family(op, ref.target) is None:
            return (f"{name!r} for op {op!r}: only champions of {families} (or of a problem derived from them, "
                    f"FAMILY.MODEL) run the {op} op (the engine calls that problem's C ABI)")
        return None
    if ":" not in name:
        return None
    for one in kernelref.pieces(name):
        try:
            ref = KernelRef.parse(one, f" for op {op!r}")
        except ValueError as e:
            return str(e)
        if ref.kind == "champion" and native_family(ref.target) is None:
            return (f"{one!r} for op {op!r}: only champions of {', '.join(NATIVE_PROBLEMS)} (or of a problem "
                    f"derived from them, FAMILY.MODEL) plug into linear ops (the engine calls that problem's C ABI)")
    return None


def _one_line(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key {loc!r}")
        else:
            parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)
