"""The C backend's static checks on candidate source (MEASURING.md rule 9): a first filter, not
the protection.

A kernel computes; it does not time itself, start threads the harness did not ask for (OpenMP
is the allowed way), touch files or the network, load code, or run code at load time. Comments
and string literals are removed before matching, so a comment that says "time" is fine.

Three passes, each a cheap and early `cheated` with a reason:
* ``check_source``: the text as written (``CBackend.check``, before the build);
* ``check_preprocessed``: the candidate's own lines after the preprocessor, so names assembled
  with ``##`` or hidden behind macros are seen as the compiler sees them;
* ``check_assembly``: what the compiler emitted: inline assembly (``#APP``), system-call
  instructions, code or data placed in load-time sections.
The last two run inside ``CBackend.build`` when it is asked for ``checks``.
A determined candidate can still get past text checks (it is native code); what stops it is the
driver's system-call allow-list and the trusted side's checks (harness/candidate.py, harness/driver.c).
"""

from __future__ import annotations

import re

FORBIDDEN_HEADERS = {
    "pthread.h": "threads outside OpenMP", "threads.h": "threads outside OpenMP",
    "unistd.h": "system calls", "fcntl.h": "file access", "dlfcn.h": "dynamic loading",
    "signal.h": "signal handlers", "setjmp.h": "non-local jumps", "time.h": "timers",
    "spawn.h": "processes", "sched.h": "scheduler control", "stdio.h": "file and console I/O",
}
FORBIDDEN_CALLS = {
    "timers": ("clock", "clock_gettime", "gettimeofday", "time", "timespec_get", "__rdtsc",
               "__rdtscp", "__builtin_ia32_rdtsc", "__builtin_readcyclecounter", "omp_get_wtime"),
    "file or network access": ("fopen", "freopen", "open", "openat", "creat", "socket", "connect",
                               "bind", "fdopen", "write", "read", "unlink", "remove", "rename"),
    "processes or threads outside OpenMP": ("fork", "vfork", "system", "popen", "execl", "execlp",
                                            "execle", "execv", "execvp", "execve", "pthread_create",
                                            "thrd_create", "clone", "omp_set_num_threads"),
    "dynamic loading, symbol lookup or memory remapping": (
        "dlopen", "dlmopen", "dlsym", "dlvsym", "__libc_dlsym", "__libc_dlopen_mode", "dladdr",
        "dl_iterate_phdr", "getauxval", "mmap", "mmap64", "mprotect", "munmap", "mremap", "syscall",
        "ptrace", "prctl", "process_vm_readv", "process_vm_writev", "memfd_create", "shm_open"),
    "environment or signal tampering": ("getenv", "setenv", "putenv", "signal", "sigaction", "kill",
                                        "setjmp", "longjmp", "atexit", "at_quick_exit"),
}
FORBIDDEN_TOKENS = {
    r"\b(?:__asm__|__asm|asm)\b": "inline assembly",
    r"__attribute__\s*\(\(\s*(?:__)?(?:constructor|destructor)": "code that runs at load time",
    r"\[\[\s*gnu::(?:constructor|destructor)": "code that runs at load time",
    r"\b(?:__)?section(?:__)?\s*\(": "placing code or data in a named section",
    r"\b_Pragma\s*\(": "pragmas built by the preprocessor",
    r"\bPy[A-Z_]\w*": "calls into the Python runtime",
    r"#\s*include\s*\"": "includes outside the system headers",
    r"#\s*include\s*<\s*sys/": "system headers (sys/*.h)",
    r"#\s*pragma\s+omp\b[^\n]*\b(?:task|single\s+nowait)\b": "OpenMP tasks (unbounded work)",
}

# inside string literals (asm templates, paths): system-call instructions and system files
FORBIDDEN_STRINGS = {
    r"\bsyscall\b|\bsysenter\b|\bint\s*\$?(?:0x80|128)\b": "a system-call instruction",
    r"/proc/|/dev/|/sys/": "a path into /proc, /dev or /sys",
    r"\.init_array|\.fini_array|\.preinit_array|\.ctors|\.dtors": "a load-time section",
}
ASM_PATTERNS = {
    r"^\s*#APP\b": "inline assembly",
    r"^\s*(?:syscall|sysenter|svc)\b|^\s*int\s+\$(?:0x80|128)\b": "a system-call instruction",
    r"^\s*rdtscp?\b|^\s*rdpmc\b": "reading the time-stamp counter",
    r"^\s*\.section\s+\.(?:init|fini|init_array|fini_array|preinit_array|ctors|dtors)\b":
        "code or data in a load-time section (constructors run before the sandbox is complete)",
}

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRINGS = re.compile(r'"(?:\\.|[^"\\\n])*"' + r"|'(?:\\.|[^'\\\n])*'")


def strip_comments_and_strings(source: str) -> str:
    source = _COMMENTS.sub(" ", source)
    out = []
    for line in source.splitlines():
        # keep `#include "x"` visible to the include rule, blank other string literals
        out.append(line if line.lstrip().startswith("#") else _STRINGS.sub('""', line))
    return "\n".join(out)


def check_source(source: str) -> str | None:
    """None if the source passes; else a one-line reason naming what was found."""
    for m in _STRINGS.finditer(_COMMENTS.sub(" ", source)):
        for pattern, why in FORBIDDEN_STRINGS.items():
            if re.search(pattern, m.group(0)):
                return f"a string literal holds {why}: {m.group(0)[:60]}"
    code = strip_comments_and_strings(source)
    for header, why in FORBIDDEN_HEADERS.items():
        if re.search(r"#\s*include\s*<\s*" + re.escape(header) + r"\s*>", code):
            return f"includes <{header}> ({why} are forbidden in a kernel)"
    for why, names in FORBIDDEN_CALLS.items():
        for name in names:
            if re.search(r"(?<![\w.>])" + re.escape(name) + r"\s*\(", code):
                return f"calls {name}() ({why} are forbidden in a kernel)"
    for pattern, why in FORBIDDEN_TOKENS.items():
        m = re.search(pattern, code)
        if m:
            return f"uses `{m.group(0).strip()}` ({why} is forbidden in a kernel)"
    return None


def own_lines(preprocessed: str, filename: str) -> str:
    """The lines of ``preprocessed`` (gcc -E output) that come from ``filename`` itself."""
    out, mine = [], False
    for line in preprocessed.splitlines():
        m = re.match(r'#\s*\d+\s+"([^"]*)"', line)
        if m:
            mine = m.group(1).endswith(filename)
            continue
        if mine:
            out.append(line)
    return "\n".join(out)


def check_preprocessed(preprocessed: str, filename: str) -> str | None:
    """``check_source`` on the candidate's own lines after macro expansion."""
    reason = check_source(own_lines(preprocessed, filename))
    return f"after preprocessing, {reason}" if reason else None


def check_assembly(asm: str) -> str | None:
    for line in asm.splitlines():
        for pattern, why in ASM_PATTERNS.items():
            if re.search(pattern, line):
                return f"the compiled code contains {why} (`{line.strip()[:60]}`)"
    return None
