"""Static checks on candidate C source (MEASURING.md rule 9).

A kernel computes; it does not time itself, start threads the harness did not ask for (OpenMP
is the allowed way), touch files or the network, load code, or run code at load time. Comments
and string literals are removed before matching, so a comment that says "time" is fine.
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
    "dynamic loading or memory remapping": ("dlopen", "dlsym", "mmap", "mprotect", "munmap",
                                            "syscall", "ptrace"),
    "environment or signal tampering": ("getenv", "setenv", "putenv", "signal", "sigaction", "kill",
                                        "setjmp", "longjmp", "atexit", "at_quick_exit"),
}
FORBIDDEN_TOKENS = {
    r"\b(?:__asm__|__asm|asm)\b": "inline assembly",
    r"__attribute__\s*\(\(\s*(?:__)?(?:constructor|destructor)": "code that runs at load time",
    r"\bPy[A-Z_]\w*": "calls into the Python runtime",
    r"#\s*include\s*\"": "includes outside the system headers",
    r"#\s*include\s*<\s*sys/": "system headers (sys/*.h)",
    r"#\s*pragma\s+omp\b[^\n]*\b(?:task|single\s+nowait)\b": "OpenMP tasks (unbounded work)",
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
