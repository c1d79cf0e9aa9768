"""What the NVIDIA backends (triton, cuda, ptx) share: their runner and target, and where the
NVIDIA compilers are: ``ptxas`` and NVRTC from $CUDA_HOME, PATH or the NVIDIA PyPI wheels
(``nvidia-cuda-nvcc-cu12``, ``nvidia-cuda-nvrtc-cu12``; Triton also bundles a ptxas).
None of them needs a GPU: a CPU machine builds (and rejects) PTX and CUDA C++ for real."""

from __future__ import annotations

import glob
import os
import shutil
import sysconfig
from pathlib import Path

from swarmfactory.backends.base import Backend


class NvidiaBackend(Backend):
    """A backend for NVIDIA GPUs: its artifacts run in a Python worker process per candidate
    (``backends/gpu_worker.py``, started by harness/gpu.py), built for the SM ``target_arch``
    names."""

    runner = "gpu"
    # what runs this backend's artifacts on a machine without a GPU, as a verdict's evidence names
    # it; None: nothing does, so verification there ends at the build (`needs_device`)
    interpreter: str | None = None

    def target(self) -> dict[str, str]:
        return {"arch": target_arch()}


def target_arch() -> str:
    """The SM to compile for: $SWARMFACTORY_CUDA_ARCH (e.g. sm_90), this machine's GPU, or
    sm_90 (H100/H200)."""
    env = os.environ.get("SWARMFACTORY_CUDA_ARCH")
    if env:
        return env
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:  # a broken CUDA install: compile for the default
        pass
    return "sm_90"


def _site_dirs() -> list[Path]:
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return [Path(d) for d in dirs if d]


def find_ptxas() -> str | None:
    cands = []
    if os.environ.get("CUDA_HOME"):
        cands.append(Path(os.environ["CUDA_HOME"]) / "bin" / "ptxas")
    which = shutil.which("ptxas")
    if which:
        cands.append(Path(which))
    for site in _site_dirs():
        cands += [site / "nvidia" / "cuda_nvcc" / "bin" / "ptxas",
                  site / "triton" / "backends" / "nvidia" / "bin" / "ptxas"]
    return next((str(c) for c in cands if c.is_file() and os.access(c, os.X_OK)), None)


def find_nvrtc() -> str | None:
    cands = []
    if os.environ.get("CUDA_HOME"):
        cands += sorted(glob.glob(os.path.join(os.environ["CUDA_HOME"], "lib64", "libnvrtc.so*")))
    for site in _site_dirs():
        cands += sorted(glob.glob(str(site / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.*")))
    cands += ["libnvrtc.so.12", "libnvrtc.so"]
    import ctypes

    for c in cands:
        if "alt" in os.path.basename(c) or "builtins" in os.path.basename(c):
            continue
        try:
            ctypes.CDLL(c)
            return c
        except OSError:
            continue
    return None
