"""Per-machine thresholds, measured on the machine at first load and cached.

Which path is fastest for a given batch depends on the CPU (AVX-512 bf16 or AVX2 only, cores,
caches), the torch build and the model, so the q4_1 engine's switch points are measured here
instead of shipped as one machine's constants:

- ``dense_above[op]``: rows above which an op's dense copy beats torch's int4 kernel (layer 0's
  weights and the output head, at 1..64 rows);
- ``native_decode``: the largest decode batch (of 1..64) up to which the native decoder is at
  least as fast as the torch step;
- ``native_prefill``: the most prompt tokens per step (of 16..256) up to which the native
  decoder is at least as fast as the torch forward.

The engine (``paths.plan``) reads the two native points as switches: above 0, the native step
takes every decode row and every prompt chunk, so no row's path depends on how many rows share
its step (a split by size gave Gemma 3 270M other tokens under load on a Zen 4).

Each point is the best of interleaved timings (the two contenders alternate; see
``_best_pair``). The whole calibration stays under ``BUDGET_S``; what it had no time for keeps
its default and the record says so. Results are cached as JSON under the user cache dir
(``$SWARMFACTORY_CACHE`` or ``~/.cache/swarmfactory``)/calibration, keyed by everything that
changes them: CPU model and features (as masked), torch version and capability, the model
file's content (sha256), the threads, the native path and its C source, and this module's
version.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from swarmfactory.hardware import cache_dir, cpu_fingerprint

from . import model_file
from .config import DEFAULT_DENSE_ABOVE, DEFAULT_NATIVE_DECODE, OPS
from .kv_cache import KVCache
from .models import build, model_class
from .models.decoder import Decoder
from .models.step import PrefillChunk, StepInput

VERSION = 1
BUDGET_S = 25.0
ROWS = (1, 4, 8, 16, 32, 64)
DECODE = (1, 8, 16, 32, 64)
PROMPT = (16, 64, 128, 256)
WIDE_MARGIN = 1.3  # native this much faster at the last point measured: assume it stays ahead
DECODE_POS = 80  # context length of the decode rows while timed: attention counts too
DEFAULT_NATIVE_PREFILL = 64  # where a calibration had no time: native won at 16-64 tokens on both ISAs measured


@dataclass(frozen=True)
class Calibration:
    """Measured thresholds (see the module docstring) and how they were obtained."""

    dense_above: dict[str, int]
    native_decode: int
    native_prefill: int
    seconds: float
    key: dict
    timings: dict = field(default_factory=dict)  # what was measured, ms per call
    incomplete: list[str] = field(default_factory=list)  # points left at their default (budget)
    loadavg: list[float] = field(default_factory=list)  # 1-minute load average before and after
    cached: bool = False


def cache_root() -> Path:
    return cache_dir() / "calibration"


def native_code() -> str:
    """A digest of the native C the engine builds (the decoder, the block kernels and step): a
    change to a kernel changes where it beats torch, so it invalidates the measured thresholds."""
    from .native import library, qlinear

    return hashlib.sha256((library.source() + qlinear.source()).encode()).hexdigest()[:16]


def cache_key(model_path: Path, threads: int, native_isa: str | None) -> dict:
    """The model is keyed by its content (``model_file.sha256``): a renamed or copied file keeps
    its calibration. The native code is keyed by its source (``native_code``)."""
    return {"version": VERSION, "cpu": cpu_fingerprint()["model"], "features": cpu_fingerprint()["features"],
            "mask": cpu_fingerprint().get("mask"), "torch": torch.__version__,
            "torch_cpu": torch.backends.cpu.get_cpu_capability(),
            "model": {"sha256": model_file.sha256(model_path)}, "threads": threads, "native": native_isa,
            "native_code": native_code()}


def _legacy_key(key: dict, model_path: Path) -> dict:
    """``key`` as records made before content keys named the model: by name, size and mtime."""
    st = model_path.stat()
    return {**key, "model": {"name": model_path.name, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}}


def _path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root() / f"{digest}.json"


def load_cached(key: dict, model_path: Path | None = None) -> Calibration | None:
    """The record stored under ``key``; else, given ``model_path``, one recorded for this very
    file version under the old key shape, which is then stored again under ``key``."""
    cal = _load(key)
    if cal is None and model_path is not None:
        old = _load(_legacy_key(key, model_path))
        if old is not None:
            cal = Calibration(**{**asdict(old), "key": key, "cached": True})
            try:
                save(cal)
            except OSError:
                pass
    return cal


def _load(key: dict) -> Calibration | None:
    try:
        data = json.loads(_path(key).read_text())
        if data.get("key") != key:
            return None
        return Calibration(**{**data, "cached": True})
    except (OSError, ValueError, TypeError):
        return None


def forget(key: dict) -> None:
    """Drop the cached calibration for ``key`` (the next load measures again)."""
    _path(key).unlink(missing_ok=True)


def save(cal: Calibration) -> Path:
    path = _path(cal.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({k: v for k, v in asdict(cal).items() if k != "cached"}, indent=1))
    os.replace(tmp, path)  # atomic: concurrent loads see the old file or the new one
    return path


class OutOfTime(Exception):
    pass


def _best_pair(a, b, deadline: float, reps: int = 5, min_s: float = 2e-3) -> tuple[float, float]:
    """Seconds per call of a() and b(): the best of ``reps`` alternating samples, each >= min_s
    long. The best, not the median: on a shared machine other work only ever adds time, in
    bursts, and a threshold should not move with them. Raises OutOfTime when the samples
    would end after ``deadline``."""
    t0 = time.perf_counter()
    a()
    t1 = time.perf_counter()
    b()
    t2 = time.perf_counter()
    na = max(1, int(min_s / max(t1 - t0, 1e-7)))
    nb = max(1, int(min_s / max(t2 - t1, 1e-7)))
    if t2 + reps * (na * (t1 - t0) + nb * (t2 - t1)) > deadline:
        raise OutOfTime
    ta, tb = [], []
    for r in range(reps):
        for fn, n, out in ((a, na, ta), (b, nb, tb)) if r % 2 == 0 else ((b, nb, tb), (a, na, ta)):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - t0) / n)
    return min(ta), min(tb)


def _last_winning(points, wins) -> int | None:
    """The largest point p such that ``wins`` holds at p and at every smaller point."""
    best = None
    for p, w in zip(points, wins):
        if not w:
            break
        best = p
    return best


def measure_dense_above(model: Decoder, deadline: float, timings: dict, incomplete: list) -> dict[str, int]:
    """op -> rows above which the dense copy wins (ops where it never wins in ROWS are left out).
    Needs a model built with a dense copy for every op."""
    linears = {"qkv": model.layers[0].qkv, "o": model.layers[0].o, "gate_up": model.layers[0].gate_up,
               "down": model.layers[0].down, "lm_head": model.lm_head}
    out = {}
    for op in OPS:
        lin = linears[op]
        if lin.dense is None:
            continue
        wins, rows = [], []
        try:
            for m in ROWS:
                x = torch.randn(m, lin.kernel.in_features, generator=torch.Generator().manual_seed(m)).to(model.dtype)
                tk, td = _best_pair(lambda: lin.kernel(x), lambda: lin.dense(x), deadline, reps=3, min_s=1e-3)
                timings[f"{op}@{m}"] = [round(tk * 1e3, 4), round(td * 1e3, 4)]
                rows.append(m)
                wins.append(td < tk)
        except OutOfTime:
            incomplete.append(f"dense_above.{op}")
            if op in DEFAULT_DENSE_ABOVE:
                out[op] = DEFAULT_DENSE_ABOVE[op]
            continue
        # dense from the first row count after which it wins at every measured point
        for i in range(len(rows)):
            if all(wins[i:]):
                out[op] = rows[i - 1] if i else 0
                break
    return out


def _decode_step(b: int, pos: int) -> StepInput:
    return StepInput(tokens=torch.randint(0, 1000, (b,), generator=torch.Generator().manual_seed(b)),
                     positions=torch.full((b,), pos), slots=torch.arange(b), n_decode=b, decode_slots=None,
                     decode_range=(0, b), decode_len=pos + 1, decode_bias=None)


def _prompt_step(n: int) -> StepInput:
    return StepInput(tokens=torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(n)),
                     positions=torch.arange(n), slots=torch.zeros(n, dtype=torch.long), n_decode=0,
                     decode_slots=None, decode_range=None, decode_len=0, decode_bias=None,
                     prefills=[PrefillChunk(row=0, n=n, slot=0, start=0)], logit_rows=torch.tensor([n - 1]))


def measure_native(gg, model: Decoder, lib, threads: int, deadline: float, timings: dict,
                   incomplete: list) -> tuple[int, int]:
    """(native_decode, native_prefill) against the torch model as it is now configured."""
    from .native import build_decoder

    hp = model.hp
    n_pos = model.cos.shape[0]  # positions the model has RoPE tables for (a tiny context)
    # Two small caches: many short sequences for decode batches, one long one for prompts.
    kv_d = KVCache(hp.n_layers, max(DECODE), hp.n_kv_heads, min(DECODE_POS, n_pos - 1) + 1, hp.head_dim,
                   torch.float32)
    kv_p = KVCache(hp.n_layers, 1, hp.n_kv_heads, min(max(PROMPT), n_pos), hp.head_dim, torch.float32)
    results = []
    decode_pos = min(DECODE_POS, n_pos - 1)
    prompts = tuple(p for p in PROMPT if p <= n_pos)
    for kv, points, step_of, name in ((kv_d, DECODE, lambda b: _decode_step(b, decode_pos), "decode"),
                                      (kv_p, prompts, _prompt_step, "prefill")):
        nat = build_decoder(lib, gg, model, kv, max(points, default=1) if name == "decode" else 1, threads,
                            max_prompt=max(points, default=0) if name == "prefill" else 0)
        wins, done, margin = [], [], 1.0
        deadline_here = time.perf_counter() + (deadline - time.perf_counter()) * (0.5 if name == "decode" else 1.0)
        for p in points:
            s = step_of(p)
            rows = s.logit_rows
            try:
                tn, tt = _best_pair(lambda: nat(s.tokens, s.slots, s.positions, rows),
                                    lambda: model.forward(s, kv), deadline_here, reps=2)
            except OutOfTime:
                incomplete.append(f"native_{name}@{p}")
                break
            timings[f"native_{name}@{p}"] = [round(tn * 1e3, 3), round(tt * 1e3, 3)]
            done.append(p)
            wins.append(tn <= tt)
            margin = tt / tn
        default = DEFAULT_NATIVE_DECODE if name == "decode" else DEFAULT_NATIVE_PREFILL
        found = _last_winning(done, wins)
        if len(done) < len(points) and all(wins):  # out of time while native still won:
            # far ahead at the last point (the cost of both grows about linearly from there),
            # assume it stays ahead; else no further than the default
            found = max(points) if margin >= WIDE_MARGIN else max(found or 0, default)
        elif found is None:
            found = 0 if name == "prefill" else 1  # a decode step of one is the native case
        results.append(found)
    return results[0], results[1]


def calibrate(gg, model: Decoder, lib, threads: int, key: dict, budget_s: float = BUDGET_S) -> Calibration:
    """Measure this machine's thresholds. ``model`` must be built with a dense copy for every op
    (its thresholds are set to the measured ones, copies kept: apply the final ones with
    ``apply_dense_above``); ``lib`` is the checked native library, or None where the native
    decoder does not run."""
    t0 = time.perf_counter()
    deadline = t0 + budget_s
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
    timings: dict = {}
    incomplete: list[str] = []
    torch.set_num_threads(threads)
    with torch.inference_mode():
        # a third of the time for dense_above, the rest for the native decoder (most steps)
        share = 1.0 if lib is None else 1 / 3
        dense_above = measure_dense_above(model, t0 + budget_s * share, timings, incomplete)
        apply_dense_above(model, dense_above, drop=False)
        native_decode, native_prefill = 0, 0
        if lib is not None:
            native_decode, native_prefill = measure_native(gg, model, lib, threads, deadline, timings, incomplete)
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
    return Calibration(dense_above, native_decode, native_prefill, round(time.perf_counter() - t0, 2), key,
                       timings, incomplete, [round(load0, 2), round(load1, 2)])


def run(cfg, budget_s: float = BUDGET_S) -> Calibration:
    """Measure and store the thresholds for ``cfg``'s model and threads on this machine (what
    ``swarmfactory engine calibrate`` does), replacing any cached ones."""
    from .gguf_loader import load_gguf, resolve_model_path
    from .native import NativeUnavailable, load_checked, unsupported
    from .native.qlinear import loaded
    from .native.qstep import BlockLibrary
    from .native.qstep import unsupported as blocks_unsupported

    path = resolve_model_path(cfg.model)
    gg = load_gguf(path)
    lib, isa = None, None
    model_cls = model_class(gg.hparams.architecture)
    if unsupported(gg, model_cls.native_decoder) is None:
        try:
            lib, isa_path = load_checked()[:2]
            isa = isa_path.name
        except NativeUnavailable:
            pass
    elif blocks_unsupported(gg, model_cls) is None and loaded().lib is not None:
        lib, isa = BlockLibrary(loaded()), f"blocks-{loaded().isa}"
    threads = cfg.resolved_threads()
    torch.set_num_threads(threads)
    model = build(gg, cfg, {op: 0 for op in OPS})
    key = cache_key(path, threads, isa)
    cal = calibrate(gg, model, lib, threads, key, budget_s)
    save(cal)
    return cal


def apply_dense_above(model: Decoder, dense_above: dict[str, int], drop: bool = True) -> None:
    """Set each op's threshold; ops without one never use their dense copy, and drop it (its
    memory) unless ``drop`` is False."""
    for L in model.layers:
        for op in ("qkv", "o", "gate_up", "down"):
            _apply(getattr(L, op), dense_above.get(op), drop)
    _apply(model.lm_head, dense_above.get("lm_head"), drop)


def _apply(lin, rows: int | None, drop: bool) -> None:
    if rows is not None:
        lin.dense_above = rows
    elif drop:
        lin.dense = None
    else:
        lin.dense_above = 1 << 62
