"""A problem with two outputs: a baseline's tuple result is matched to the out args in their ABI
order, whatever order ``output_shapes`` lists them in."""

import textwrap

import numpy as np

from swarmfactory.harness.worker import BaselineRunner

PROBLEM = textwrap.dedent('''
    from swarmfactory.problems.spec import Arg, Problem, Tolerance, gen_values

    def make_inputs(shape, rng, dist):
        n = shape["n"]
        return {"a": gen_values(rng, (n,), dist), "b": gen_values(rng, (n,), dist), "n": n}

    def reference(t):
        a, b = t["a"].double(), t["b"].double()
        return {"s": a + b, "d": a - b}

    def setup(t):
        a, b = t["a"], t["b"]
        return lambda: (a + b, a - b)  # in the order of the out args: s, then d

    PROBLEM = Problem(
        name="sum_and_difference", version=1, description="s = a + b and d = a - b",
        args=(Arg("a", "in"), Arg("b", "in"), Arg("s", "out"), Arg("d", "out"), Arg("n", "int")),
        make_inputs=make_inputs,
        output_shapes=lambda s: {"d": (s["n"],), "s": (s["n"],)},  # not the ABI order
        reference=reference, baselines={"torch": setup},
        tolerance=Tolerance(1.3e-6, 1e-30, "one fp32 add"),
        workload=({"n": 64},), edge_shapes=({"n": 1}, {"n": 7}, {"n": 17}, {"n": 31}, {"n": 64}),
    )
''')


def test_a_baseline_tuple_is_matched_to_the_out_args_in_abi_order(tmp_path):
    path = tmp_path / "sum_and_difference.py"
    path.write_text(PROBLEM)
    runner = BaselineRunner(str(path), "torch", "eager", 1)
    a, b = np.arange(5, dtype=np.float32), np.full(5, 2.0, dtype=np.float32)
    runner.set("s0", {"a": a, "b": b, "n": 5}, runner.problem.output_shapes({"n": 5}))
    out = runner.call("s0")["outputs"]
    np.testing.assert_array_equal(out["s"], a + b)
    np.testing.assert_array_equal(out["d"], a - b)
