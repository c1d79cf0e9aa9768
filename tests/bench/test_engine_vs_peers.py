"""The engine-vs-peers benchmark's pure parts: workload and level parsing, server sizing, tables.

No real server runs here (one test starts a stand-in HTTP server to kill the benchmark under it);
the benchmark itself is not part of the test suite.
"""

import importlib.util
import math
from pathlib import Path

import pytest

from swarmfactory.bench.serving import make_prompts

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_vs_peers.py"
_spec = importlib.util.spec_from_file_location("engine_vs_peers", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_defaults_are_the_issues_load():
    assert bench.parse_levels(bench.DEFAULT_CONCURRENCY) == [1, 4, 16, 64]
    assert bench.parse_workloads(bench.DEFAULT_WORKLOADS) == [(128, 128), (1024, 128)]
    assert bench.parse_batches(bench.DEFAULT_LLAMA_BATCHES)[0] == (2048, 512)  # llama-server's own default


@pytest.mark.parametrize("spec", ["", "128", "128x", "x128", "0x128", "128x1", "axb", "128x128,128x128"])
def test_bad_workloads_are_refused(spec):
    with pytest.raises(ValueError):
        bench.parse_workloads(spec)


def test_workloads_parse_in_order():
    assert bench.parse_workloads(" 1024X128, 16x8 ") == [(1024, 128), (16, 8)]


@pytest.mark.parametrize("spec", ["", "0", "1,1", "2,a", "-4"])
def test_bad_levels_are_refused(spec):
    with pytest.raises(ValueError):
        bench.parse_levels(spec)


@pytest.mark.parametrize("spec", ["512", "128:512", "0:0", "a:b", ""])
def test_bad_llama_batches_are_refused(spec):
    with pytest.raises(ValueError):
        bench.parse_batches(spec)


@pytest.mark.parametrize("slots,inp,out", [(1, 128, 128), (16, 128, 128), (64, 1024, 128)])
def test_llama_server_gets_a_slot_per_request_and_room_in_each(slots, inp, out):
    cmd = bench.llama_server_cmd("llama-server", "m.gguf", 8080, 2, slots, inp, out, 512, 128)
    assert int(_flag(cmd, "-np")) == slots
    per_slot = int(_flag(cmd, "-c")) // slots  # llama-server splits -c evenly over the slots
    assert per_slot >= inp + out
    assert (_flag(cmd, "-b"), _flag(cmd, "-ub")) == ("512", "128")
    assert _flag(cmd, "-t") == _flag(cmd, "-tb") == "2"


def test_engine_cmd_sizes_the_engine_for_the_run():
    cmd = bench.engine_cmd(9000, 2, 64, 1168, config="tuned.yaml", no_profile=True)
    assert (_flag(cmd, "--max-batch"), _flag(cmd, "--max-seq-len")) == ("64", "1168")
    assert (_flag(cmd, "--config"), _flag(cmd, "--profile"), _flag(cmd, "--threads")) == ("tuned.yaml", "none", "2")
    assert "--weights" not in cmd
    plain = bench.engine_cmd(9000, 2, 4, 272, weights="bf16")
    assert _flag(plain, "--weights") == "bf16" and "--config" not in plain and "--profile" not in plain
    assert "--model" not in plain  # serve's own default: the bundled model
    assert _flag(bench.engine_cmd(9000, 2, 4, 272, weights="q4_1", model="m.gguf"), "--model") == "m.gguf"
    assert bench.seq_ctx(1024, 128) >= 1024 + 128


def test_engine_cmd_passes_a_profile_alone():
    # a profile sets the whole design: serve refuses it next to sizing or format options
    cmd = bench.engine_cmd(9000, 2, 64, 1168, weights="q4_1", profile="p7", no_profile=True)
    assert cmd[cmd.index("serve"):] == ["serve", "--port", "9000", "--profile", "p7"]


def test_prompts_differ_between_levels_and_workloads():
    short = make_prompts(1, 128, bench.level_seed(0, 128, 0) + 1)[0]
    long = make_prompts(1, 1024, bench.level_seed(0, 1024, 0) + 1)[0]
    assert long[:128] != short  # no shared prefix a cache could reuse across workloads
    assert bench.level_seed(0, 128, 0) != bench.level_seed(0, 128, 1)
    assert bench.level_seed(3, 1024, 2) == bench.level_seed(3, 1024, 2)


def test_table_has_a_section_per_workload_with_p99():
    lv = {"concurrency": 4, "output_tok_s": 100.0, "ttft_ms_median": 50.0, "ttft_ms_p99": 90.0,
          "tpot_ms_median": 10.0, "tpot_ms_p99": 12.5, "errors": 0, "loadavg_1m_after": 1.0,
          "others_cpu_share": 0.25}
    hf = {"concurrency": 4, "output_tok_s": 20.0, "ttft_ms_median": 70.0, "tpot_ms_median": 30.0, "errors": 0,
          "loadavg_1m_after": 1.0}
    results = {"workloads": {
        "128x128": {"input_len": 128, "output_len": 128, "systems": {"engine q4_1": [lv], "HF": [hf]}},
        "1024x128": {"input_len": 1024, "output_len": 128,
                     "systems": {"engine q4_1": [dict(lv, tpot_ms_p99=math.nan)]}}}}
    out = bench.table(results, [1, 4])
    assert "### 128 tokens in / 128 out" in out and "### 1024 tokens in / 128 out" in out
    assert "| 4 | engine q4_1 | 100.0 | 50 | 90 | 10.0 | 12.5 | 0 | 1.0 | 25% |" in out
    assert "| 4 | HF | 20.0 | 70 | n/a | 30.0 | n/a | 0 | 1.0 | n/a |" in out
    assert "| 4 | engine q4_1 | 100.0 | 50 | 90 | 10.0 | n/a |" in out
    assert "| 1 |" not in out  # no row for a level nobody measured
    assert "batch sizes kept" not in out
    results["model"] = "gemma3-270m-Q4_K_M.gguf"
    assert "### 128 tokens in / 128 out, gemma3-270m-Q4_K_M.gguf (TTFT and TPOT in ms)" in bench.table(results, [4])
    llama = dict(lv, llama_batch=512, llama_ubatch=128)
    results["workloads"]["128x128"]["systems"] = {"llama (round 1)": [llama], "llama (round 2)": [llama]}
    assert bench.table(results, [4]).count("batch sizes kept: c=4: -b 512 -ub 128\n") == 1


_HELPER = r"""
import importlib.util, pathlib, sys, time
spec = importlib.util.spec_from_file_location("evp", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
root = pathlib.Path(sys.argv[2])
port = bench.free_port()
proc = bench.Proc([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)],
                  f"http://127.0.0.1:{port}", root / "server.log")
print(proc.p.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_server_the_benchmark_started_dies_when_the_benchmark_is_killed(tmp_path):
    """SIGKILL of the benchmark (no finally block runs) once left llama-server and the engine's
    server running: a server started by Proc is adopted by the process guard and dies with it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "health").write_text("ok")  # the stand-in server answers /health
    helper = subprocess.Popen([sys.executable, "-c", _HELPER, str(_PATH), str(tmp_path)], stdout=subprocess.PIPE,
                              text=True)
    server = int(helper.stdout.readline())
    try:
        assert _alive(server)  # running while the benchmark runs
        helper.send_signal(signal.SIGKILL)
        helper.wait(10)
        deadline = time.time() + 15
        while time.time() < deadline and _alive(server):
            time.sleep(0.2)
        if _alive(server):
            raise AssertionError("the benchmark's server outlived it")
    finally:
        try:
            os.kill(server, signal.SIGKILL)
        except ProcessLookupError:
            pass
