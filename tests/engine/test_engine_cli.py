"""`python -m swarmfactory.engine_cli` (mounted as `swarmfactory engine`)."""

import json
import subprocess
import sys


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "swarmfactory.engine_cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_generate_json(model_path):
    r = cli("generate", "What is 2+2?", "--max-tokens", "6", "--weights", "bf16", "--threads", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert 1 <= out["completion_tokens"] <= 6 and out["config"]["weights"] == "bf16"


def test_usage_errors_are_one_line_with_exit_code_2(tmp_path):
    bad = tmp_path / "engine.yaml"
    bad.write_text("weights: bf16\nmax_batchsize: 3\n")
    for args, needle in [
        (("generate", "hi", "--weights", "q5"), "weights"),
        (("serve", "--config", str(bad)), "max_batchsize"),
        (("bench", "--concurrency", "1,x"), "--concurrency"),
        (("generate", "hi", "--model", str(tmp_path / "missing.gguf")), "not found"),
    ]:
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
