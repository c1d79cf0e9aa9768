"""The GPU suite: every problem loads, states where its shapes come from, and its seed kernel (the
template's defaults) passes verification under the harness on the small interpreter shapes; every
knob value renders into a module that passes the static checks and the build."""

import itertools
import random

import pytest

from swarmfactory.backends import get_backend
from swarmfactory.harness.gpu import interpret_cases
from swarmfactory.backends.pystatic import check_python
from swarmfactory.problems import list_problems, load_problem, resolve_problems
from swarmfactory.problems.suites.gpu import NAMES


def test_the_gpu_suite_resolves_by_name_and_all_stays_the_cpu_suite():
    assert [p.name for p in resolve_problems("gpu")] == list(NAMES)
    assert not any(p.backend != "c" for p in resolve_problems("all"))
    assert set(NAMES) <= set(list_problems(gpu=True)) and not set(NAMES) & set(list_problems())


@pytest.mark.parametrize("name", NAMES)
def test_each_problem_states_its_model_config_and_small_shapes(name):
    p = load_problem(name)
    assert p.backend == "triton" and p.shapes_from and p.interpret_shapes
    assert all(p.valid_shape(s) for s in (*p.interpret_shapes, *p.workload))
    big = max(sum(s.values()) for s in p.interpret_shapes)
    assert all(sum(s.values()) > big for s in p.workload)  # the interpreter never sees a GPU shape


@pytest.mark.parametrize("name", NAMES)
def test_the_seed_kernel_passes_verification(gpu_harness, name):
    p = load_problem(name)
    cases, dropped = interpret_cases(p, p.seed_cases())
    v = gpu_harness.evaluate(p, p.render(), cases, measure=False)
    assert v.outcome.value == "verified", v.detail  # verified; timing is test_gpu_device's
    assert v.cases_checked == len(cases) >= 8


@pytest.mark.parametrize("name", NAMES)
def test_knob_values_render_modules_that_pass_static_checks_and_build(name):
    p = load_problem(name)
    combos = list(itertools.product(*p.knobs.values()))
    rng = random.Random(0)
    for combo in rng.sample(combos, min(12, len(combos))):
        src = p.render(dict(zip(p.knobs, combo)))
        assert check_python(src) is None
        get_backend("triton").build(src, p.name, prototype=p.py_signature)


def test_a_non_default_configuration_is_verified_too(gpu_harness):
    p = load_problem("gpu_q4_gemv")
    src = p.render({"BLOCK_N": 1, "BLOCK_K": 32, "num_warps": 1})
    v = gpu_harness.evaluate(p, src, interpret_cases(p, p.seed_cases())[0], measure=False)
    assert v.outcome.value == "verified", v.detail


def test_the_interpreter_keeps_small_found_cases_and_drops_gpu_shapes():
    from swarmfactory.problems.spec import Case

    p = load_problem("gpu_swiglu")
    small = Case({"rows": 2, "cols": 5}, seed=1, origin="adversary")
    big = Case({"rows": 64, "cols": 14336}, seed=2, origin="adversary")
    kept, dropped = interpret_cases(p, [small, big])
    assert kept == [small] and dropped == 1  # found cases alone: nothing synthesised around them
    kept, dropped = interpret_cases(p, p.seed_cases())
    assert {tuple(c.shape.values()) for c in kept} == {tuple(s.values()) for s in p.interpret_shapes}
    assert dropped > 0 and all(c.origin == "seed" for c in kept)
