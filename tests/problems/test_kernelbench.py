"""KernelBench-format files load as fixed-shape problems; a C kernel for one passes its check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

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
            out0[r * 7 + o] = (acc > 0.0f || acc != acc ? acc : 0.0f) * in1[r * 7 + o];  /* NaN stays NaN */
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
    assert not np.array_equal(a["p0"], b["p0"]), "weights are drawn per case"
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


KB_HEADER = "import torch\nimport torch.nn as nn\n\n"


def kb_file(tmp_path, name: str, body: str):
    f = tmp_path / f"{name}.py"
    f.write_text(KB_HEADER + body)
    return load_problem(str(f))


RELU = """
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.rand(16, 1024)]

def get_init_inputs():
    return []
"""

LAYERNORM = """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(64)

    def forward(self, x):
        return self.ln(x)

def get_inputs():
    return [torch.randn(8, 64)]

def get_init_inputs():
    return []
"""

SOFTMAX = """
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)

def get_inputs():
    return [torch.rand(16, 16384)]

def get_init_inputs():
    return []
"""

HUGE = """
batch_size = 4096
dim = 393216

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.rand(batch_size, dim)]

def get_init_inputs():
    return []
"""


def test_a_copy_does_not_pass_as_relu_once_inputs_are_signed(tmp_path, harness):
    p = kb_file(tmp_path, "kb_relu", RELU)
    copy = ("#include <stdint.h>\n#include <string.h>\n"
            "void kb_relu(const float *in0, float *out0) { memcpy(out0, in0, 16 * 1024 * 4); }\n")
    relu = ("#include <stdint.h>\n"
            "void kb_relu(const float *in0, float *out0) {\n"
            "  for (int i = 0; i < 16 * 1024; i++) out0[i] = in0[i] > 0.0f ? in0[i] : (in0[i] != in0[i] ? in0[i] : 0.0f); }\n")
    assert harness.evaluate(p, copy, measure=False).outcome.value == "wrong"
    assert harness.evaluate(p, relu, measure=False).outcome.value == "verified"


def test_a_layernorm_that_ignores_its_weight_and_bias_is_wrong(tmp_path, harness):
    p = kb_file(tmp_path, "kb_layernorm", LAYERNORM)
    assert p.c_signature == "void kb_layernorm(const float *in0, const float *p0, const float *p1, float *out0)"
    body = """
#include <stdint.h>
#include <math.h>
void kb_layernorm(const float *in0, const float *p0, const float *p1, float *out0) {
    for (int r = 0; r < 8; r++) {
        const float *x = in0 + r * 64; float m = 0, v = 0;
        for (int i = 0; i < 64; i++) m += x[i];
        m /= 64;
        for (int i = 0; i < 64; i++) v += (x[i] - m) * (x[i] - m);
        float inv = 1.0f / sqrtf(v / 64 + 1e-5f);
        for (int i = 0; i < 64; i++) out0[r * 64 + i] = (x[i] - m) * inv WEIGHTED;
    }
}
"""
    ignores = body.replace("WEIGHTED", "")
    uses = body.replace("WEIGHTED", "* p0[i] + p1[i]")
    assert harness.evaluate(p, ignores, measure=False).outcome.value == "wrong"
    assert harness.evaluate(p, uses, measure=False).outcome.value == "verified"


def test_zeros_do_not_pass_a_softmax_whose_outputs_are_all_below_the_tolerance(tmp_path, harness):
    p = kb_file(tmp_path, "kb_softmax", SOFTMAX)
    assert p.tolerance.atol == 1e-2
    zeros = ("#include <string.h>\n"
             "void kb_softmax(const float *in0, float *out0) { memset(out0, 0, 16 * 16384 * 4); }\n")
    v = harness.evaluate(p, zeros, measure=False)
    assert v.outcome.value == "wrong", v.detail


def test_a_file_too_large_to_load_is_scaled_down_and_says_so(tmp_path):
    p = kb_file(tmp_path, "kb_huge", HUGE)
    assert "scaled down" in p.note and "dim 393216 ->" in p.note
    sizes = p.workload[0]
    assert sizes["in0_d0"] * sizes["in0_d1"] * 4 * 2 <= 256 << 20


def test_the_vs_reference_column_times_the_fp32_model():
    p = load_problem(LINEAR_RELU)
    assert p.eager is not None
    t = to_torch(p.make_inputs(p.workload[0], np.random.default_rng(3), "normal"))
    assert p.eager(t)().dtype == torch.float32


# -- tolerances from torch's own error -------------------------------------------------------------

MSE = """
class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)

def get_inputs():
    return [torch.randn(64, 512), torch.randn(64, 512)]

def get_init_inputs():
    return []
"""

BITS_ABS = """
class Model(nn.Module):
    def forward(self, x):
        return (x.view(torch.int32) & 0x7FFFFFFF).view(torch.float32)  # |x| by its bits: fp32 only

def get_inputs():
    return [torch.randn(8, 32)]

def get_init_inputs():
    return []
"""


def test_kernelbench_cases_carry_the_fp32_models_error_against_the_float64_one():
    from swarmfactory.harness.verify import CASES

    p = load_problem(LINEAR_RELU)
    assert p.fp32_torch is not None and p.torch_error_multiple is None
    for case in p.seed_cases()[:3]:
        data = CASES.get(p, case)
        assert set(data.torch_error) == {"out0"}
        got = p.fp32_torch(to_torch(data.inputs))()[0].numpy()
        assert np.array_equal(got, p.baselines["eager"](to_torch(data.inputs))().numpy(), equal_nan=True)


def test_a_model_without_a_float64_forward_gets_no_bound_from_torch_and_says_so(tmp_path):
    from swarmfactory.harness.verify import expected_for

    p = kb_file(tmp_path, "kb_bits_abs", BITS_ABS)
    assert p.torch_error_multiple == 0 and "no float64 forward" in p.note
    data = expected_for(p, p.make_inputs(p.workload[0], np.random.default_rng(0), "normal"))
    assert data.torch_error == {}


def test_a_loss_verifies_with_its_error_as_a_multiple_of_torchs_in_the_evidence(tmp_path, harness):
    p = kb_file(tmp_path, "kb_mse", MSE)
    blocked = """
#include <stdint.h>
void kb_mse(const float *in0, const float *in1, float *out0) {
    double s = 0.0;
    for (int r = 0; r < 64; r++) {
        float acc = 0.0f;
        for (int c = 0; c < 512; c++) { const float d = in0[r * 512 + c] - in1[r * 512 + c]; acc += d * d; }
        s += acc;
    }
    *out0 = (float)(s / (64.0 * 512.0));
}
"""
    v = harness.evaluate(p, blocked, measure=False)
    assert v.outcome.value == "verified", v.detail
    assert 0 < v.evidence["error_vs_torch"] <= 16
    # the last row left out: about 0.1% off, inside KernelBench's 1e-2, far beyond torch's error
    most = blocked.replace("r < 64; r++", "r < 63; r++").replace("64.0 * 512.0", "63.0 * 512.0")
    v = harness.evaluate(p, most, measure=False)
    assert v.outcome.value == "wrong" and "torch fp32's own" in v.detail, v.detail
