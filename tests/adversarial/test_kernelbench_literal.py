"""KernelBench-format problems must not be taken literally (issue 10, class 10 and 8).

Each kernel in kernelbench/<stem>/ is written against kernelbench/<stem>.py and states the outcome
the harness must give (``expect:`` in its first comment): a copy passing as ReLU on the file's
never-negative inputs, a LayerNorm that ignores weights left at their initial values, softmax
answers that KernelBench's own atol = rtol = 1e-2 cannot tell from right.
"""

from pathlib import Path

import pytest

from expectations import check, expected_outcome

from swarmfactory.problems import load_problem

HERE = Path(__file__).parent / "kernelbench"
KERNELS = sorted(HERE.glob("*/*.c"))



@pytest.mark.parametrize("path", KERNELS, ids=lambda p: f"kernelbench/{p.parent.name}/{p.stem}")
def test_kernelbench_kernel_gets_its_expected_outcome(path, harness):
    problem = load_problem(str(HERE / f"{path.parent.name}.py"))
    verdict = harness.evaluate(problem, path.read_text())
    check(verdict, expected_outcome(path))


def test_every_kernelbench_kernel_has_its_file():
    assert KERNELS
    for path in KERNELS:
        assert (HERE / f"{path.parent.name}.py").exists(), path
