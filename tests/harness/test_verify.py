import numpy as np
import pytest

from swarmfactory.outcome import Outcome, Rejected
from swarmfactory.harness.accuracy import (TORCH_ERROR_FLOOR, TORCH_ERROR_MULTIPLE, ErrorStats, error_stats,
                                           error_vs_torch, fp32_torch_path)
from swarmfactory.harness.verify import check_slot, compare, expected_for
from swarmfactory.problems import load_problem
from swarmfactory.problems.spec import Case, to_torch


def test_compare_accepts_within_tolerance_and_reports_the_first_bad_element():
    p = load_problem("rmsnorm")
    exp = {"y": np.ones((2, 3))}
    assert compare(p, exp, {"y": np.ones((2, 3), np.float32) * (1 + 5e-5)}, "c") is None
    got = np.ones((2, 3), np.float32)
    got[1, 2] = np.nan
    msg = compare(p, exp, {"y": got}, "case X")
    assert "1 of 6" in msg and "[1, 2]" in msg and "never written" in msg and "case X" in msg


def test_compare_matches_nan_and_inf_where_the_reference_has_them():
    p = load_problem("rmsnorm")
    exp = {"y": np.array([np.nan, np.inf, -np.inf, 1.0])}
    got = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert compare(p, exp, {"y": got}, "c") is None
    assert compare(p, exp, {"y": got[::-1].copy()}, "c") is not None


def test_compare_rejects_wrong_dtype_or_shape():
    p = load_problem("rmsnorm")
    assert "float32" in compare(p, {"y": np.ones(3)}, {"y": np.ones(3)}, "c")
    assert "expected" in compare(p, {"y": np.ones(3)}, {"y": np.ones(4, np.float32)}, "c")


# -- the bound from torch's own fp32 error ---------------------------------------------------------


def _with_error(exp: np.ndarray, rel: float, rng) -> np.ndarray:
    """``exp`` in fp32 with a relative error of about ``rel`` on every element (random signs)."""
    return (exp * (1 + rel * rng.choice([-1.0, 1.0], exp.shape) * rng.uniform(0.5, 1.0, exp.shape))
            ).astype(np.float32)


def _bound_case(rel_torch: float, rel_cand: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    exp = {"y": rng.uniform(0.5, 2.0, 4096)}
    atol = {"y": 1e-30}
    torch_err = {"y": error_stats(exp["y"], _with_error(exp["y"], rel_torch, rng), atol["y"])}
    got = {"y": _with_error(exp["y"], rel_cand, rng)}
    return exp, got, atol, torch_err


def test_an_error_100x_torchs_fails_and_2x_passes():
    p = load_problem("swiglu")
    exp, got, atol, t = _bound_case(1e-6, 1e-4)
    ratio, failure = error_vs_torch(p, exp, got, atol, t, "case Z")
    assert ratio > TORCH_ERROR_MULTIPLE and failure is not None
    assert "torch fp32's own" in failure and "case Z" in failure and f"allowed {TORCH_ERROR_MULTIPLE:g}x" in failure
    exp, got, atol, t = _bound_case(1e-6, 2e-6)
    ratio, failure = error_vs_torch(p, exp, got, atol, t, "case Z")
    assert failure is None and 1.0 < ratio < 4.0


def test_where_torch_is_exact_a_kernel_need_not_be_bit_exact():
    p = load_problem("swiglu")
    exp = {"y": np.random.default_rng(1).uniform(0.5, 2.0, 1000).astype(np.float32).astype(np.float64)}
    exact = {"y": error_stats(exp["y"], exp["y"].astype(np.float32), 1e-30)}
    assert exact["y"] == ErrorStats(0.0, 0.0)
    one_ulp = {"y": np.nextafter(exp["y"].astype(np.float32), np.float32(np.inf))}
    ratio, failure = error_vs_torch(p, exp, one_ulp, {"y": 1e-30}, exact, "c")
    assert failure is None and ratio <= TORCH_ERROR_MULTIPLE
    # ... but the floor is a few ulps, not a tolerance: 100 ulps off an exact answer is wrong
    far = {"y": (exp["y"] * (1 + 100 * 2.0 ** -23)).astype(np.float32)}
    assert error_vs_torch(p, exp, far, {"y": 1e-30}, exact, "c")[1] is not None
    assert TORCH_ERROR_FLOOR < 10 * 2.0 ** -23


def test_the_median_catches_an_approximation_worse_almost_everywhere():
    """torch's max is set by one ill-conditioned element; a kernel 100x worse on all the others
    stays under K x that max, not under K x torch's median."""
    p = load_problem("swiglu")
    rng = np.random.default_rng(2)
    exp = {"y": rng.uniform(0.5, 2.0, 4096)}
    t_out = _with_error(exp["y"], 1e-7, rng)
    t_out[7] = np.float32(exp["y"][7] * (1 + 1e-4))  # one element torch gets badly
    t = {"y": error_stats(exp["y"], t_out, 1e-30)}
    got = {"y": _with_error(exp["y"], 1e-5, rng)}
    ratio, failure = error_vs_torch(p, exp, got, {"y": 1e-30}, t, "c")
    assert failure is not None and failure.startswith("median error")


def test_nan_and_infinite_elements_are_left_to_the_nan_aware_comparison():
    exp = np.array([np.nan, np.inf, 1.0, 2.0])
    got = np.array([np.nan, np.inf, 1.0, 2.0], np.float32)
    assert error_stats(exp, got, 1e-30) == ErrorStats(0.0, 0.0)
    assert error_stats(np.array([np.nan]), np.array([np.nan], np.float32), 1e-30) is None


@pytest.mark.parametrize("name", ["softmax", "rope", "q4_1_matmul"])
def test_every_case_carries_torchs_error_and_torchs_own_answer_passes(name):
    p = load_problem(name)
    case = Case({k: v for k, v in p.edge_shapes[0].items()}, seed=3)
    data = expected_for(p, p.case_inputs(case))
    assert set(data.torch_error) == {a.name for a in p.outputs}
    out = fp32_torch_path(p)(to_torch(data.inputs))()
    outs = out if isinstance(out, (tuple, list)) else (out,)
    got = {a.name: o.detach().float().numpy() for a, o in zip(p.outputs, outs)}
    ratio, failure = error_vs_torch(p, data.expected, got, data.atol, data.torch_error, "c")
    assert failure is None and ratio <= 1.0


class _Slot:
    """A slot group's interface, with outputs we choose."""

    def __init__(self, outputs):
        self._outputs = outputs

    def damage(self, i):
        return None

    def changed_inputs(self, i):
        return []

    def outputs(self, i):
        return self._outputs


def test_check_slot_rejects_beyond_k_naming_the_case_and_returns_the_ratio_otherwise():
    p = load_problem("swiglu")
    data = expected_for(p, p.case_inputs(Case({"n": 4099}, seed=5)))
    exp = data.expected["y"]
    rng = np.random.default_rng(0)
    t = data.torch_error["y"]
    good = _with_error(exp, 2 * max(t.median, 2.0 ** -24), rng)
    ratio = check_slot(_Slot({"y": good}), 0, p, data, "case n=4099", "verify")
    assert ratio is not None and ratio <= TORCH_ERROR_MULTIPLE
    assert 40 * t.max < 1e-5
    bad = _with_error(exp, 40 * t.max, rng)  # inside swiglu's rtol 1e-5: the fixed check passes it
    with pytest.raises(Rejected) as info:
        check_slot(_Slot({"y": bad}), 0, p, data, "case n=4099", "verify")
    assert info.value.outcome == Outcome.WRONG and "case n=4099" in info.value.detail
    assert info.value.evidence["error_vs_torch"] > TORCH_ERROR_MULTIPLE
