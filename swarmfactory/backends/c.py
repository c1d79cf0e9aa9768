"""C backend: gcc (or $CC) with -O3 -march=native (or the masked level) -fopenmp, loaded with ctypes.

Builds are cached by a key over the source, the flags, the compiler's version and the CPU, so the
same candidate is compiled once per machine. The compiler runs in a subprocess with a timeout and
CPU/file-size limits; a build never executes candidate code.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from swarmfactory.backends.base import Artifact, Backend, BuildError, CheatError
from swarmfactory.hardware import cpu_fingerprint, march_flags

def default_flags() -> tuple[str, ...]:
    """-O3, the target this machine allows (-march=native, or the level SWARMFACTORY_CPU_MASK
    emulates), OpenMP, GNU C11."""
    return ("-O3", *march_flags(), "-fopenmp", "-std=gnu11")
BUILD_TIMEOUT_S = 120


def cache_dir() -> Path:
    root = os.environ.get("SWARMFACTORY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "swarmfactory")
    path = Path(root) / "build"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _limit_compiler():
    resource.setrlimit(resource.RLIMIT_CPU, (BUILD_TIMEOUT_S, BUILD_TIMEOUT_S))
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, 256 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _excerpt(log: str, limit: int = 1500) -> str:
    lines = [ln for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    text = "\n".join((errors or lines)[:12])
    return text[:limit]


class CBackend(Backend):
    name = "c"

    def __init__(self, cc: str | None = None):
        self.cc = cc or os.environ.get("CC") or "gcc"

    @cache
    def versions(self) -> dict[str, str]:
        try:
            out = subprocess.run([self.cc, "--version"], capture_output=True, text=True, timeout=30)
            first = out.stdout.splitlines()[0] if out.stdout else "unknown"
        except (OSError, subprocess.SubprocessError):
            first = "missing"
        return {"cc": self.cc, "cc_version": first}

    def build(self, source: str, symbol: str, flags: tuple[str, ...] | None = None,
              prototype: str | None = None, checks: bool = False) -> Artifact:
        """Compile ``source`` into a shared library exporting ``symbol``.

        ``prototype`` is declared ahead of the source (``-include``), so a kernel whose
        definition disagrees with the problem's ABI fails to build instead of crashing.
        ``checks``: what the compiler produced (the preprocessed source, the assembly) is
        inspected by ``harness.static``; a forbidden construct raises CheatError and the
        library is not cached."""
        flags = tuple(flags or default_flags())
        key = hashlib.sha256("\0".join([source, " ".join(flags), self.versions()["cc_version"],
                                        cpu_fingerprint()["id"], symbol, prototype or "",
                                        "checked" if checks else ""]).encode()).hexdigest()[:24]
        out = cache_dir() / f"{key}.so"
        if out.exists():
            return Artifact(str(out), symbol, key, cached=True)
        if shutil.which(self.cc) is None:
            raise BuildError(f"C compiler {self.cc!r} not found on PATH (install gcc or set CC)")
        with tempfile.TemporaryDirectory(prefix="sf-build-") as tmp:
            src = Path(tmp) / "kernel.c"
            src.write_text(source)
            tmp_out = Path(tmp) / "kernel.so"
            extra = ["-save-temps=obj"] if checks else []
            if prototype:
                header = Path(tmp) / "abi.h"
                header.write_text(f"#include <stdint.h>\n{prototype};\n")
                extra += ["-include", str(header)]
            cmd = [self.cc, *flags, *extra, "-shared", "-fPIC", "-Wl,--no-undefined", "-o",
                   str(tmp_out), str(src), "-lm"]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                                      cwd=tmp, preexec_fn=_limit_compiler)
            except subprocess.TimeoutExpired as exc:
                raise BuildError(f"compiler timed out after {BUILD_TIMEOUT_S}s") from exc
            log = (proc.stdout + proc.stderr).replace(str(src), "kernel.c").replace(tmp + "/", "")
            if proc.returncode != 0:
                msg = "compile error:\n" + _excerpt(log)
                if prototype and ("conflicting types" in log or "incompatible" in log):
                    msg += f"\nthe problem's ABI is: {prototype};"
                raise BuildError(msg, log)
            syms = subprocess.run(["nm", "-D", "--defined-only", str(tmp_out)], capture_output=True,
                                  text=True, timeout=30).stdout
            if not any(line.split()[-1] == symbol for line in syms.splitlines() if line.split()):
                raise BuildError(f"the library does not export `{symbol}` (is it static or misnamed?)", log)
            if checks:
                from swarmfactory.harness.static import check_assembly, check_preprocessed

                pre = next(Path(tmp).glob("*.i"), None)
                asm = next(Path(tmp).glob("*.s"), None)
                reason = (check_preprocessed(pre.read_text(errors="replace"), "kernel.c") if pre else None) \
                    or (check_assembly(asm.read_text(errors="replace")) if asm else None)
                if reason:
                    raise CheatError(reason, log)
            os.replace(tmp_out, out.with_suffix(f".tmp{os.getpid()}"))
            os.replace(out.with_suffix(f".tmp{os.getpid()}"), out)
        return Artifact(str(out), symbol, key, cached=False, log=log)

    @staticmethod
    def load(artifact_path: str, symbol: str, argtypes: list):
        import ctypes

        lib = ctypes.CDLL(artifact_path, mode=ctypes.RTLD_LOCAL)
        fn = getattr(lib, symbol)
        fn.argtypes = argtypes
        fn.restype = None
        return fn
