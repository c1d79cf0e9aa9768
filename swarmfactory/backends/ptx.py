"""PTX backend: raw PTX assembled by ``ptxas`` into a cubin for the target SM; on a device the
GPU worker (gpu_worker.py) loads the cubin through the CUDA driver API (cuModuleLoadData) and
launches it with the geometry the source declares.

Without a GPU the build is still real: ``ptxas`` from the CUDA toolkit or the NVIDIA wheels
rejects bad PTX with its own message (`build_failed`); verification and timing need a device.
The kernel's entry must be ``.visible .entry <problem name>``.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from functools import cache
from pathlib import Path

from swarmfactory import lifecycle
from swarmfactory.backends.base import Artifact, BuildError, Language, MissingTool
from swarmfactory.backends.c import BUILD_TIMEOUT_S, _limit_compiler, cache_dir
from swarmfactory.backends.gpu_worker import parse_launch
from swarmfactory.backends.gputools import NvidiaBackend, find_ptxas, target_arch


def _excerpt(log: str, limit: int = 1500) -> str:
    lines = [ln for ln in log.splitlines() if ln.strip()]
    return "\n".join(lines[:12])[:limit]


class PTXBackend(NvidiaBackend):
    name = "ptx"
    extensions = (".ptx",)
    language = Language(name="PTX", fence="ptx", fences=("", "ptx", "asm"), system_prompt="system.ptx.md.j2",
                        definition=r"\.entry\s+{symbol}\s*\(")

    @cache
    def versions(self) -> dict[str, str]:
        ptxas = find_ptxas()
        if ptxas is None:
            return {"ptxas": "missing", "arch": target_arch()}
        out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30).stdout
        return {"ptxas": (out.strip().splitlines() or ["unknown"])[-1], "arch": target_arch()}

    def build(self, source: str, symbol: str, flags: tuple[str, ...] | None = None,
              prototype: str | None = None, checks: bool = False, load_checks: bool = True) -> Artifact:
        if not re.search(rf"\.entry\s+{re.escape(symbol)}\s*\(", source):
            raise BuildError(f"no `.visible .entry {symbol}(...)` in the PTX")
        try:
            launch = parse_launch(source)
        except ValueError as exc:
            raise BuildError(str(exc)) from None
        ptxas = find_ptxas()
        if ptxas is None:
            raise MissingTool("ptxas not found: install the CUDA toolkit or pip install nvidia-cuda-nvcc-cu12")
        arch = target_arch()
        flags = tuple(flags or ("-O3",))
        key = hashlib.sha256("\0".join([source, symbol, arch, " ".join(flags), self.versions()["ptxas"]])
                             .encode()).hexdigest()[:24]
        out = cache_dir() / f"ptx-{key}.cubin"
        if out.exists():
            return Artifact(str(out), symbol, key, cached=True, info={"arch": arch, "launch": launch})
        with lifecycle.temp_dir_for("sf-ptx-") as tmp:
            src = Path(tmp) / "kernel.ptx"
            src.write_text(source)
            tmp_out = Path(tmp) / "kernel.cubin"
            cmd = [ptxas, f"--gpu-name={arch}", *flags, "-o", str(tmp_out), str(src)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                                      cwd=tmp, preexec_fn=_limit_compiler)
            except subprocess.TimeoutExpired as exc:
                raise BuildError(f"ptxas timed out after {BUILD_TIMEOUT_S}s") from exc
            log = (proc.stdout + proc.stderr).replace(str(src), "kernel.ptx").replace(tmp + "/", "")
            if proc.returncode != 0 or not tmp_out.exists():
                raise BuildError("ptxas error:\n" + _excerpt(log), log)
            os.replace(tmp_out, out)
        return Artifact(str(out), symbol, key, log=log, info={"arch": arch, "launch": launch})
