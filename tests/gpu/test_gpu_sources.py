"""A GPU problem takes Triton, CUDA C++ and PTX for one ABI, chosen by the file's extension or
--backend; a file that cannot be a kernel of the problem is a one-line error (exit 2) and nothing
is recorded. Without a GPU (forced here, so the tests mean the same on any machine) CUDA and PTX
end as `needs_device`, as does any source whose compiler is missing."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_gpu_build import PTX_OK

from swarmfactory import backends
from swarmfactory.backends.cuda import CUDABackend
from swarmfactory.backends.ptx import PTXBackend
from swarmfactory.backends.triton import TritonBackend
from swarmfactory.cli import main
from swarmfactory.evidence.store import Store
from swarmfactory.problems import load_problem

PROBLEM = "gpu_swiglu"
CUDA = """// launch: grid=(cdiv(rows * cols, 256)) block=(256)
extern "C" __global__ void gpu_swiglu(const float *gate, const float *up, float *y, long long rows, long long cols) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < rows * cols) { float g = gate[i]; y[i] = g / (1.0f + expf(-g)) * up[i]; }
}
"""
PTX = PTX_OK  # a valid entry that writes nothing: builds, and is wrong where it runs
C_KERNEL = (Path(__file__).parents[1] / "adversarial" / "rmsnorm" / "correct_scalar.c").read_text()


def _evaluations(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT count(*) FROM evaluations").fetchone()[0]


@pytest.fixture
def no_gpu(monkeypatch):
    """The CPU path, whatever this machine has."""
    from swarmfactory.harness import gpu

    monkeypatch.setattr(gpu, "cuda_available", lambda: False)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "e.db"
    Store(str(path))
    return path


@pytest.fixture(autouse=True)
def _own_log_handlers(monkeypatch):
    """The in-process CLI adds its stderr handler to our logger; other tests get the logger back as it was."""
    import logging

    logger = logging.getLogger("swarmfactory")
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))


def sf(capsys, *args) -> tuple[int, str, str]:
    """The CLI in this process (one torch import for many commands): exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def test_cu_and_ptx_files_reach_needs_device_through_the_installed_cli(tmp_path):
    exe = str(Path(sys.executable).with_name("swarmfactory"))
    db = tmp_path / "e.db"
    for name, text, backend, tool in (("k.cu", CUDA, "cuda", "nvrtc"), ("k.ptx", PTX, "ptx", "ptxas")):
        (tmp_path / name).write_text(text)
        proc = subprocess.run([exe, "eval", str(tmp_path / name), "-p", PROBLEM, "--json", "--store", str(db)],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "SWARMFACTORY_NO_GPU": "1"})
        assert proc.returncode == 0, proc.stderr
        res = json.loads(proc.stdout)
        assert res["outcome"] == "needs_device", res
        assert f"({backend})" in res["detail"] and tool in res["evidence"]["gpu tools"], res
        assert Store(str(db), create=False).candidate(res["candidate_id"]).backend == backend
    assert _evaluations(db) == 2


def test_the_extension_or_backend_option_picks_the_backend(tmp_path, db, capsys, no_gpu):
    (tmp_path / "kernel").write_text(CUDA)  # no extension: --backend says what it is
    (tmp_path / "kernel.src").write_text(PTX)
    for path, backend in ((tmp_path / "kernel", "cuda"), (tmp_path / "kernel.src", "ptx")):
        code, out, err = sf(capsys, "eval", path, "-p", PROBLEM, "--backend", backend, "--json", "--store", db)
        assert code == 0, err
        res = json.loads(out)
        assert res["outcome"] == "needs_device" and f"({backend})" in res["detail"], res
    (tmp_path / "k.py").write_text(load_problem(PROBLEM).render())
    (tmp_path / "k.ptx").write_text(PTX)
    assert backends.source_backend(load_problem(PROBLEM), str(tmp_path / "k.py")) == "triton"
    assert backends.source_backend(load_problem(PROBLEM), str(tmp_path / "k.ptx")) == "ptx"
    assert backends.source_backend(load_problem("rmsnorm"), "kernel.c") == "c"


def test_a_file_that_cannot_be_a_kernel_is_one_line_exit_2_and_records_nothing(tmp_path, db, capsys):
    files = {"k.cu": CUDA, "k.py": load_problem(PROBLEM).render(), "k.c": C_KERNEL, "k.txt": C_KERNEL,
             "noext": CUDA, "empty.c": "", "blank.cu": " \n\t\n", "blank.py": "\n\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cases = [
        (["k.cu", "-p", "rmsnorm"], "a .cu file is not a kernel for rmsnorm (it takes .c)"),
        (["k.py", "-p", "rmsnorm"], "a .py file is not a kernel for rmsnorm (it takes .c)"),
        (["k.txt", "-p", "rmsnorm"], "a .txt file is not a kernel for rmsnorm (it takes .c)"),
        (["k.c", "-p", PROBLEM], f"a .c file is not a kernel for {PROBLEM} (it takes .py, .cu or .ptx)"),
        (["noext", "-p", PROBLEM], "a file without an extension is not a kernel"),
        (["empty.c", "-p", "rmsnorm"], "empty.c: empty source"),
        (["blank.cu", "-p", PROBLEM], "blank.cu: empty source"),
        (["blank.py", "-p", PROBLEM, "--backend", "triton"], "blank.py: empty source"),
        (["k.py", "-p", PROBLEM, "--backend", "ptx"], "--backend ptx, but a .py file is a triton kernel"),
        (["k.cu", "-p", PROBLEM, "--backend", "triton"], "--backend triton, but a .cu file is a cuda kernel"),
        (["k.c", "-p", "rmsnorm", "--backend", "cuda"], "--backend cuda: rmsnorm takes c (.c)"),
        (["k.cu", "-p", PROBLEM, "--backend", "nope"], "--backend nope: unknown backend; known: c, cuda, ptx, triton"),
    ]
    for (name, *args), expected in cases:
        code, out, err = sf(capsys, "eval", tmp_path / name, *args, "--json", "--store", db)
        assert code == 2 and out == "", (name, args, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (name, args, err)
    assert _evaluations(db) == 0
    missing = tmp_path / "new.db"  # nor is a store created for a kernel that is refused
    assert sf(capsys, "eval", tmp_path / "k.txt", "-p", "rmsnorm", "--store", missing)[0] == 2
    assert not missing.exists()


def test_the_api_refuses_an_empty_source_or_a_foreign_backend_before_recording(db):
    from swarmfactory.api import evaluate

    store = Store(str(db), create=False)
    with pytest.raises(ValueError, match="empty source"):
        evaluate("rmsnorm", "  \n", store)
    with pytest.raises(ValueError, match="rmsnorm takes c sources, not cuda"):
        evaluate("rmsnorm", CUDA, store, backend="cuda")
    assert _evaluations(db) == 0


def test_gpu_problems_take_three_backends_and_records_keep_theirs():
    gpu, cpu = load_problem(PROBLEM), load_problem("rmsnorm")
    assert gpu.backends == ("triton", "cuda", "ptx") and cpu.backends == ("c",)
    assert gpu.backend_of({"backend": "ptx"}) == "ptx"
    assert gpu.backend_of({"backend": "c"}) == "triton" and gpu.backend_of({}) == "triton"
    assert cpu.backend_of({"backend": "cuda"}) == "c"


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """``fresh(name, cls)``: a new instance of a backend in place of the shared one (its cached
    tool versions stay its own) and an empty build cache."""
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "cache"))

    def swap(name, cls):
        inst = cls()
        monkeypatch.setitem(backends._INSTANCES, name, inst)
        return inst
    return swap


def test_a_missing_compiler_is_needs_device_after_the_checks_that_need_none(gpu_harness, monkeypatch, fresh,
                                                                             no_gpu):
    from swarmfactory.backends import cuda, ptx

    problem = load_problem(PROBLEM)
    monkeypatch.setattr(ptx, "find_ptxas", lambda: None)
    monkeypatch.setattr(cuda, "_nvrtc", lambda: None)
    fresh("ptx", PTXBackend)
    fresh("cuda", CUDABackend)
    monkeypatch.setattr(fresh("triton", TritonBackend), "versions", lambda: {"triton": "missing"})
    for backend, source, tool in (("ptx", PTX, "ptxas not found"), ("cuda", CUDA, "NVRTC not found"),
                                  ("triton", problem.render(), "Triton is not installed")):
        v = gpu_harness.evaluate(problem, source, backend=backend)
        assert v.outcome.value == "needs_device" and tool in v.detail and "no NVIDIA GPU" in v.detail, (backend, v)
    # what can be checked without the tool still is
    for backend, source, why in (("ptx", PTX.replace(".entry gpu_swiglu", ".entry other"), ".entry gpu_swiglu"),
                                 ("cuda", CUDA.replace("// launch:", "// nothing:"), "no launch geometry"),
                                 ("triton", problem.render().replace("def gpu_swiglu(", "def other("),
                                  "def gpu_swiglu(...)")):
        v = gpu_harness.evaluate(problem, source, backend=backend)
        assert v.outcome.value == "build_failed" and why in v.detail, (backend, v)
