"""A kernel named by where it comes from, as engine configs and designs spell it; parsed here only.

- ``so:PATH``: a shared object on disk, built by the user with the problem's C ABI;
- ``champion:PROBLEM``: the evidence store's current champion of PROBLEM for this hardware;
- ``champion:PROBLEM@ID``: candidate ID of PROBLEM (a prefix will do), pinned;
- several of those joined with ``+``: one op's kernels, one per block type of its weights.

Which candidate may run, and how it is built, is ``champions.py``'s rule; this module only reads
and writes the names, so a config can be checked without a store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIXES = {"so": "so:PATH (a built q4_1_matmul shared object)",
            "champion": "champion:q4_1_matmul[@CANDIDATE] (the evidence store's champion for this "
                        "hardware, or the candidate pinned, which must have passed the harness here)"}
HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class KernelRef:
    kind: str  # "so" or "champion"
    target: str  # the path (so) or the problem (champion)
    pin: str | None = None  # champion: the candidate id (or a prefix of it) pinned

    @staticmethod
    def names_one(spec: str | None) -> bool:
        """Whether ``spec`` is such a name (a known prefix), rather than a registered kernel's."""
        return bool(spec) and ":" in spec and spec.partition(":")[0] in PREFIXES

    @classmethod
    def parse(cls, spec: str, where: str = "") -> "KernelRef":
        """``spec`` read; ValueError naming it (and ``where`` it was found, e.g. " for op 'o'")
        if it names nothing valid."""
        prefix, sep, rest = spec.partition(":")
        if not sep or prefix not in PREFIXES:
            raise ValueError(f"unknown kernel prefix {prefix + ':'!r} in {spec!r}{where} "
                             f"(known: {', '.join(PREFIXES.values())})")
        if not rest.strip():
            raise ValueError(f"{spec!r}{where} names nothing after {prefix + ':'!r} (expected {PREFIXES[prefix]})")
        if prefix == "so":
            return cls("so", rest)
        problem, at, pin = rest.partition("@")
        if at and not (pin and set(pin) <= HEX):
            raise ValueError(f"{spec!r}{where}: a pinned champion is @CANDIDATE_ID (hex), got {pin!r}")
        return cls("champion", problem, pin or None)

    @property
    def spec(self) -> str:
        if self.kind == "so":
            return f"so:{self.target}"
        return f"champion:{self.target}" + (f"@{self.pin}" if self.pin else "")

    def __str__(self) -> str:
        return self.spec


JOIN = "+"  # kernels of one op for different block types: champion:q4_k_matmul@ID+champion:q6_k_matmul@ID


def pieces(spec: str) -> list[str]:
    """The names a kernel name joins (``JOIN``): one op's kernels, one per block type, the first
    that runs a type taking it. A name without ``JOIN`` is one piece."""
    if not KernelRef.names_one(spec):
        return [spec]
    return re.split(r"\+(?=(?:" + "|".join(PREFIXES) + r"):)", spec)  # a "+" inside a path stays


def pins(specs) -> dict[str, str]:
    """problem -> candidate id, for every pinned champion among ``specs`` (joined names taken
    apart; names of other kinds, and registered kernels' names, are skipped)."""
    out = {}
    for spec in specs:
        for one in pieces(spec):
            if KernelRef.names_one(one):
                ref = KernelRef.parse(one)
                if ref.kind == "champion" and ref.pin:
                    out[ref.target] = ref.pin
    return out
