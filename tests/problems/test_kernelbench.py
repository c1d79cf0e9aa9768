"""KernelBench-format files load as fixed-shape problems; a C kernel for one passes its check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from swarmfactory.problems import ProblemError, load_problem
from swarmfactory.problems.spec import to_torch

DATA = Path(__file__).with_name("data")
LINEAR_RELU = str(DATA / "kb_linear_relu.py")

# relu(x W^T + b) * s for kb_linear_relu.py: x 3x10, s 3x7, W 7x10, b 7
LINEAR_RELU_C = """
#include <stdint.h>
void kb_linear_relu(const float *in0, const float *in1, const float *p0, const float *p1,
                    float *out0) {
    for (int r = 0; r < 3; r++)
        for (int o = 0; o < 7; o++) {
            float acc = p1[o];
            for (int i = 0; i < 10; i++) acc += in0[r * 10 + i] * p0[o * 10 + i];
            out0[r * 7 + o] = (acc > 0.0f ? acc : 0.0f) * in1[r * 7 + o];
        }
}
"""


def test_kernelbench_file_loads_with_inputs_then_weights_in_the_abi():
    p = load_problem(LINEAR_RELU)
    assert p.name == "kb_linear_relu"
    assert p.c_signature == ("void kb_linear_relu(const float *in0, const float *in1, "
                             "const float *p0, const float *p1, float *out0)")
    assert p.workload == p.edge_shapes and len(p.workload) == 1
    assert p.output_shapes(p.workload[0]) == {"out0": (3, 7)}
    assert p.template is None and p.source_path.endswith("kb_linear_relu.py")


def test_kernelbench_reference_runs_and_the_eager_baseline_agrees(assert_close):
    p = load_problem(LINEAR_RELU)
    a = p.make_inputs(p.workload[0], np.random.default_rng(1), "normal")
    b = p.make_inputs(p.workload[0], np.random.default_rng(2), "normal")
    assert not np.array_equal(a["in0"], b["in0"]), "cases must get fresh inputs"
    assert np.array_equal(a["p0"], b["p0"]), "weights are fixed by the seeded Model"
    assert (a["in1"] >= 0).all(), "inputs follow the file's get_inputs() distribution (rand)"
    ref = p.reference(to_torch(a))
    assert ref["out0"].dtype.is_floating_point and tuple(ref["out0"].shape) == (3, 7)
    got = p.baselines["eager"](to_torch(a))()
    assert_close(p, {"out0": got.numpy()}, ref, "eager baseline")


def test_a_c_kernel_for_a_kernelbench_problem_matches_its_reference(compiler, case_data,
                                                                    kernel_call, assert_close):
    p = load_problem(LINEAR_RELU)
    fn = compiler.load(p, LINEAR_RELU_C)
    for case in p.seed_cases():
        inputs, ref = case_data.get(p, case)
        assert_close(p, kernel_call(p, fn, inputs, case.shape), ref, f"seed {case.seed}")


@pytest.mark.parametrize("body, message", [
    ("return [torch.randn(4).to(torch.float64)]", "torch.float64"),
    ("return [torch.randn(4), 3]", r"get_inputs\(\)\[1\] is of type int"),
])
def test_kernelbench_file_with_unsupported_inputs_is_refused_clearly(tmp_path, body, message):
    f = tmp_path / "bad_inputs.py"
    f.write_text("import torch\nimport torch.nn as nn\n\n"
                 "class Model(nn.Module):\n    def forward(self, x, *rest):\n        return x * 2\n\n"
                 f"def get_inputs():\n    {body}\n\n"
                 "def get_init_inputs():\n    return []\n")
    with pytest.raises(ProblemError, match=message):
        load_problem(str(f))
