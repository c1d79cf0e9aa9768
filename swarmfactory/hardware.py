"""What machine this is: the hardware fingerprint that is part of every build and result key,
and the instruction sets code may use on it.

``SWARMFACTORY_CPU_MASK`` caps the instruction sets this process reports (``avx2``: no
AVX-512, AVX-VNNI, AMX or bf16 hardware; ``avxvnni``: AVX2 plus AVX-VNNI; ``portable``: no
SIMD beyond baseline x86-64), so an AVX-512 machine can run the code paths of an older one.
It masks what swarmfactory decides, not torch's own dispatch: set ``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA`` and ``MKL_ENABLE_INSTRUCTIONS`` too (``torch_env_for_mask``) to emulate
the older machine fully.
"""

from __future__ import annotations

import hashlib
import os
import platform
from functools import cache

SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
              "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "neon", "asimd", "sve")


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, _, v = line.partition(":")
                    info.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return info


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


MASK_ENV = "SWARMFACTORY_CPU_MASK"

# The SIMD flags each mask level keeps (x86-64-v3 is AVX2 + FMA + F16C + BMI1/2 + LZCNT + MOVBE);
# every other SIMD flag is dropped. Non-SIMD flags always stay.
_V3 = frozenset({"sse", "sse2", "ssse3", "sse3", "pni", "sse4_1", "sse4_2", "popcnt", "avx", "avx2", "fma",
                 "f16c", "bmi1", "bmi2", "abm", "lzcnt", "movbe", "xsave"})
MASK_LEVELS: dict[str, frozenset[str]] = {
    "avxvnni": _V3 | {"avx_vnni"},
    "avx2": _V3,
    "portable": frozenset({"sse", "sse2"}),
}
_SIMD_PREFIXES = ("sse", "ssse", "pni", "avx", "amx", "fma", "f16c", "bmi", "abm", "lzcnt", "movbe",
                  "popcnt", "xsave", "vaes", "vpclmul", "gfni", "sha_ni")


class MaskError(ValueError):
    """SWARMFACTORY_CPU_MASK names no known level."""


def cpu_mask() -> str | None:
    """The mask level from SWARMFACTORY_CPU_MASK, or None when unset (read on every call, so
    a test can set it for one engine)."""
    level = os.environ.get(MASK_ENV, "").strip().lower()
    if level in ("", "none", "off"):
        return None
    if level not in MASK_LEVELS:
        raise MaskError(f"{MASK_ENV}={level!r} is not a mask level (use one of {', '.join(MASK_LEVELS)})")
    return level


@cache
def _host_flags() -> frozenset[str]:
    info = _cpuinfo()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def cpu_features(mask: str | None = ...) -> frozenset[str]:
    """This CPU's feature flags (/proc/cpuinfo), less those the mask level removes.

    ``mask`` defaults to SWARMFACTORY_CPU_MASK. Empty where /proc/cpuinfo is unreadable, so code
    that needs a flag takes its portable path there.
    """
    flags = _host_flags()
    level = cpu_mask() if mask is ... else mask
    if level is None:
        return flags
    keep = MASK_LEVELS[level]
    return frozenset(f for f in flags if f in keep or not f.startswith(_SIMD_PREFIXES))


def torch_env_for_mask(level: str) -> dict[str, str]:
    """Environment variables that cap torch's own kernels (ATen, oneDNN, MKL) at a mask level;
    they must be set before the process starts."""
    isa = {"avxvnni": ("avx2", "AVX2_VNNI", "AVX2"), "avx2": ("avx2", "AVX2", "AVX2"),
           "portable": ("default", "SSE41", "SSE4_2")}[level]
    return {MASK_ENV: level, "ATEN_CPU_CAPABILITY": isa[0], "ONEDNN_MAX_CPU_ISA": isa[1],
            "MKL_ENABLE_INSTRUCTIONS": isa[2]}


def march_flags() -> tuple[str, ...]:
    """Compiler target flags for code built for this machine: -march=native, or under a mask
    the explicit level it allows (so nothing is compiled for an instruction the emulated
    machine lacks)."""
    level = cpu_mask()
    if level is None or platform.machine().lower() not in ("x86_64", "amd64"):
        return ("-march=native",)
    return {"avxvnni": ("-march=x86-64-v3", "-mavxvnni"), "avx2": ("-march=x86-64-v3",),
            "portable": ("-march=x86-64",)}[level]


@cache
def cpu_fingerprint() -> dict:
    """CPU model, SIMD features (as masked) and core count; ``id`` is a short hash of them."""
    info = _cpuinfo()
    flags = cpu_features()
    model = info.get("model name") or info.get("Hardware") or platform.processor() or platform.machine()
    fp = {
        "model": model,
        "arch": platform.machine(),
        "features": [f for f in SIMD_FLAGS if f in flags],
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    if cpu_mask():
        fp["mask"] = cpu_mask()
    fp["id"] = hashlib.sha256(repr(sorted(fp.items())).encode()).hexdigest()[:12]
    caches = cache_sizes()
    if caches:  # described, not identifying: the id stays what it was before caches were recorded
        fp["caches"] = caches
    return fp


def cache_sizes() -> dict[str, int]:
    """Data cache sizes in KiB as the kernel reports them for CPU 0 (``l1d``, ``l2``, ``l3``); {}
    where sysfs does not say."""
    out = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    for i in range(8):
        level, kind, size = (_read(f"{base}/index{i}/{f}") for f in ("level", "type", "size"))
        if not (level and kind and size) or kind.strip() == "Instruction":
            continue
        text = size.strip().upper()
        mult = 1024 if text.endswith("M") else 1
        try:
            out[f"l{level.strip()}{'d' if level.strip() == '1' else ''}"] = int(text.rstrip("KM")) * mult
        except ValueError:
            continue
    return out


def environment_snapshot() -> dict:
    """Conditions of a measurement that do not change its key but explain its noise."""
    snap = {"loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
            "python": platform.python_version()}
    try:
        import numpy
        import torch

        snap["torch"] = torch.__version__
        snap["numpy"] = numpy.__version__
    except ImportError:
        pass
    return snap
