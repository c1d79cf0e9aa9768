"""The native decoder's ISA paths: what each needs from the CPU and the flags that build it."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from swarmfactory.hardware import cpu_features

BASE_FLAGS = ("-O3", "-fopenmp", "-std=gnu11")


@dataclass(frozen=True)
class IsaPath:
    """One way to build decode.c: the CPU flags (/proc/cpuinfo names) it needs to run, and the
    compiler flags that target exactly those."""

    name: str
    needs: frozenset[str]
    flags: tuple[str, ...]

    def missing(self, features: frozenset[str]) -> list[str]:
        return sorted(self.needs - features)


_X86 = platform.machine().lower() in ("x86_64", "amd64")
_V3 = frozenset({"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"})  # x86-64-v3
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}  # x86-64-v4
# Best first. The SIMD paths are x86-64 only; elsewhere the portable path builds with the
# compiler's default target.
PATHS: tuple[IsaPath, ...] = (
    IsaPath("avx512vnni", _V4 | {"avx512_vnni"}, ("-march=x86-64-v4", "-mavx512vnni")),
    IsaPath("avxvnni", _V3 | {"avx_vnni"}, ("-march=x86-64-v3", "-mavxvnni")),
    IsaPath("avx2", _V3, ("-march=x86-64-v3",)),
    IsaPath("portable", frozenset(), ("-march=x86-64",) if _X86 else ()),
) if _X86 else (IsaPath("portable", frozenset(), ()),)


def path_named(name: str) -> IsaPath:
    for p in PATHS:
        if p.name == name:
            return p
    raise ValueError(f"no native ISA path {name!r} on this architecture (known: {', '.join(p.name for p in PATHS)})")


def runnable_paths(features: frozenset[str] | None = None) -> list[IsaPath]:
    """The paths this CPU (as masked, see swarmfactory.hardware) can execute, best first."""
    features = cpu_features() if features is None else features
    return [p for p in PATHS if not p.missing(features)]
