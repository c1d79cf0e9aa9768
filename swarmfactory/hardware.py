"""What machine this is: the hardware fingerprint that is part of every build and result key."""

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


@cache
def cpu_fingerprint() -> dict:
    """CPU model, SIMD features and core count; ``id`` is a short hash of them."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    model = info.get("model name") or info.get("Hardware") or platform.processor() or platform.machine()
    fp = {
        "model": model,
        "arch": platform.machine(),
        "features": [f for f in SIMD_FLAGS if f in flags],
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    fp["id"] = hashlib.sha256(repr(sorted(fp.items())).encode()).hexdigest()[:12]
    return fp


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
