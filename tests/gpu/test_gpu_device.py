"""On an NVIDIA GPU: the compiled Triton path, the GPU timer and the interleaved measurement. Every
test here skips, with its reason, on a machine without one (CI)."""

import dataclasses

import pytest

from swarmfactory.harness.gpu import cuda_available

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() "
                                                           "is False, or SWARMFACTORY_NO_GPU=1)")


def test_the_seed_kernel_is_verified_compiled_on_the_device(gpu_harness):
    from swarmfactory.problems import load_problem

    p = load_problem("gpu_swiglu")
    prep = gpu_harness.prepare(p, p.render())
    assert prep.rejected is None, prep.rejected and prep.rejected.detail
    assert prep.extra["interpret"] is False
    assert prep.cases_checked == len(p.seed_cases())  # the GPU shapes too, not only the small ones


def test_the_timer_flushes_l2_and_its_event_times_fit_the_wall_clock():
    import torch

    from swarmfactory.harness.gputimer import l2_flush_buffer, time_calls

    x = torch.randn(1 << 20, device="cuda")
    flush = l2_flush_buffer()
    assert flush.numel() * 4 >= 2 * torch.cuda.get_device_properties(0).L2_cache_size
    res = time_calls(lambda t: t.mul_(1.0), [(x,)], samples=5, launches=20, flush=flush)
    assert len(res["ms"]) == 5 and all(0 < ms * 20 <= w for ms, w in zip(res["ms"], res["wall_ms"]))


def test_a_slowed_kernel_is_not_faster_than_the_baseline(gpu_harness):
    from swarmfactory.harness.gputimer import measure_candidate
    from swarmfactory.problems import load_problem

    p = load_problem("gpu_swiglu")
    slow = p.render().replace("    n = rows * cols\n", "    n = rows * cols\n    for _ in range(20):\n"
                                                          "        _swiglu[(triton.cdiv(n, 1024),)](gate, up, y, n, BLOCK=1024)\n")
    p1 = dataclasses.replace(p, workload=p.workload[1:2])
    prep = gpu_harness.prepare(p1, slow)
    assert prep.rejected is None
    v = measure_candidate(gpu_harness, prep, rounds=4, samples=3)
    assert v.outcome.value == "not_faster", v.detail
    assert v.evidence["timing"] and "gpu before" in v.evidence


def test_a_cuda_kernel_is_loaded_and_verified_through_the_driver_api(gpu_harness):
    import dataclasses as dc

    from swarmfactory.harness.gpu import interpret_cases
    from swarmfactory.problems import load_problem

    src = ('// launch: grid=(cdiv(rows * cols, 256)) block=(256)\n'
           'extern "C" __global__ void gpu_swiglu(const float *gate, const float *up, float *y, long long rows, long long cols) {\n'
           '    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n'
           '    if (i < rows * cols) { float g = gate[i]; y[i] = g / (1.0f + expf(-g)) * up[i]; }\n}\n')
    p = dc.replace(load_problem("gpu_swiglu"), backend="cuda", template=None, knobs={}, knob_defaults={},
                   knob_aspects={})
    cases = interpret_cases(p, p.seed_cases())[0]
    assert gpu_harness.evaluate(p, src, cases, measure=False).outcome.value == "verified"
    wrong = src.replace("* up[i]", "* up[i] * 1.01f")
    assert gpu_harness.evaluate(p, wrong, cases, measure=False).outcome.value == "wrong"
