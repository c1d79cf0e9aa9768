"""Which code paths an engine runs on this machine, decided once at load.

``plan`` probes what this CPU and torch build can run (engine/capabilities.py, and the native
decoder's ISA paths in engine/native), logs one line per path that falls back, and settles the
switch points: the config's values where it gives them, else this machine's measured ones
(engine/calibrate.py, cached). The result is reported by ``engine serve`` and ``/health``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QT

from swarmfactory.hardware import MASK_ENV, cpu_fingerprint, cpu_mask, torch_env_for_mask

from . import calibrate as cal_mod
from .capabilities import check, fallback
from .config import DEFAULT_DENSE_ABOVE, OPS, EngineConfig
from .kernels import Dense
from .models import model_class
from .models.decoder import Decoder
from .native import NativeUnavailable, load_checked, matvec, unsupported
from .native_ops import resolve_elements
from .native_seam import check_used, describe, resolve_all
from .supply import KernelSupply, NoSupply

log = logging.getLogger("swarmfactory.engine")


@dataclass
class Paths:
    """What runs where. ``thresholds`` says where the switch points came from."""

    cpu: str
    mask: str | None
    torch_cpu: str
    dense: str | None  # how dense matmuls run (None: fp32 engine, plain sgemm)
    q4_kernel: str | None  # the q4_1 engine's matmul kernel for small batches
    native: str | None  # the native decoder's ISA path, None when off
    native_decode: int = 0
    native_prefill: int = 0
    dense_above: dict[str, int] = field(default_factory=dict)
    thresholds: str = "config"
    fallbacks: list[str] = field(default_factory=list)
    native_kernels: dict[str, dict] = field(default_factory=dict)  # op -> shared object (native_seam)
    native_matvec: dict | None = None  # the decoder's Q4_1 matvec from the factory (native/matvec.py)
    native_matmul: dict[str, dict] = field(default_factory=dict)  # block type -> the factory's kernel (native/qext.py)
    kernels: dict[str, str] = field(default_factory=dict)  # op -> the kernel(s) its layers run

    def as_dict(self) -> dict:
        return {"cpu": self.cpu, "mask": self.mask, "torch_cpu": self.torch_cpu, "dense": self.dense,
                "q4_kernel": self.q4_kernel, "native": self.native, "native_decode": self.native_decode,
                "native_prefill": self.native_prefill, "dense_above": dict(self.dense_above),
                "thresholds": self.thresholds, "fallbacks": list(self.fallbacks),
                "native_kernels": {op: dict(v) for op, v in self.native_kernels.items()},
                "native_matvec": dict(self.native_matvec) if self.native_matvec else None,
                "native_matmul": {t: dict(v) for t, v in self.native_matmul.items()},
                "kernels": dict(self.kernels)}

    def summary(self) -> str:
        """One line for logs and `engine serve`."""
        parts = [f"cpu {self.cpu}" + (f" masked to {self.mask}" if self.mask else ""),
                 f"torch {self.torch_cpu}"]
        if self.dense:
            parts.append(f"dense: {self.dense}")
        if self.q4_kernel:
            parts.append(f"q4_1 kernel: {self.q4_kernel}")
            if set(self.kernels.values()) - {"int4pack", "int4x2"}:  # the file has other block types
                parts.append("kernels " + ", ".join(f"{op}={k}" for op, k in self.kernels.items()))
            parts.append("dense_above " + (", ".join(f"{k}>{v}" for k, v in self.dense_above.items()) or "none"))
        if self.native:
            mv = self.native_matvec
            parts.append(f"native decoder {self.native}"
                         + (f" (q4_1 matvec: candidate {mv['candidate']} of {mv['origin']})" if mv else "")
                         + f": <= {self.native_decode} sequences"
                         + (f" + {self.native_prefill} prompt tokens a call" if self.native_prefill
                            else " a call, prompts on torch"))
        elif self.q4_kernel:
            parts.append("native decoder off")
        if self.q4_kernel:
            parts.append(f"thresholds: {self.thresholds}")
        if self.native_matmul:
            parts.append("block kernels from the factory: "
                         + ", ".join(f"{t}=candidate {v['candidate'][:12]} of {v['origin']}"
                                     for t, v in self.native_matmul.items()))
        if self.native_kernels:
            parts.append("native kernels: "
                         + ", ".join(f"{op}={v['short']}" for op, v in self.native_kernels.items()))
        return "; ".join(parts)


def _cpu_name() -> str:
    fp = cpu_fingerprint()
    simd = [f for f in fp["features"] if f.startswith("avx512") or f in ("avx2", "avx_vnni")]
    level = "avx512" if any(f.startswith("avx512") for f in simd) else ("avx2" if "avx2" in simd else "baseline")
    return f"{fp['model']} ({level})"


def plan(cfg: EngineConfig, gg, model_path: Path, supply: KernelSupply | None = None
         ) -> tuple[Decoder, "object | None", Paths]:
    """Build the torch model and decide every path: returns (model, native library or None,
    paths). The native decoder itself is built by the engine once its KV cache exists, for the
    architectures it computes (llama); for others it is off, with a line saying why.
    ``supply`` builds the kernel-factory kernels the config names (``engine/supply.py``)."""
    q4 = cfg.weights == "q4_1"
    paths = _torch_paths(cfg)
    # Shared objects the config names (so:PATH, champion:PROBLEM): looked up afresh at each load,
    # before the model is built (each weight is then checked as its op is built).
    classes = resolve_all(cfg.kernels, supply)
    elements = resolve_elements(cfg.kernels, supply)  # the norms and the activation (native_ops.py)
    paths.native_kernels = describe({**classes, **elements})
    model_cls = model_class(gg.hparams.architecture)
    lib = None
    if cfg.native_applies():
        why = unsupported(gg, model_cls.native_decoder)
        lib = _native(cfg, paths, supply) if why is None else _blocks(cfg, gg, model_cls, paths, why)

    qexts = _load_native_matmul(cfg, paths, supply) if cfg.native_matmul else None

    threads = cfg.resolved_threads()
    need = q4 and (cfg.dense_above is None
                   or (lib is not None and (cfg.native_decode is None or cfg.native_prefill is None)))
    cal = key = None
    if need:
        native_key = (paths.native if not paths.native_matvec
                      else f"{paths.native}+{matvec.PROBLEM}:{paths.native_matvec['candidate']}")
        for t, v in sorted(paths.native_matmul.items()):  # thresholds measured with the factory's kernels
            native_key = f"{native_key}+{t}:{v['candidate']}"
        key = cal_mod.cache_key(model_path, threads, native_key)
        cal = cal_mod.load_cached(key, model_path)
    # Thresholds are measured for the default kernels: an engine whose config names kernels
    # uses stored ones (or the shipped defaults) and never measures, and its named kernels
    # always run (no dense copy), as with the native decoder.
    measure_now = need and cal is None and not cfg.kernels
    dense_above = _dense_above(cfg, cal, paths)
    # A calibration measures every op's dense copy; the final thresholds then drop the losers.
    model = model_cls(gg, cfg, ({op: 0 for op in OPS} if measure_now else dense_above) if q4 else None,
                      {**classes, **elements})
    ops = {op: [getattr(L, op) for L in model.layers] for op in ("qkv", "o", "gate_up", "down")}
    check_used({**ops, "lm_head": [model.lm_head]}, classes)
    model.qexts = _attach_native_matmul(qexts, gg, model, lib) if qexts is not None else None
    paths.kernels = _kernels(model)
    if measure_now:
        log.info("measuring this machine's thresholds (first load; cached afterwards)")
        cal = cal_mod.calibrate(gg, model, lib, threads, key)
        where = cal_mod.save(cal)
        log.info("calibration done in %.1f s: %s", cal.seconds, where)
        if cfg.dense_above is None:
            dense_above = dict(cal.dense_above)
        cal_mod.apply_dense_above(model, dense_above)
        paths.thresholds = f"measured now in {cal.seconds:.1f} s"
    elif cal is not None:
        paths.thresholds = "measured on this machine (cached)"
    if cal is not None and cal.incomplete:
        paths.thresholds += f"; defaults for {', '.join(cal.incomplete)} (out of time)"
    if cfg.dense_above is not None and (cfg.native_decode is not None and cfg.native_prefill is not None
                                        or lib is None):
        paths.thresholds = "config"
    paths.dense_above = dense_above if q4 and check("int4pack").ok else {}

    if lib is not None:
        nd = cfg.native_decode if cfg.native_decode is not None else (cal.native_decode if cal else 0)
        npf = cfg.native_prefill if cfg.native_prefill is not None else (cal.native_prefill if cal else 0)
        # measured (no native_decode in the config): the native decoder, where it is on at all,
        # takes every decode row, in one call up to max_batch. A threshold that sent larger decode
        # batches to torch would give a sequence other numbers (bf16 activations where the native
        # step quantises to 8 bits) when more sequences decode beside it: Gemma 3 270M's default
        # design on a Zen 4 (measured native_decode 8 of max_batch 64) failed "under load vs
        # alone" at token 15. An explicit native_decode below max_batch still holds: larger
        # batches run in several native calls (model_runner.run), never on torch.
        paths.native_decode = min(nd, cfg.max_batch) if cfg.native_decode is not None or not nd else cfg.max_batch
        # measured, likewise for prompts: where the native step won at all, it takes every prompt
        # chunk the scheduler makes (prefill_chunk), so a prompt row never moves to torch because
        # another prompt shares its step. Chunks of the measured size instead (the native step's
        # largest win over torch per step: 16 tokens on a Zen 4) kept the tokens but took 8x the
        # steps to admit prompts: Gemma 3 270M at 64 streams, 128x128, TTFT p99 34.1 s against
        # 13.5 s with chunks of 256, at the same output tok/s (206.0, 204.5)
        paths.native_prefill = (min(npf, cfg.prefill_chunk) if cfg.native_prefill is not None or not npf
                                else cfg.prefill_chunk)
        if not paths.native_decode:
            paths.native, paths.native_matvec, lib = None, None, None
    return model, lib, paths


def _kernels(model: Decoder) -> dict[str, str]:
    """op -> the kernel its layers run (several, joined with "+", where types differ by layer)."""
    ops = {op: [getattr(L, op) for L in model.layers] for op in ("qkv", "o", "gate_up", "down")}
    ops["lm_head"] = [model.lm_head]
    out = {op: "+".join(sorted({type(lin.kernel).name for lin in lins})) for op, lins in ops.items()}
    return {**out, **{op: type(k).name for op, k in model.ops.kernels.items()}}


def _torch_paths(cfg: EngineConfig) -> Paths:
    """The paths torch gives this config on this CPU, with the fallbacks it forces."""
    act = torch.float32 if cfg.weights == "fp32" else torch.bfloat16
    paths = Paths(cpu=_cpu_name(), mask=cpu_mask(), torch_cpu=torch.backends.cpu.get_cpu_capability(),
                  dense=Dense.path(act) if cfg.weights != "fp32" else None, q4_kernel=None, native=None)
    if paths.mask and ("AVX512" in paths.torch_cpu or (paths.mask == "portable" and paths.torch_cpu != "DEFAULT")):
        log.warning("%s=%s masks swarmfactory's paths, but torch still dispatches %s kernels; set %s to "
                    "emulate the machine fully", MASK_ENV, paths.mask, paths.torch_cpu,
                    " ".join(f"{k}={v}" for k, v in torch_env_for_mask(paths.mask).items() if k != MASK_ENV))
    if cfg.weights != "fp32" and not check("bf16_prepack").ok:
        paths.fallbacks.append(fallback("bf16 oneDNN prepacked matmul", check("bf16_prepack").reason,
                                        "fp32 sgemm on bf16-rounded weights"))
    if cfg.weights == "q4_1":
        if check("int4pack").ok:
            paths.q4_kernel = "torch int4pack"
        else:
            from .native.qlinear import loaded

            native = loaded()
            paths.q4_kernel = f"qnative ({native.isa})" if native.lib is not None else f"dense ({paths.dense})"
            paths.fallbacks.append(fallback("torch int4 kernel", check("int4pack").reason,
                                            "the native block kernels (qnative)" if native.lib is not None
                                            else "dense copies of the dequantised weights"))
        if cfg.kernels:
            paths.q4_kernel += " (config names: " + ", ".join(f"{k}={v}" for k, v in cfg.kernels.items()) + ")"
    return paths


def _native(cfg: EngineConfig, paths: Paths, supply: KernelSupply | None):
    """The native decoder's library for this CPU (with the factory's matvec if the config names
    one), or None where it cannot run and was not asked for explicitly (a fallback then)."""
    try:
        lib, isa, fbs = load_checked()
    except NativeUnavailable as e:
        if cfg.native_decode or cfg.native_matvec:  # asked for explicitly
            raise
        paths.fallbacks.append(fallback("native decoder", str(e), "torch for every step"))
        return None
    paths.native = isa.name
    paths.fallbacks += fbs
    if cfg.native_matvec:  # the factory's kernel, for the path just checked
        mv = matvec.resolve(cfg.native_matvec, supply)
        lib = matvec.load(mv, isa, (supply or NoSupply()).on_wrong)
        paths.native_matvec = matvec.describe(mv)
    return lib


def _load_native_matmul(cfg: EngineConfig, paths: Paths, supply: KernelSupply | None):
    """The factory's kernels ``cfg.native_matmul`` names (``native/qext.py``), built, loaded and
    checked; NativeUnavailable naming the kernel where one fails."""
    from .native import qext
    from .native.qlinear import loaded

    got = loaded()
    if got.lib is None:
        raise NativeUnavailable(f"native_matmul: the engine's block kernels are unavailable here: {got.reason}")
    exts = qext.load(cfg.native_matmul, got.lib, supply)
    paths.native_matmul = exts.describe()
    return exts


def _attach_native_matmul(exts, gg, model, lib):
    """``exts`` attached to every weight the engine's block kernels run: the ``qnative`` ops of
    ``model`` and, through ``lib`` (a ``BlockLibrary``), the block step's. NativeUnavailable
    naming a kernel that would run no weight of this engine."""
    from .native.qlinear import QNative
    from .native.qstep import BlockLibrary, linear_names

    linears = [getattr(L, op) for L in model.layers for op in ("qkv", "o", "gate_up", "down")] + [model.lm_head]
    for lin in linears:
        if isinstance(lin.kernel, QNative):
            exts.attach(lin.kernel.packed)
    blocks = isinstance(lib, BlockLibrary)
    if blocks:
        lib.qexts = exts
    types = {gg.tensor(n).qtype for _, names in linear_names(gg) for n in names}
    on_qnative = {QT(p.type) for lin in linears if isinstance(lin.kernel, QNative) for p in lin.kernel.packed.parts}
    for qt, k in exts.kernels.items():
        runs = (blocks and qt in types) or qt in on_qnative
        if not runs:
            where = ("the block step does not run this model" if not blocks
                     else f"its weights are {', '.join(sorted(t.name for t in types))}")
            raise NativeUnavailable(f"{k.built.spec}: no {qt.name} weight of this engine runs on the engine's "
                                    f"block kernels ({where}); it would run nowhere")
    return exts


def _blocks(cfg: EngineConfig, gg, model_cls, paths: Paths, why: str):
    """The native block step (``native/qstep.c``) where decode.c cannot compute the model
    (``why``): a ``BlockLibrary``, or None with one fallback line saying why neither runs."""
    from .native.qlinear import loaded
    from .native.qstep import BlockLibrary
    from .native.qstep import unsupported as blocks_unsupported

    why_blocks = ("the config names a factory matvec for decode.c (native_matvec)" if cfg.native_matvec
                  else blocks_unsupported(gg, model_cls))
    got = loaded() if why_blocks is None else None
    if got is not None and got.lib is None:
        why_blocks = got.reason
    if why_blocks is not None:
        paths.fallbacks.append(fallback("native decoder", f"{why}; the native block step: {why_blocks}",
                                        "torch for every step"))
        return None
    log.info("native decoder: decode.c does not apply (%s); the native block step computes this model", why)
    paths.native = f"blocks-{got.isa}"
    return BlockLibrary(got)


def _dense_above(cfg: EngineConfig, cal, paths: Paths) -> dict[str, int]:
    """op -> rows above which a q4_1 op runs its dense copy: the config's, else the measured
    ones, else (a config naming kernels) the shipped defaults; never for an op the config names."""
    if cfg.dense_above is not None:
        return dict(cfg.dense_above)
    if cal is not None:
        dense_above = dict(cal.dense_above)
    elif cfg.kernels:
        dense_above = dict(DEFAULT_DENSE_ABOVE)
        paths.thresholds = "shipped defaults (the config names kernels)"
    else:
        dense_above = {}
    return {op: v for op, v in dense_above.items() if op not in cfg.kernels}
