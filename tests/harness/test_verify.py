import numpy as np

from swarmfactory.harness.verify import compare
from swarmfactory.problems import load_problem


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
