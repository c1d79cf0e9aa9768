"""Engine designs: the engine factory's candidates.

A design is an ``EngineConfig`` (engine/config.py) with the model and the weights format fixed by
the tune run, and every other choice open: native decode batch and prompt tokens, dense-copy
thresholds, threads, KV dtype, prefill chunk, max batch. ``KNOBS`` lists the values the agents
choose from; ``None`` keeps the engine's own per-machine calibration for that key. A design's
identity is the content hash of its canonical YAML, so the evidence store dedupes designs the way
it dedupes kernels.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

from swarmfactory.engine.config import DEFAULT_DENSE_ABOVE, ConfigError, EngineConfig

# dense_above presets: names for the agents, dicts (or None: calibrated) for the engine
DENSE = {
    "calibrated": None,
    "none": {},                                      # every call on the int4 kernel
    "early": {op: max(1, v // 2) for op, v in DEFAULT_DENSE_ABOVE.items()},
    "late": {op: v * 4 for op, v in DEFAULT_DENSE_ABOVE.items()},
}

KNOBS: dict[str, tuple] = {
    "native_decode": (None, 0, 8, 16, 32, 64),
    "native_prefill": (None, 0, 16, 64, 128),
    "dense": tuple(DENSE),
    "kv_dtype": ("fp32", "bf16"),
    "prefill_chunk": (64, 128, 256, 512),
    "max_batch": (16, 32, 64, 128),
    "threads": (0, 1),                               # 0: one per core
}

DEFAULT_KNOBS = {"native_decode": None, "native_prefill": None, "dense": "calibrated", "kv_dtype": "fp32",
                 "prefill_chunk": 256, "max_batch": 32, "threads": 0}


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
        return (f"native_decode={nd} native_prefill={np_} dense={k['dense']} kv={k['kv_dtype']} "
                f"chunk={k['prefill_chunk']} max_batch={k['max_batch']} threads={k['threads'] or 'all'}")


def design_key(cfg: EngineConfig) -> str:
    blob = json.dumps(cfg.model_dump(), sort_keys=True)
    return hashlib.sha256(("engine-design\n" + blob).encode()).hexdigest()[:20]


def build(knobs: dict, base: EngineConfig) -> Design:
    """The design for ``knobs`` on top of the run's base config (model, weights, max_seq_len).

    Raises ConfigError for a combination the engine refuses (e.g. native decode with a bf16 KV
    cache); agents treat that as a proposal to drop, never as an evaluation."""
    unknown = set(knobs) - set(KNOBS)
    if unknown:
        raise ConfigError(f"unknown design knob(s): {', '.join(sorted(unknown))} (known: {', '.join(KNOBS)})")
    k = {**DEFAULT_KNOBS, **knobs}
    for name, val in k.items():
        if val not in KNOBS[name]:
            raise ConfigError(f"design knob {name}={val!r} is not one of {list(KNOBS[name])}")
    data = base.model_dump()
    data.update(native_decode=k["native_decode"], native_prefill=k["native_prefill"],
                dense_above=DENSE[k["dense"]], kv_dtype=k["kv_dtype"], prefill_chunk=k["prefill_chunk"],
                max_batch=k["max_batch"], threads=k["threads"])
    if base.weights != "q4_1":  # these keys mean nothing for bf16/fp32: pin them so designs dedupe
        data.update(native_decode=0, native_prefill=0, dense_above=None)
        k.update(native_decode=0, native_prefill=0, dense="calibrated")
    elif k["kv_dtype"] != "fp32" or k["native_decode"] == 0:
        data.update(native_decode=0, native_prefill=0)
        k.update(native_decode=0, native_prefill=0)
    if data["native_prefill"]:
        data["native_prefill"] = min(data["native_prefill"], data["prefill_chunk"])
    return Design(k, EngineConfig.from_dict(data))


def default_design(base: EngineConfig) -> Design:
    """What ``engine serve`` runs without a profile: the calibrated defaults."""
    return build({}, base)


def mutate(knobs: dict, rng: random.Random, n: int = 1) -> dict:
    """Move ``n`` knobs to a neighbouring or random value."""
    out = dict(knobs)
    for name in rng.sample(list(KNOBS), n):
        vals = KNOBS[name]
        i = vals.index(out[name]) if out[name] in vals else 0
        if rng.random() < 0.7 and name not in ("dense", "kv_dtype"):  # ordered: step to a neighbour
            j = min(len(vals) - 1, max(0, i + rng.choice((-1, 1))))
        else:
            j = rng.randrange(len(vals))
        out[name] = vals[j]
    return out


def crossover(a: dict, b: dict, rng: random.Random) -> dict:
    return {name: (a if rng.random() < 0.5 else b)[name] for name in KNOBS}


def random_knobs(rng: random.Random) -> dict:
    return {name: rng.choice(vals) for name, vals in KNOBS.items()}


def batch_invariant(knobs: dict) -> bool:
    """Whether every row of a step runs the same kernels whatever else is in the step: the
    native decoder for every decode batch and every prompt chunk, or torch's int4 kernel for
    everything (no dense copies, no native decoder). A q4_1 design that mixes paths by batch
    size gives a sequence different tokens under load (verify.py catches it)."""
    if knobs["native_decode"] == 0 or knobs["kv_dtype"] != "fp32":
        return knobs["dense"] == "none"
    return (knobs["native_decode"] is not None and knobs["native_decode"] >= knobs["max_batch"]
            and knobs["native_prefill"] is not None and knobs["native_prefill"] >= knobs["prefill_chunk"])


def make_invariant(knobs: dict, rng: random.Random) -> dict:
    """The nearest batch-invariant design: all native (decode batch up to max_batch, every
    prompt chunk) or all int4."""
    k = dict(knobs)
    if batch_invariant(k):
        return k
    native_ok = [c for c in KNOBS["prefill_chunk"] if c in KNOBS["native_prefill"]]
    if k["kv_dtype"] == "fp32" and rng.random() < 0.6 and native_ok:
        k["max_batch"] = min(k["max_batch"], max(v for v in KNOBS["native_decode"] if v))
        k["native_decode"] = min(v for v in KNOBS["native_decode"] if v and v >= k["max_batch"])
        if k["prefill_chunk"] not in native_ok:
            k["prefill_chunk"] = rng.choice(native_ok)
        k["native_prefill"] = k["prefill_chunk"]
    else:
        k.update(native_decode=0, native_prefill=0, dense="none")
    return k


def features(knobs: dict) -> list[float]:
    """Numbers for the cost model: each knob as a position in its value list, scaled to [0, 1]
    (``None``/calibrated counts as its own position)."""
    out = []
    for name, vals in KNOBS.items():
        i = vals.index(knobs[name]) if knobs[name] in vals else 0
        out.append(i / max(1, len(vals) - 1))
    return out
