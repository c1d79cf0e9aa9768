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
import math
import os
import platform
from functools import cache
from pathlib import Path

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
    # described, not identifying: the id stays what it was before these were recorded
    caches = cache_sizes()
    if caches:
        fp["caches"] = caches
    fp.update(microarchitecture(info))
    return fp


def microarchitecture(info: dict[str, str] | None = None) -> dict:
    """The CPU's vendor and its family, model and stepping numbers (``vendor``, ``family``,
    ``cpu_model``, ``stepping``; those /proc/cpuinfo states): a marketing name ("AMD EPYC")
    covers several microarchitectures, these numbers name one (AMD family 25 model 17 is Zen 4,
    model 1 Zen 3)."""
    info = _cpuinfo() if info is None else info
    out: dict = {}
    vendor = info.get("vendor_id") or info.get("CPU implementer")
    if vendor:
        out["vendor"] = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(vendor, vendor)
    for key, name in (("cpu family", "family"), ("model", "cpu_model"), ("stepping", "stepping"),
                      ("CPU architecture", "family"), ("CPU part", "cpu_model"), ("CPU variant", "stepping")):
        value = info.get(key)
        if value and name not in out:
            try:
                out[name] = int(value, 0)
            except ValueError:
                continue
    return out


def cache_dir() -> Path:
    """This machine's cache directory: ``SWARMFACTORY_CACHE``, else ``$XDG_CACHE_HOME/swarmfactory``
    (``~/.cache/swarmfactory``). Builds, calibrations, journals and the machine's measured figures
    live under it."""
    root = os.environ.get("SWARMFACTORY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "swarmfactory")
    return Path(root)


BANDWIDTH_BYTES = 64 << 20   # each of the two buffers of the bandwidth probe


def memory_bandwidth(refresh: bool = False) -> float | None:
    """This machine's memory copy bandwidth in GB/s (bytes read plus written per second, the best
    of five 64 MiB copies), measured once per machine and kept in the cache directory; None where
    it cannot be measured. The best of five is the machine's, not the load's: other work running
    now lowers some copies, rarely all five."""
    import json

    path = cache_dir() / "machine" / f"{cpu_fingerprint()['id']}.json"
    if not refresh:
        try:
            return float(json.loads(path.read_text())["bandwidth_gbs"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        import time

        import numpy as np

        src = np.ones(BANDWIDTH_BYTES // 8)
        dst = np.empty_like(src)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - t0)
        gbs = round(2 * BANDWIDTH_BYTES / best / 1e9, 1)
    except Exception:  # numpy missing or no memory for the buffers: the profile goes without it
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"bandwidth_gbs": gbs, "bytes": BANDWIDTH_BYTES}))
        os.replace(tmp, path)
    except OSError:
        pass
    return gbs


def machine_profile() -> dict:
    """This machine as lessons and cost-model rows describe where they come from: the fingerprint
    (model, SIMD features, cores, caches, vendor, family/model numbers) and its memory bandwidth
    (``bandwidth_gbs``, measured once)."""
    fp = dict(cpu_fingerprint())
    bw = memory_bandwidth()
    if bw:
        fp["bandwidth_gbs"] = bw
    return fp


# How much each difference between two machines lowers their similarity (``similarity``).
OTHER_VENDOR = 0.5          # AMD against Intel
OTHER_FAMILY = 0.65         # same vendor, another CPU family
OTHER_MODEL = 0.8           # same vendor and family, another model (AMD Zen 3 against Zen 4)
OTHER_NAME = 0.6            # no numbers recorded and the model names differ
SIZE_SCALE = {"l1d": 0.25, "l2": 0.25, "l3": 0.25, "cpus": 0.25, "bandwidth_gbs": 0.5}


def similarity(a: dict | None, b: dict | None) -> float:
    """How far what is fast on machine ``a`` is evidence of what is fast on ``b``, in [0, 1]: 1 for
    the same machine (same fingerprint id), otherwise the product of

    * the microarchitecture: x ``OTHER_VENDOR`` for another vendor, x ``OTHER_FAMILY`` for another
      family of the same vendor, x ``OTHER_MODEL`` for another model of the same family (only the
      model names compared, x ``OTHER_NAME`` where they differ, for a machine described without
      the numbers);
    * the instruction sets: the Jaccard similarity of their SIMD features (an AVX2 machine against
      an AVX-512 one: 0.5);
    * each size both describe (L1d, L2, L3, cores, memory bandwidth): ``exp(-scale x |log2 ratio|)``
      (a cache twice the size: 0.78).

    An AMD Zen 4 against an Intel Sapphire Rapids comes out near 0.2, against an AMD Zen 3 near
    0.35, against itself masked to AVX2 0.5. Fields either machine lacks are not compared."""
    a, b = a or {}, b or {}
    if a.get("id") and a.get("id") == b.get("id"):
        return 1.0
    s = 1.0
    if a.get("vendor") and b.get("vendor"):
        if a["vendor"] != b["vendor"]:
            s *= OTHER_VENDOR
        elif a.get("family") != b.get("family"):
            s *= OTHER_FAMILY
        elif a.get("cpu_model") != b.get("cpu_model"):
            s *= OTHER_MODEL
    elif (a.get("model") or "") != (b.get("model") or ""):
        s *= OTHER_NAME
    fa = {f for f in a.get("features") or () if f in SIMD_FLAGS}
    fb = {f for f in b.get("features") or () if f in SIMD_FLAGS}
    if fa or fb:
        s *= len(fa & fb) / len(fa | fb)
    ca, cb = a.get("caches") or {}, b.get("caches") or {}
    for key, scale in SIZE_SCALE.items():
        x = ca.get(key) if key in ("l1d", "l2", "l3") else a.get(key)
        y = cb.get(key) if key in ("l1d", "l2", "l3") else b.get(key)
        try:
            if x and y and float(x) > 0 and float(y) > 0:
                s *= math.exp(-scale * abs(math.log2(float(x) / float(y))))
        except (TypeError, ValueError):
            continue
    return s


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
