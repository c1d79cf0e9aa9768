"""`swarmfactory eval` on a Triton file, as a user runs it (a real process, a real store)."""

import json
import subprocess
import sys
from pathlib import Path

from swarmfactory.harness.gpu import cuda_available
from swarmfactory.problems import load_problem


def test_eval_of_a_triton_file_reports_its_verdict(tmp_path):
    kernel = tmp_path / "softmax.py"
    kernel.write_text(load_problem("gpu_softmax").render())
    exe = str(Path(sys.executable).with_name("swarmfactory"))
    proc = subprocess.run([exe, "eval", str(kernel), "-p", "gpu_softmax", "--json", "--store", str(tmp_path / "e.db"),
                           "--rounds", "3"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["problem"] == "gpu_softmax" and res["cases_checked"] > 0
    assert res["outcome"] == ("verified" if not cuda_available() else res["outcome"])
    bad = tmp_path / "bad.py"
    bad.write_text(kernel.read_text().replace("def gpu_softmax(x, y, rows, cols)", "def gpu_softmax(x, y)"))
    proc = subprocess.run([exe, "eval", str(bad), "-p", "gpu_softmax", "--json", "--store", str(tmp_path / "e.db")],
                          capture_output=True, text=True, timeout=600)
    res = json.loads(proc.stdout)
    assert res["outcome"] == "build_failed" and "def gpu_softmax(x, y, rows, cols)" in res["detail"]
