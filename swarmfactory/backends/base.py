"""The backend contract: turn candidate source into a loadable artifact.

``build`` runs in the coordinator's process tree (the compiler is trusted, the source is not: it is
compiled in a subprocess with a timeout and never executed here). ``load`` runs only inside a
harness worker. Implementations must be safe to call from several threads at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


class BuildError(Exception):
    """The candidate did not build; ``log`` holds the compiler's words."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


class MissingTool(BuildError):
    """This machine lacks the backend's compiler (or Triton): nothing the candidate did. Raised
    only after the checks that need no compiler passed; the harness ends it as `needs_device`
    with this message, never as `build_failed`."""


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


class Backend(ABC):
    name: str = ""
    # the file name endings of this backend's sources (".cu"): how `eval` tells a file's language
    extensions: tuple[str, ...] = ()

    @abstractmethod
    def build(self, source: str, symbol: str, flags: tuple[str, ...] | None = None,
              prototype: str | None = None, checks: bool = False) -> Artifact:
        """Compile ``source`` exporting ``symbol``; raise BuildError with the log on failure.
        ``prototype``: the declaration the source must agree with (a conflict fails the build);
        ``checks``: inspect what the compiler produced and raise CheatError on a forbidden
        construct."""

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Tool versions that change what ``build`` produces (part of every build key)."""

    @staticmethod
    @abstractmethod
    def load(artifact_path: str, symbol: str, argtypes: list):
        """Inside a worker: return a callable for ``symbol`` taking ctypes-compatible args."""
