"""The backend contract: a backend is how a source is checked and built, what runs what it
built, and the language it is written in.

* **static check** (``check``): the source as written, a first and cheap `cheated` with a reason
  (never the protection: that is the runner's process boundary and the trusted comparison).
* **build** (``build``): runs in the coordinator's process tree (the compiler is trusted, the
  source is not: it is compiled in a subprocess with a timeout, or parsed, and never executed
  here). Implementations must be safe to call from several threads at once.
* **runner** (``runner``): what runs a built artifact, as the harness knows it: ``"driver"``, the
  sandboxed C driver that loads a shared library (harness/candidate.py), or ``"gpu"``, a Python
  worker process per candidate running ``backends/gpu_worker.py`` (harness/gpu.py). The harness
  holds one line of verification and measurement per runner; a backend picks one.
* **language** (``language``, ``signature``, ``target``): what an agent needs to write the
  backend's sources (agents/llm.py, agents/edits.py, agents/prompts/), so no agent branches on a
  backend's name.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


class BuildError(Exception):
    """The candidate did not build; ``log`` holds the compiler's words."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


class MissingTool(BuildError):
    """This machine lacks the backend's compiler (or Triton): nothing the candidate did. Raised
    only after the checks that need no compiler passed; the harness's line for the backend's
    runner says what that means (the GPU line: `needs_device`, never `build_failed`)."""


class CheatError(BuildError):
    """The candidate built, but what the compiler made of it does something a kernel must not
    (a system call, code that runs at load time...): the outcome is `cheated`."""


@dataclass(frozen=True)
class Artifact:
    path: str
    symbol: str
    key: str
    cached: bool = False
    log: str = ""
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Language:
    """How a backend's sources are written, for the agents that write them: the LLM agent reads
    this record (its prompts, its answer's fenced blocks) instead of branching on the backend."""

    name: str                   # the language as a message names it: "C", "Python (Triton)"
    fence: str                  # the tag of the fenced blocks a prompt shows sources in
    fences: tuple[str, ...]     # the tags an answer's fenced block may carry to be read as source ("": none)
    system_prompt: str          # the LLM agent's system prompt: a template in agents/prompts/
    # what a source that defines the kernel contains; ``{symbol}`` stands for the kernel's name
    definition: str = r"\b{symbol}\s*\("
    # an answer without a fenced block is taken whole as the source where every one of these
    # occurs in it (``{symbol}`` as above); none: such an answer is never a source
    whole_file: tuple[str, ...] = ()

    def defines(self, text: str, symbol: str) -> bool:
        """Whether ``text`` defines the kernel ``symbol``."""
        return re.search(_named(self.definition, symbol), text) is not None

    def is_whole_file(self, text: str, symbol: str) -> bool:
        """Whether an unfenced answer ``text`` is a complete source of the kernel ``symbol``."""
        return bool(self.whole_file) and all(re.search(_named(p, symbol), text) for p in self.whole_file)


def _named(pattern: str, symbol: str) -> str:
    return pattern.replace("{symbol}", re.escape(symbol))


class Backend(ABC):
    name: str = ""
    # the file name endings of this backend's sources (".cu"): how `eval` tells a file's language
    extensions: tuple[str, ...] = ()
    runner: str  # what runs a built artifact: "driver" (the C driver) or "gpu" (the GPU worker); see above
    language: Language

    def check(self, source: str) -> str | None:
        """The static check on the source as written: None, or a one-line reason it is `cheated`.
        A backend without one passes every source here (its build and runner still hold)."""
        return None

    def signature(self, problem) -> str:
        """The declaration a source of ``problem`` implements: shown in the agents' prompts and
        passed to ``build`` as its prototype. The C prototype by default (C; CUDA and PTX take
        the same arguments in order)."""
        return problem.c_prototype

    @abstractmethod
    def target(self) -> dict[str, str]:
        """The machine the build is for, as the system prompt names it (``arch``, and for C the
        instruction sets it may use, ``features``)."""

    @abstractmethod
    def build(self, source: str, symbol: str, flags: tuple[str, ...] | None = None,
              prototype: str | None = None, checks: bool = False, load_checks: bool = True) -> Artifact:
        """Compile ``source`` exporting ``symbol``; raise BuildError with the log on failure.
        ``prototype``: the declaration the source must agree with (a conflict fails the build
        where the backend can tell); ``checks``: inspect what the compiler produced and raise
        CheatError on a forbidden construct; ``load_checks``: refuse an artifact that would run
        its own code while it loads. A backend whose artifacts hold nothing to inspect ignores
        the last two."""

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Tool versions that change what ``build`` produces (part of every build key)."""
