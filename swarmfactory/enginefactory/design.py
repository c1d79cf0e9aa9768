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
    "kv_dtype": ("fp32", "bf16", "int8"),           # int8: per head and token scale (engine/kv_cache.py)
    "prefill_chunk": (64, 128, 256, 512),
    "max_batch": (16, 32, 64, 128),
    "threads": (0, 1),                               # 0: one per core
    "kernels": ("builtin", "champion"),              # the Q4_1 ops on the kernel factory's champion
    "attention": ("padded", "exact"),                # torch decode attention (engine/config.py)
    "matvec": ("builtin", "champion"),               # the native decoder's Q4_1 loop: the factory's champion
}

DEFAULT_KNOBS = {"native_decode": None, "native_prefill": None, "dense": "calibrated", "kv_dtype": "fp32",
                 "prefill_chunk": 256, "max_batch": 32, "threads": 0, "kernels": "builtin",
                "attention": "padded", "matvec": "builtin"}

# ops stored as Q4_1 in a q4_1 GGUF (the output head is Q8_0): where a q4_1_matmul champion plugs in
CHAMPION_OPS = ("qkv", "o", "gate_up", "down")
CHAMPION_PROBLEM = "q4_1_matmul"
MATVEC_PROBLEM = "q4_1_packed_matvec"  # the native decoder's hot loop (engine/native/matvec.py)
# design knob -> the kernel-factory problem whose champion "champion" plugs in
CHAMPION_KNOBS = {"kernels": CHAMPION_PROBLEM, "matvec": MATVEC_PROBLEM}


class NoChampion(ConfigError):
    """A design asks for the kernel factory's champion where there is none."""


def pins(cfg: EngineConfig) -> dict[str, str]:
    """problem -> candidate id of every kernel-factory champion ``cfg`` pins (``champion:P@ID``)."""
    out = {}
    for name in [*cfg.kernels.values(), cfg.native_matvec or ""]:
        if name.startswith("champion:") and "@" in name:
            problem, _, cid = name.partition(":")[2].partition("@")
            out[problem] = cid
    return out


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
            if k.get(knob, "builtin") != "builtin":
                out += f" {knob}={problem}@{(self.pins.get(problem) or '?')[:12]}"
        return out

    @property
    def pins(self) -> dict[str, str]:
        """problem -> the kernel-factory candidate this design runs (pinned in its config)."""
        return pins(self.config)

    @property
    def champion(self) -> str | None:
        """The q4_1_matmul candidate this design's Q4_1 ops run, or None."""
        return self.pins.get(CHAMPION_PROBLEM)


# config keys added after designs were first recorded: hashed only when not at their default, so
# a design recorded before a key existed keeps its identity
LATER_KEYS = {"attention": "padded", "native_matvec": None}


def design_key(cfg: EngineConfig) -> str:
    data = cfg.model_dump()
    for k, default in LATER_KEYS.items():
        if data.get(k) == default:
            data.pop(k)
    blob = json.dumps(data, sort_keys=True)
    return hashlib.sha256(("engine-design\n" + blob).encode()).hexdigest()[:20]


def build(knobs: dict, base: EngineConfig, champions: dict[str, str] | str | None = None) -> Design:
    """The design for ``knobs`` on top of the run's base config (model, weights, max_seq_len).

    ``champions``: problem -> candidate id of this hardware's kernel-factory champions the engine
    may take (``engine.native_seam.current_champion``: none confirmed on a busy machine; a bare id
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
                max_batch=k["max_batch"], threads=k["threads"], attention=k["attention"])
    if base.weights != "q4_1":  # these keys mean nothing for bf16/fp32: pin them so designs dedupe
        data.update(native_decode=0, native_prefill=0, dense_above=None)
        k.update(native_decode=0, native_prefill=0, dense="calibrated", kernels="builtin")
    for knob, problem in CHAMPION_KNOBS.items():
        if base.weights == "q4_1" and k[knob] == "champion" and not champions.get(problem):
            raise NoChampion(f"no {problem} champion on this hardware for {knob}=champion, or none confirmed "
                             f"under low contention (swarmfactory run --problems {problem} makes and confirms one)")
    if base.weights != "q4_1":
        k["matvec"] = "builtin"
    elif k["kernels"] == "champion":
        # the named kernels must run, so the native decoder (its own kernels) is off
        cid = champions[CHAMPION_PROBLEM]
        data.update(native_decode=0, native_prefill=0,
                    kernels={**base.kernels, **{op: f"champion:{CHAMPION_PROBLEM}@{cid}" for op in CHAMPION_OPS}})
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


def torch_path(knobs: dict) -> bool:
    """Whether the design runs every step on torch (no native decoder)."""
    return knobs["native_decode"] == 0 or knobs["kv_dtype"] != "fp32" or knobs.get("kernels") == "champion"


def batch_invariant(knobs: dict) -> bool:
    """Whether every row of a step is computed by the same operations whatever else is in the
    step: the native decoder for every decode batch and every prompt chunk, or torch for
    everything with one kernel per op (no dense copies: torch's int4 kernel, or the kernel
    factory's champion) and exact decode attention (each sequence over its own context, not
    padded to the longest in the step). A q4_1 design that mixes paths by batch size, or pads
    attention, gives a sequence different tokens at near ties under load (verify.py catches it
    when one falls in its prompts: with a factory kernel on every Q4_1 op and padded attention,
    prompt 2 diverged at token 8 batched on a Zen 4)."""
    if torch_path(knobs):
        return knobs["dense"] == "none" and knobs.get("attention", "padded") == "exact"
    return (knobs["native_decode"] is not None and knobs["native_decode"] >= knobs["max_batch"]
            and knobs["native_prefill"] is not None and knobs["native_prefill"] >= knobs["prefill_chunk"])


def make_invariant(knobs: dict, rng: random.Random) -> dict:
    """The nearest batch-invariant design: all native (decode batch up to max_batch, every
    prompt chunk) or all int4."""
    k = dict(knobs)
    if batch_invariant(k):
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


def features(knobs: dict) -> list[float]:
    """Numbers for the cost model: each knob as a position in its value list, scaled to [0, 1]
    (``None``/calibrated counts as its own position)."""
    out = []
    for name, vals in KNOBS.items():
        val = knobs.get(name, DEFAULT_KNOBS[name])
        i = vals.index(val) if val in vals else 0
        out.append(i / max(1, len(vals) - 1))
    return out
