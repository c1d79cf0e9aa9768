"""CUDA C++ backend: NVRTC compiles the source to a cubin for the target SM (no nvcc, no host
compiler); on a device the GPU worker (gpu_worker.py) loads the cubin through the driver API and
launches it with the geometry the source declares.

NVRTC needs no GPU, so a CPU machine gives `build_failed` with NVRTC's log for real; verification
and timing need a device. The kernel must be ``extern "C" __global__ void <problem name>(...)``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
from functools import cache

from swarmfactory.backends.base import Artifact, BuildError, Language, MissingTool
from swarmfactory.backends.c import cache_dir
from swarmfactory.backends.gpu_worker import parse_launch
from swarmfactory.backends.gputools import NvidiaBackend, find_nvrtc, target_arch


@cache
def _nvrtc():
    path = find_nvrtc()
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def _check(lib, status: int, what: str) -> None:
    if status != 0:
        raise BuildError(f"NVRTC {what}: {lib.nvrtcGetErrorString(status).decode()}")


def nvrtc_compile(source: str, arch: str, options: tuple[str, ...] = ()) -> tuple[bytes, str]:
    """(cubin, log) for ``source``; BuildError carrying NVRTC's log when it does not compile."""
    lib = _nvrtc()
    if lib is None:
        raise MissingTool("NVRTC not found: install the CUDA toolkit or pip install nvidia-cuda-nvrtc-cu12")
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None), "create")
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", *options]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        status = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if status != 0:
            lines = [ln for ln in log.splitlines() if ln.strip()]
            raise BuildError("NVRTC error:\n" + "\n".join(lines[:12])[:1500], log)
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(prog, cubin), "cubin")
        return cubin.raw, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


class CUDABackend(NvidiaBackend):
    name = "cuda"
    extensions = (".cu",)
    language = Language(name="CUDA", fence="cuda", fences=("", "cuda", "cu", "cpp", "c++", "c"),
                        system_prompt="system.cuda.md.j2")

    @cache
    def versions(self) -> dict[str, str]:
        lib = _nvrtc()
        if lib is None:
            return {"nvrtc": "missing", "arch": target_arch()}
        major, minor = ctypes.c_int(), ctypes.c_int()
        lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        return {"nvrtc": f"{major.value}.{minor.value}", "arch": target_arch()}

    def build(self, source: str, symbol: str, flags: tuple[str, ...] | None = None,
              prototype: str | None = None, checks: bool = False, load_checks: bool = True) -> Artifact:
        if not re.search(rf'extern\s+"C"[^;{{]*__global__[^;{{]*\b{re.escape(symbol)}\s*\(', source):
            raise BuildError(f'no `extern "C" __global__ void {symbol}(...)` in the source')
        try:
            launch = parse_launch(source)
        except ValueError as exc:
            raise BuildError(str(exc)) from None
        arch = target_arch()
        flags = tuple(flags or ())
        key = hashlib.sha256("\0".join([source, symbol, arch, " ".join(flags), self.versions()["nvrtc"]])
                             .encode()).hexdigest()[:24]
        out = cache_dir() / f"cuda-{key}.cubin"
        if out.exists():
            return Artifact(str(out), symbol, key, cached=True, info={"arch": arch, "launch": launch})
        cubin, log = nvrtc_compile(source, arch, flags)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(cubin)
        os.replace(tmp, out)
        return Artifact(str(out), symbol, key, log=log, info={"arch": arch, "launch": launch})
