"""Agents on GPU problems: knob agents render Triton templates, the LLM agent is prompted for the
problem's backend and its fenced answer is read as that backend's source; a short swarm run on a
GPU problem works end to end on a CPU machine (verified under the interpreter, never `faster`)."""

import random

import pytest

from swarmfactory.agents.base import Board
from swarmfactory.agents.edits import EditError, extract_source
from swarmfactory.agents.knobs import KnobAgent, RandomRestartAgent, SeedAgent
from swarmfactory.agents.llm import render_prompt
from swarmfactory.backends import get_backend
from swarmfactory.harness.gpu import cuda_available
from swarmfactory.backends.pystatic import check_python
from swarmfactory.problems import load_problem


def test_knob_agents_propose_triton_modules_that_build():
    p = load_problem("gpu_softmax")
    board = Board(p, [], None, [], random.Random(1))
    props = SeedAgent().propose(board) + RandomRestartAgent().propose(board, 3)
    assert len(props) == 4 and props[0].knobs == dict(p.knob_defaults)
    for prop in props:
        assert f"BLOCK={prop.knobs['BLOCK']}" in prop.source and f"num_warps={prop.knobs['num_warps']}" in prop.source
        assert check_python(prop.source) is None
        get_backend("triton").build(prop.source, p.name, prototype=p.py_signature)
    assert {a for a in p.knob_aspects.values()} <= {"blocking", "threading", "unrolling"}
    assert KnobAgent("threading").propose(board) == []  # no elite yet to mutate


@pytest.mark.parametrize("backend, fence, text", [
    ("triton", "python", "def gpu_swiglu(gate, up, y, rows, cols):\n    pass\n"),
    ("ptx", "ptx", ".visible .entry gpu_swiglu(.param .u64 a)\n{\n ret;\n}\n"),
    ("cuda", "cuda", 'extern "C" __global__ void gpu_swiglu(float *a) {}\n'),
])
def test_the_llm_agent_reads_the_answer_in_the_problems_language(backend, fence, text):
    src, how = extract_source(f"Here it is:\n```{fence}\n{text}```\n", None, "gpu_swiglu", backend)
    assert how == "rewrite" and src.strip() == text.strip()
    with pytest.raises(EditError, match="no fenced"):
        extract_source(f"```c\n{text}```", None, "gpu_swiglu", "triton" if backend != "triton" else "ptx")


@pytest.mark.parametrize("backend", ["triton", "cuda", "ptx"])
def test_each_gpu_backend_has_its_own_system_prompt(backend):
    p = load_problem("gpu_swiglu")
    sig = p.py_signature if backend == "triton" else p.c_signature
    text = render_prompt(f"system.{backend}.md.j2", arch="sm_90", symbol=p.name, signature=sig)
    assert sig in text and {"triton": "@triton.jit", "cuda": "NVRTC", "ptx": "ptxas"}[backend] in text
    rewrite = render_prompt("rewrite.md.j2", problem=p, reference_source="...", workload=[], champion=None,
                            lessons=[], parent_source=p.render(), parent_outcome="template default",
                            parent_speedup=None, parent_detail=None)
    assert "```python\n" in rewrite


def test_a_short_swarm_run_on_a_gpu_problem_works_end_to_end(tmp_path):
    import swarmfactory

    summary = swarmfactory.run("gpu_swiglu", store=str(tmp_path / "ev.db"), budget=2, parallel=1,
                               rounds=3, remeasure_champions=False)
    row = next(p for p in summary["problems"] if p["problem"] == "gpu_swiglu")
    assert row["evaluations"] == 2
    if not cuda_available():
        assert row["outcomes"] == {"verified": 2} and row["rejected"] == {}
        assert row["champion"] is None  # verified but unmeasured: never a champion
