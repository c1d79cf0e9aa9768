"""What the engine is handed to run kernel-factory kernels: built kernels, and whom to tell when
one is caught wrong.

The engine never opens the evidence store nor builds a candidate itself. A config that names a
champion (``champion:PROBLEM[@ID]``, ``kernelref.py``) is served by a ``KernelSupply`` given to
``Engine(config, supply=...)``: the corridor between the factories (``swarmfactory/champions.py``)
looks the candidate up under its one rule, builds it as the harness built it and returns a
``BuiltKernel``; the engine loads that, checks it, audits it while serving and, at its first wrong
output, drops it and calls ``on_wrong`` (the corridor records the finding; ``engine/audit.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class UnavailableKernel(Exception):
    """A named kernel cannot run here; the message is one line starting with the name."""


@dataclass(frozen=True)
class BuiltKernel:
    """A kernel-factory candidate built into a shared object, and what the engine reports of it."""

    spec: str  # as the config names it
    problem: str
    candidate: str
    path: str  # the shared object (the harness's build of the candidate)
    source: str
    origin: str  # where it came from (the store, as shown to a user)
    rtol: float  # the problem's tolerance
    atol: float
    speedup: float | None = None  # its recorded speedup, if it holds the title


class KernelSupply(Protocol):
    def build(self, spec: str, signature: str) -> BuiltKernel:
        """The kernel ``spec`` names, built; UnavailableKernel (one line) if it may not run here or
        its ABI is not ``signature`` (the C declaration the engine calls)."""

    def on_wrong(self, problem: str, candidate: str, shape: dict, detail: str) -> str:
        """Record that ``candidate`` gave a wrong output at ``shape`` while serving (already
        dropped); returns what was done, for the log."""


class NoSupply:
    """The supply of an engine given none: names no champion, reports to the log only."""

    def build(self, spec: str, signature: str) -> BuiltKernel:
        raise UnavailableKernel(f"{spec}: champion kernels come from an evidence store, and this engine was given "
                                "none (`swarmfactory engine serve --store PATH|URL`, or "
                                "`Engine(config, supply=champions.Corridor(store))`)")

    def on_wrong(self, problem: str, candidate: str, shape: dict, detail: str) -> str:
        return f"{problem} kernel {candidate} gave a wrong output while serving ({detail}); dropped, the " \
               "engine's own code runs instead"
