"""Every kernel in tests/adversarial/<problem>/ must get the outcome its header states."""

from pathlib import Path

import pytest

from expectations import check, expected_outcome

from swarmfactory.problems import load_problem

HERE = Path(__file__).parent
KERNELS = sorted(HERE.glob("*/*.c"))


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_kernel_gets_its_expected_outcome(path, harness):
    problem = load_problem(path.parent.name)
    verdict = harness.evaluate(problem, path.read_text())
    check(verdict, expected_outcome(path))


def test_the_suite_covers_every_failure_kind():
    kinds = {expected_outcome(p) for p in KERNELS}
    assert {"build_failed", "crashed", "timed_out", "wrong", "cheated", "not_faster", "correct"} <= kinds
