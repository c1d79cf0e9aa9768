"""What a kernel's ``expect:`` header asks of its verdict.

A rejection (``build_failed``, ``crashed``, ``timed_out``, ``wrong``, ``cheated``) must be exactly
that outcome. Speed is the machine's to tell, never the test's: ``expect: correct`` (an honest
kernel) asks only that it is accepted as correct (``faster``, ``not_faster``, or ``inconclusive``
on a machine too busy to time it; a scalar loop can be slower than torch's vectorised one on one
shape of an AVX-512 machine and faster everywhere on an AVX2 one); ``expect: not_faster`` (an
honest but slow kernel made to look fast) asks that it is never ``faster``, whatever the machine.
"""

import re
from pathlib import Path

import pytest

ACCEPTED = {"correct": {"faster", "not_faster"}, "not_faster": {"not_faster"}}


def expected_outcome(path: Path) -> str:
    m = re.search(r"expect:\s*(\w+)", path.read_text())
    assert m, f"{path.name} states no expected outcome"
    return m.group(1)


def check(verdict, expected: str) -> None:
    got = verdict.outcome.value
    if expected in ACCEPTED:
        if got == "inconclusive":
            # correct, and never crowned: only its speed could not be told on a machine this busy
            pytest.skip(f"the machine was too busy to time it: {verdict.detail}")
        assert got in ACCEPTED[expected], f"{got}: {verdict.detail}"
    else:
        assert got == expected, verdict.detail
    assert verdict.detail
