"""The CLI as a user runs it: a real process, a real kernel file, a real store."""

import json
import subprocess
import sys
from pathlib import Path

ADV = Path(__file__).parent / "adversarial" / "rmsnorm"


def sf(*args, timeout=600):
    """The installed ``swarmfactory`` entry point, as a user runs it."""
    return subprocess.run([str(Path(sys.executable).with_name("swarmfactory")), *args], capture_output=True,
                          text=True, timeout=timeout)


def test_problems_lists_every_bundled_problem_with_its_abi():
    proc = sf("problems", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)["problems"]}
    assert {"rmsnorm", "softmax", "swiglu", "rope", "q4_1_matmul", "attention_decode"} <= set(rows)
    assert rows["rmsnorm"]["abi"].startswith("void rmsnorm(const float *x")


def test_eval_json_reports_a_recorded_verdict(tmp_path):
    db = tmp_path / "e.db"
    proc = sf("eval", "--problem", "rmsnorm", str(ADV / "correct_scalar.c"), "--json", "--store", str(db),
              "--rounds", "3", "--no-compile-baselines")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["outcome"] in ("faster", "not_faster")
    assert res["speedup"] > 0 and res["ci_low"] <= res["speedup"] <= res["ci_high"]
    assert res["candidate_id"] and res["evaluation_id"] == 1
    from swarmfactory.evidence.store import Store

    assert Store(str(db)).evaluation(1).candidate_id == res["candidate_id"]


def test_eval_of_a_broken_kernel_exits_0_with_the_compiler_error(tmp_path):
    proc = sf("eval", "--problem", "rmsnorm", str(ADV / "syntax_error.c"), "--json", "--store", str(tmp_path / "e.db"))
    assert proc.returncode == 0
    res = json.loads(proc.stdout)
    assert res["outcome"] == "build_failed" and "expected" in res["detail"]


def test_usage_errors_exit_2_with_one_line(tmp_path):
    for args in (["eval", "--problem", "nope", str(ADV / "correct_scalar.c")],
                 ["eval", "--problem", "rmsnorm", str(tmp_path / "missing.c")],
                 ["eval", "--problem", str(tmp_path / "missing_problem.py"), str(ADV / "correct_scalar.c")]):
        proc = sf(*args, "--store", str(tmp_path / "e.db"))
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_broken_problem_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad_problem.py"
    bad.write_text("import nonexistent_module\n")
    proc = sf("eval", "--problem", str(bad), str(ADV / "correct_scalar.c"), "--store", str(tmp_path / "e.db"))
    assert proc.returncode == 2
    assert "cannot load problem file" in proc.stderr and "nonexistent_module" in proc.stderr
