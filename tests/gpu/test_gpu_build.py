"""PTX through ptxas and CUDA C++ through NVRTC: real compilers, no GPU needed. Source that does not
compile is `build_failed` with the compiler's words; source that does ends as `needs_device` on a
machine without a GPU (verification needs one)."""

import dataclasses

import pytest

from swarmfactory.backends import BuildError, backend_names, get_backend
from swarmfactory.backends.gputools import find_nvrtc, find_ptxas
from swarmfactory.harness.gpu import cuda_available
from swarmfactory.problems import load_problem

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="no ptxas here (pip install nvidia-cuda-nvcc-cu12)")
needs_nvrtc = pytest.mark.skipif(find_nvrtc() is None, reason="no NVRTC here (pip install nvidia-cuda-nvrtc-cu12)")

BASE = load_problem("gpu_swiglu")
PTX_OK = """// launch: grid=(cdiv(rows * cols, 256), 1, 1) block=(256, 1, 1)
.version 8.0
.target sm_90
.address_size 64
.visible .entry gpu_swiglu(.param .u64 gate, .param .u64 up, .param .u64 y, .param .u64 rows, .param .u64 cols)
{
    ret;
}
"""
CUDA_OK = """// launch: grid=(cdiv(rows * cols, 256)) block=(256)
extern "C" __global__ void gpu_swiglu(const float *gate, const float *up, float *y, long long rows, long long cols) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < rows * cols) { float g = gate[i]; y[i] = g / (1.0f + expf(-g)) * up[i]; }
}
"""


def as_backend(name):
    return dataclasses.replace(BASE, backend=name, template=None, knobs={}, knob_defaults={}, knob_aspects={})


def test_the_gpu_backends_are_registered():
    assert {"c", "triton", "cuda", "ptx"} <= set(backend_names())


@needs_ptxas
def test_bad_ptx_is_build_failed_with_ptxas_message(harness):
    v = harness.evaluate(as_backend("ptx"), PTX_OK.replace("ret;", "bogus.op %r9;\n    ret;"))
    assert v.outcome.value == "build_failed"
    assert "ptxas" in v.detail and "bogus" in v.detail and "line 7" in v.detail


@needs_ptxas
def test_ptx_without_the_problems_entry_is_build_failed(harness):
    v = harness.evaluate(as_backend("ptx"), PTX_OK.replace("gpu_swiglu", "other"))
    assert v.outcome.value == "build_failed" and ".entry gpu_swiglu" in v.detail


@needs_ptxas
def test_good_ptx_builds_and_then_needs_a_device(harness):
    art = get_backend("ptx").build(PTX_OK, "gpu_swiglu")
    assert open(art.path, "rb").read(4) == b"\x7fELF"  # a cubin
    v = harness.evaluate(as_backend("ptx"), PTX_OK)
    assert v.outcome.value == "needs_device"
    assert ("no NVIDIA GPU here" in v.detail) != cuda_available()


@needs_nvrtc
def test_bad_cuda_is_build_failed_with_nvrtc_message(harness):
    v = harness.evaluate(as_backend("cuda"), CUDA_OK.replace("float g = gate[i];", "float g = gate[i]"))
    assert v.outcome.value == "build_failed"
    assert "NVRTC error" in v.detail and "kernel.cu(4)" in v.detail


@needs_nvrtc
def test_good_cuda_builds_a_cubin_and_then_needs_a_device(harness):
    art = get_backend("cuda").build(CUDA_OK, "gpu_swiglu")
    assert open(art.path, "rb").read(4) == b"\x7fELF"
    assert get_backend("cuda").versions()["nvrtc"] != "missing"
    with pytest.raises(BuildError, match='extern "C"'):
        get_backend("cuda").build(CUDA_OK.replace('extern "C" ', ""), "gpu_swiglu")
    v = harness.evaluate(as_backend("cuda"), CUDA_OK)
    assert v.outcome.value == "needs_device"


@needs_nvrtc
@pytest.mark.parametrize("launch, expect", [
    (None, "no launch geometry"),
    ("// launch: grid=(rows) block=(__import__('os'))", "is not allowed"),
    ("// launch: grid=(rows * 2", "needs grid=(...) and block=(...)"),
    ("// launch: grid=(heads) block=(128)", "not an integer argument"),
])
def test_a_cubin_source_without_a_valid_launch_geometry_is_build_failed(harness, launch, expect):
    body = CUDA_OK.split("\n", 1)[1]
    v = harness.evaluate(as_backend("cuda"), (launch + "\n" if launch else "") + body)
    if expect == "not an integer argument":  # names are checked when the geometry is evaluated
        from swarmfactory.backends.gpu_worker import launch_geometry

        with pytest.raises(ValueError, match=expect):
            launch_geometry(launch.split("launch:")[1], {"rows": 2, "cols": 3})
        return
    assert v.outcome.value == "build_failed", v.detail
    assert expect in v.detail


def test_the_launch_geometry_is_evaluated_over_the_integer_arguments():
    from swarmfactory.backends.gpu_worker import launch_geometry, parse_launch

    spec = parse_launch(CUDA_OK)
    assert launch_geometry(spec, {"rows": 3, "cols": 100}) == ((2, 1, 1), (256, 1, 1), 0)
    assert launch_geometry("grid=(max(1, rows // 2), cdiv(cols, 32)) block=(32, 4) shared=1024",
                           {"rows": 7, "cols": 65}) == ((3, 3, 1), (32, 4, 1), 1024)
