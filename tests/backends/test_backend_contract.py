"""Every backend keeps the contract of backends/base.py: the harness has a line for its runner,
and its language record is what the LLM agent's prompts show and its answers are read by."""

import dataclasses
import re

import pytest

from swarmfactory.agents.edits import EditError, extract_source
from swarmfactory.agents.llm import render_prompt
from swarmfactory.backends import backend_names, get_backend
from swarmfactory.problems import load_problem

NAMES = backend_names()


def written_in(name: str):
    """A bundled problem whose candidates are written in backend ``name``."""
    base = load_problem("rmsnorm" if get_backend(name).runner == "driver" else "gpu_swiglu")
    return dataclasses.replace(base, backend=name, template=None, knobs={}, knob_defaults={}, knob_aspects={})


@pytest.mark.parametrize("name", NAMES)
def test_the_harness_runs_every_backends_pipeline(harness, name):
    prep = harness.prepare(written_in(name), "\n")
    assert prep.backend == name and prep.rejected.outcome.value == "build_failed"
    assert prep.rejected.detail == "the source file is empty"


@pytest.mark.parametrize("name", NAMES)
def test_every_backend_speaks_its_language_in_the_prompts(name):
    backend, problem = get_backend(name), written_in(name)
    lang = backend.language
    assert lang.fence in lang.fences and "" in lang.fences
    system = render_prompt(lang.system_prompt, **backend.target(), symbol=problem.name,
                           signature=backend.signature(problem))
    assert backend.signature(problem) in system and f"```{lang.fence}" in system
    rewrite = render_prompt("rewrite.md.j2", problem=problem, reference_source="...", workload=[], champion=None,
                            lessons=[], parent_source="...", parent_outcome="template default",
                            parent_speedup=None, parent_detail=None)
    assert f"```{lang.fence}\n" in rewrite
    with pytest.raises(EditError, match=re.escape(f"no fenced {lang.name} block")):
        extract_source(f"```{lang.fence}\nnothing here\n```", None, problem.name, name)


def test_a_files_extension_names_one_backend():
    exts = [e for name in NAMES for e in get_backend(name).extensions]
    assert len(exts) == len(set(exts)) and all(e.startswith(".") for e in exts)
