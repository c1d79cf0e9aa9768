"""C backend: gcc (or $CC) with -O3 -march=native (or the masked level) -fopenmp, into a shared
library the sandboxed C driver loads (runner ``driver``).

Builds are cached by a key over the source, the flags, the compiler's version and the CPU, so the
same candidate is compiled once per machine. The compiler runs in a subprocess with a timeout and
CPU/file-size limits; a build never executes candidate code. The static checks (the source, the
preprocessed source, the assembly) are cstatic.py's; the built ELF is read by elfcheck.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import shutil
import subprocess
from functools import cache
from pathlib import Path

from swarmfactory import lifecycle
from swarmfactory.backends.base import Artifact, Backend, BuildError, CheatError, Language
from swarmfactory.backends.cstatic import check_assembly, check_preprocessed, check_source
from swarmfactory.backends.elfcheck import load_time_code
from swarmfactory.hardware import cache_dir as hardware_cache_dir
from swarmfactory.hardware import cpu_fingerprint, march_flags

# Every library is linked without the C runtime's start files (no _init, no frame_dummy in
# .init_array: nothing of the library runs while it loads), bound at once (full RELRO: its GOT
# read-only once loaded) and with a non-executable stack.
LINK_FLAGS = ("-nostartfiles", "-Wl,-z,now", "-Wl,-z,relro", "-Wl,-z,noexecstack")

def default_flags() -> tuple[str, ...]:
    """-O3, the target this machine allows (-march=native, or the level SWARMFACTORY_CPU_MASK
    emulates), OpenMP, GNU C11."""
    return ("-O3", *march_flags(), "-fopenmp", "-std=gnu11")
BUILD_TIMEOUT_S = 120


def cache_dir() -> Path:
    path = hardware_cache_dir() / "build"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _limit_compiler():
    resource.setrlimit(resource.RLIMIT_CPU, (BUILD_TIMEOUT_S, BUILD_TIMEOUT_S))
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, 256 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


_DIAG = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+)(?::\d+)?: (?P<rest>.*)$")
_QUOTE = re.compile(r"^\s*(?:\d+\s*)?\|")


def withhold_foreign(log: str, system_dirs: tuple[str, ...]) -> str:
    """The compiler's output without a word quoted from files the candidate did not supply:
    diagnostics located in a file other than its own source or a system header keep the file
    and line but lose their text, and the source lines quoted under them are dropped."""
    out, quoting = [], True
    for line in log.splitlines():
        m = _DIAG.match(line)
        if m:
            name = m.group("file")
            real = os.path.realpath(name) if os.path.isabs(name) else name
            foreign = name not in ("kernel.c", "abi.h", "<command-line>", "<built-in>") and not any(
                real.startswith(d + os.sep) for d in system_dirs)
            quoting = not foreign
            out.append(f"{name}:{m.group('line')}: (the compiler's words about a file the candidate "
                       "did not supply are withheld)" if foreign else line)
        elif _QUOTE.match(line):
            if quoting:
                out.append(line)
        elif line.startswith(("In file included from", "                 from")):
            out.append(line)
            quoting = True
        else:
            out.append(line if quoting else "")
    return "\n".join(ln for ln in out if ln != "")


def _excerpt(log: str, limit: int = 1500) -> str:
    lines = [ln for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    text = "\n".join((errors or lines)[:12])
    return text[:limit]


class CBackend(Backend):
    name = "c"
    extensions = (".c",)
    runner = "driver"
    language = Language(name="C", fence="c", fences=("", "c", "cpp", "c++", "h"), system_prompt="system.md.j2",
                        whole_file=(r"#include", r"\bvoid\s+{symbol}\s*\("))

    def __init__(self, cc: str | None = None):
        self.cc = cc or os.environ.get("CC") or "gcc"

    def check(self, source: str) -> str | None:
        return check_source(source)

    def target(self) -> dict[str, str]:
        cpu = cpu_fingerprint()
        return {"arch": cpu["arch"], "features": ", ".join(cpu["features"]) or "baseline ISA"}

    @cache
    def versions(self) -> dict[str, str]:
        try:
            out = subprocess.run([self.cc, "--version"], capture_output=True, text=True, timeout=30)
            first = out.stdout.splitlines()[0] if out.stdout else "unknown"
        except (OSError, subprocess.SubprocessError):
            first = "missing"
        return {"cc": self.cc, "cc_version": first}

    @cache
    def system_include_dirs(self) -> tuple[str, ...]:
        """Where the compiler finds ``<...>`` headers (resolved): the only files a kernel may include."""
        try:
            out = subprocess.run([self.cc, "-E", "-Wp,-v", "-xc", "/dev/null"], capture_output=True,
                                 text=True, timeout=30).stderr
        except (OSError, subprocess.SubprocessError):
            return ()
        lines = out.splitlines()
        try:
            start = next(i for i, ln in enumerate(lines) if ln.startswith("#include <...>"))
        except StopIteration:
            return ()
        dirs = []
        for ln in lines[start + 1:]:
            if not ln.startswith(" "):
                break
            dirs.append(os.path.realpath(ln.strip()))
        return tuple(dirs)

    def build(self, source: str, symbol: str, flags: tuple[str, ...] | None = None,
              prototype: str | None = None, checks: bool = False, load_checks: bool = True) -> Artifact:
        """Compile ``source`` into a shared library exporting ``symbol``.

        ``prototype`` is declared ahead of the source (``-include``), so a kernel whose
        definition disagrees with the problem's ABI fails to build instead of crashing.
        ``checks``: what the compiler produced (the preprocessed source, the assembly) is
        inspected by ``cstatic``; a forbidden construct raises CheatError and the library is
        not cached.
        ``load_checks``: the built file is refused (CheatError) when loading it would run any of
        its code (elfcheck.py); tests switch it off only to prove the sandbox's next
        layer holds on its own.
        Whatever the source includes must be a header of the compiler's system directories
        (BuildError naming the file otherwise), and the compiler's words about any other file
        are withheld: a build log never quotes a file the candidate did not supply."""
        flags = tuple(flags or default_flags())
        key = hashlib.sha256("\0".join([source, " ".join(flags), " ".join(LINK_FLAGS),
                                        self.versions()["cc_version"],
                                        cpu_fingerprint()["id"], symbol, prototype or "",
                                        "checked" if checks else "",
                                        "" if load_checks else "unchecked-load"]).encode()).hexdigest()[:24]
        out = cache_dir() / f"{key}.so"
        if out.exists():
            return Artifact(str(out), symbol, key, cached=True)
        if shutil.which(self.cc) is None:
            raise BuildError(f"C compiler {self.cc!r} not found on PATH (install gcc or set CC)")
        with lifecycle.temp_dir_for("sf-build-") as tmp:
            src = Path(tmp) / "kernel.c"
            src.write_text(source)
            tmp_out = Path(tmp) / "kernel.so"
            extra = ["-save-temps=obj"] if checks else []
            if prototype:
                header = Path(tmp) / "abi.h"
                header.write_text(f"#include <stdint.h>\n{prototype};\n")
                extra += ["-include", str(header)]
            self._check_includes(flags, extra, src, tmp)
            cmd = [self.cc, *flags, *extra, "-shared", "-fPIC", *LINK_FLAGS, "-Wl,--no-undefined", "-o",
                   str(tmp_out), str(src), "-lm"]
            proc = self._run(cmd, tmp)
            log = self._log(proc, src, tmp)
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
                pre = next(Path(tmp).glob("*.i"), None)
                asm = next(Path(tmp).glob("*.s"), None)
                reason = (check_preprocessed(pre.read_text(errors="replace"), "kernel.c") if pre else None) \
                    or (check_assembly(asm.read_text(errors="replace")) if asm else None)
                if reason:
                    raise CheatError(reason, log)
            if load_checks:
                reason = load_time_code(str(tmp_out))
                if reason:
                    raise CheatError(f"the built library would run code while it loads: {reason}", log)
            os.replace(tmp_out, out.with_suffix(f".tmp{os.getpid()}"))
            os.replace(out.with_suffix(f".tmp{os.getpid()}"), out)
        return Artifact(str(out), symbol, key, cached=False, log=log)

    @staticmethod
    def _run(cmd: list[str], cwd: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                                  cwd=cwd, preexec_fn=_limit_compiler)
        except subprocess.TimeoutExpired as exc:
            raise BuildError(f"compiler timed out after {BUILD_TIMEOUT_S}s") from exc

    def _log(self, proc: subprocess.CompletedProcess, src: Path, tmp: str) -> str:
        log = (proc.stdout + proc.stderr).replace(str(src), "kernel.c").replace(tmp + "/", "")
        return withhold_foreign(log, self.system_include_dirs())

    def _check_includes(self, flags: tuple[str, ...], extra: list[str], src: Path, tmp: str) -> None:
        """Every file the source pulls in must be a system header: a dependency pass (no code
        generated) lists them; the first other one fails the build, named but not quoted."""
        extra = [e for e in extra if not e.startswith("-save-temps")]
        proc = self._run([self.cc, *flags, *extra, "-M", "-fno-diagnostics-show-caret", str(src)], tmp)
        allowed = self.system_include_dirs()
        own = {os.path.realpath(src), os.path.realpath(os.path.join(tmp, "abi.h"))}
        deps = proc.stdout.replace("\\\n", " ").split(":", 1)[-1].split() if proc.returncode == 0 else []
        if proc.returncode != 0:  # the files its diagnostics are about are what it pulled in
            deps = [m.group("file") for m in map(_DIAG.match, proc.stderr.splitlines()) if m]
        for dep in deps:
            real = os.path.realpath(dep if os.path.isabs(dep) else os.path.join(tmp, dep))
            if real in own or any(real.startswith(d + os.sep) for d in allowed):
                continue
            shown = dep.replace(tmp + "/", "")
            raise BuildError(f"the source includes `{shown}`, which is not a header of the compiler's "
                             "system directories: a kernel may include system headers only")
        if proc.returncode != 0:
            log = self._log(proc, src, tmp)
            raise BuildError("compile error:\n" + _excerpt(log), log)
