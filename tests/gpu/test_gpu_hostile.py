"""Triton candidates through the GPU harness (the real Triton interpreter on a CPU machine, the
compiled path on a GPU): a correct kernel is accepted, wrong and cheating ones get their outcome."""

import dataclasses

import pytest

from swarmfactory.harness.evaluate import HarnessConfig
from swarmfactory.harness.gpu import cuda_available
from swarmfactory.problems import load_problem

SWIGLU = load_problem("gpu_swiglu")
SEED = SWIGLU.render()
KERNEL_LINE = "    tl.store(y_ptr + offs, g / (1.0 + tl.exp(-g)) * u, mask=m)"
LAUNCH = "    n = rows * cols\n"
assert KERNEL_LINE in SEED and LAUNCH in SEED


def small(problem):
    """Only the interpreter shapes (a few seconds per candidate on any machine)."""
    from swarmfactory.harness.gpu import interpret_cases

    return interpret_cases(problem, problem.seed_cases())[0]


def evaluate(h, source, problem=SWIGLU):
    """Verification only: timing is not what these tests are about (on a GPU it would run)."""
    return h.evaluate(problem, source, small(problem), measure=False)


def test_the_seed_kernel_is_verified_and_not_called_faster_without_timing(gpu_harness):
    v = gpu_harness.evaluate(SWIGLU, SEED, small(SWIGLU), measure=not cuda_available())
    if cuda_available():
        assert v.outcome.value == "verified" and v.detail == "verified (not measured)"
    else:
        assert v.outcome.value == "verified", v.detail
        assert "Triton interpreter" in v.detail and "needs an NVIDIA GPU" in v.detail
        assert v.speedup is None
        assert v.evidence["gpu tools"]["device"] == "none: Triton interpreter on CPU"
        assert v.evidence["gpu tools"]["triton"] != "missing"
    assert v.cases_checked >= 10


def test_a_wrong_kernel_is_wrong_with_the_failing_case(gpu_harness):
    v = evaluate(gpu_harness, SEED.replace(KERNEL_LINE, KERNEL_LINE.replace("* u", "* u * 1.001")))
    assert v.outcome.value == "wrong", v.detail
    assert "elements of y outside" in v.detail
    assert '"shape"' in v.evidence["case"]


def test_a_kernel_that_writes_nothing_meets_the_poison(gpu_harness):
    v = evaluate(gpu_harness, SEED.replace(KERNEL_LINE, "    pass"))
    assert v.outcome.value == "wrong"
    assert "never written" in v.detail


def test_a_kernel_that_writes_half_the_output_is_wrong(gpu_harness):
    src = SEED.replace(LAUNCH, "    n = rows * cols\n    n = n - n // 2\n")
    v = evaluate(gpu_harness, src)
    assert v.outcome.value == "wrong", v.detail


CACHING = '''
_memo = {}


''' + SEED.split("\n\n\n", 1)[1].replace(LAUNCH, '''    key = (rows, cols)
    if key in _memo:  # answer from an earlier call of this shape: stale on fresh inputs
        y.copy_(_memo[key])
        return
    n = rows * cols
''').rstrip() + "\n    _memo[key] = y.clone()\n"


def test_outputs_cached_across_calls_are_caught_by_fresh_inputs(gpu_harness):
    src = "import triton\nimport triton.language as tl\n" + CACHING
    cfg = dataclasses.replace(gpu_harness.config, static_checks=False)  # the runtime defence alone
    from swarmfactory.harness.evaluate import Harness

    h = Harness(cfg)
    try:
        v = evaluate(h, src)
    finally:
        h.close()
    assert v.outcome.value == "wrong", v.detail


@pytest.mark.parametrize("snippet, reason", [
    ("import os\n", "imports os"),
    ("import subprocess\n", "imports subprocess"),
    ("from swarmfactory.problems.suites.gpu import gpu_swiglu\n", "imports from swarmfactory"),
    ("torch.exp = lambda t: t\n", "monkey-patching"),
    ("_f = open('/etc/passwd')\n", "uses `open`"),
    ("_x = eval('1')\n", "uses `eval`"),
    ("_g = (lambda: 0).__globals__\n", "__globals__"),
    ("_run = triton.runtime.build.subprocess.run\n", "triton.runtime"),  # the runtime reaches os
    ("_k = triton.knobs\n", "triton.knobs"),
])
def test_static_checks_reject_what_a_kernel_has_no_business_doing(gpu_harness, snippet, reason):
    src = SEED.replace("import triton.language as tl\n", "import triton.language as tl\nimport torch\n" + snippet)
    v = evaluate(gpu_harness, src)
    assert v.outcome.value == "cheated", v.detail
    assert reason in v.detail
    assert v.evidence["isolation"] == "none: the candidate never ran"


def test_a_launcher_that_returns_torchs_result_is_cheated(gpu_harness):
    src = SEED.replace("import triton.language as tl\n", "import triton.language as tl\nimport torch\n")
    src = src.replace(LAUNCH, "    y.copy_(torch.nn.functional.silu(gate) * up)\n    return\n" + LAUNCH)
    v = evaluate(gpu_harness, src)
    assert v.outcome.value == "cheated"
    assert "must compute in Triton" in v.detail


def test_a_kernel_that_writes_into_its_input_is_cheated(gpu_harness):
    v = evaluate(gpu_harness, SEED.replace(KERNEL_LINE, KERNEL_LINE + "\n    tl.store(g_ptr + offs, u, mask=m)"))
    assert v.outcome.value == "cheated"
    assert "modified its input `gate`" in v.detail


def test_a_hang_is_timed_out_and_the_worker_killed():
    from swarmfactory.harness.evaluate import Harness

    h = Harness(HarnessConfig(case_timeout_s=0.4))  # deadlines: 0.4 s x the interpreter's 6 x 3 at first
    try:
        v = evaluate(h, SEED.replace(LAUNCH, "    while rows > 0:\n        rows = rows + 0\n" + LAUNCH))
    finally:
        h.close()
    assert v.outcome.value == "timed_out", v.detail
    assert "worker was killed" in v.detail


def test_a_raising_launcher_is_crashed_with_its_message(gpu_harness):
    v = evaluate(gpu_harness, SEED.replace(LAUNCH, "    n = rows // (cols - cols)\n"))
    assert v.outcome.value == "crashed"
    assert "ZeroDivisionError" in v.detail


def test_a_process_that_exits_is_crashed(gpu_harness):
    src = "import os\n" + SEED.replace(LAUNCH, "    os._exit(3)\n")
    h = gpu_harness.__class__(dataclasses.replace(gpu_harness.config, static_checks=False))
    try:
        v = evaluate(h, src)
    finally:
        h.close()
    assert v.outcome.value == "crashed"
    assert "exited with status 3" in v.detail


@pytest.mark.parametrize("change, expect", [
    (lambda s: s.replace("def _swiglu(", "def _swiglu(:"), "syntax error"),
    (lambda s: s.replace("gate, up, y, rows, cols)", "gate, up, y, rows)"), "the problem's ABI is"),
    (lambda s: s.replace("tl.exp(-g)", "tl.expo(-g)"), "has no `expo`"),
    (lambda s: s.replace("tl.arange(0, BLOCK)", "tl.arange(0, 3)"), "power of 2"),
])
def test_code_triton_or_python_rejects_is_build_failed_with_the_message(gpu_harness, change, expect):
    v = evaluate(gpu_harness, change(SEED))
    assert v.outcome.value == "build_failed", v.detail
    assert expect in v.detail


def test_an_import_error_in_the_worker_is_build_failed():
    from swarmfactory.harness.evaluate import Harness

    h = Harness(HarnessConfig(case_timeout_s=2.0, static_checks=False))
    try:
        v = evaluate(h, "import no_such_module_here\n" + SEED)
    finally:
        h.close()
    assert v.outcome.value == "build_failed"
    assert "no_such_module_here" in v.detail
