"""The load generator against the engine's own server (tiny sizes: behaviour, not speed)."""

import re
import subprocess
import sys
import time

import pytest

from swarmfactory.bench.serving import arrivals, bench_sync, make_prompts, parse_slo, text_prompts


def test_prompts_are_seeded_and_exact_length():
    a, b = make_prompts(3, 17, seed=5), make_prompts(3, 17, seed=5)
    assert a == b and all(len(p) == 17 for p in a)
    assert make_prompts(3, 17, seed=6) != a


def test_bench_reports_every_metric(server):
    res = bench_sync(server.url, [1, 2], input_len=16, output_len=8, num_prompts=4, warmup=1)
    assert res["model"].startswith("SmolLM2")
    for lv in res["levels"]:
        assert lv["errors"] == 0 and lv["completed"] == 4
        assert lv["output_tokens"] == 4 * 8  # ignore_eos: fixed output length
        for k in ("output_tok_s", "request_s", "ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "itl_ms_p99"):
            assert lv[k] > 0, k
        # the contention it was measured under: the server (found by its port) is ours, not others
        c = lv["contention"]
        assert set(c) >= {"others", "suffered", "steal", "mhz", "attempts", "busy"}, c
        assert isinstance(c["others"], float) and 0.0 <= c["others"] <= 1.0
        assert 1 <= c["attempts"] <= 3 and c["busy"] == (c["others"] > 0.10)
    assert isinstance(res["warnings"], list)
    assert any("stayed busy" in w for w in res["warnings"]) == any(lv["contention"]["busy"] for lv in res["levels"])


def test_bench_counts_errors_instead_of_failing(server):
    res = bench_sync(server.url, [1], input_len=16, output_len=2000, num_prompts=2, warmup=0)
    lv = res["levels"][0]
    assert lv["errors"] == 2 and lv["completed"] == 0 and "400" in lv["error_samples"][0]


def test_poisson_arrivals_text_prompts_and_slos():
    t = arrivals(4000, 20.0, seed=1)
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert t == arrivals(4000, 20.0, seed=1) and t[0] == 0.0 and all(g >= 0 for g in gaps)
    mean = sum(gaps) / len(gaps)
    assert 0.045 < mean < 0.055  # 1 / rate
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert 0.9 < cv < 1.1  # exponential gaps: standard deviation = mean
    assert arrivals(3, None, 0) == [0.0, 0.0, 0.0]
    a = text_prompts(3, 40, seed=2)
    assert a == text_prompts(3, 40, seed=2) and all(len(p.split()) == 30 for p in a) and len(set(a)) == 3
    assert parse_slo(["ttft:500", "TPOT:50"]) == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    for bad in ("ttft", "itl:5", "e2el:-1", "tpot:x"):
        with pytest.raises(ValueError, match="bad SLO"):
            parse_slo([bad])


def test_bench_at_a_request_rate_on_text_prompts_reports_percentiles_and_goodput(server):
    t0 = time.perf_counter()
    res = bench_sync(server.url, [4], input_len=24, output_len=6, num_prompts=6, warmup=0, request_rate=4.0,
                     dataset="text", slo={"ttft_ms": 60_000.0, "tpot_ms": 0.001})
    lv = res["levels"][0]
    assert lv["errors"] == 0 and lv["completed"] == 6 and lv["request_rate"] == 4.0
    assert time.perf_counter() - t0 >= max(arrivals(6, 4.0, 1)) * 0.9  # the arrivals were waited for
    assert 15 <= lv["prompt_tokens_mean"] <= 60  # about 24 tokens of English, counted by the server
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        p = lv["percentiles"][key]
        assert 0 < p["p50"] <= p["p90"] <= p["p99"], (key, p)
    # a TPOT limit nobody meets: no goodput; the TTFT limit alone is met by every request
    assert lv["goodput"] == {"slo": {"ttft_ms": 60_000.0, "tpot_ms": 0.001}, "request_s": 0.0, "share": 0.0}
    res = bench_sync(server.url, [2], input_len=8, output_len=4, num_prompts=2, warmup=0, slo={"ttft_ms": 60_000.0})
    assert res["levels"][0]["goodput"]["share"] == 1.0


def test_engine_bench_prints_units_percentiles_and_goodput(server):
    out = subprocess.run([sys.executable, "-m", "swarmfactory.engine_cli", "bench", "--url", server.url,
                          "--concurrency", "2", "--input-len", "8", "--output-len", "4", "--num-prompts", "2",
                          "--warmup", "0", "--request-rate", "50", "--dataset", "text", "--goodput", "ttft:60000"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    text = re.sub(r"\s+", " ", out.stdout)
    for head in ("out (tok/s)", "requests (req/s)", "goodput (req/s)", "TTFT p50 (ms)", "p90 (ms)", "p99 (ms)",
                 "E2E", "ITL"):
        assert head in text, (head, out.stdout)
    assert "Poisson 50 req/s" in text and "100%" in text
    bad = subprocess.run([sys.executable, "-m", "swarmfactory.engine_cli", "bench", "--url", server.url,
                          "--goodput", "latency:5"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--goodput" in bad.stderr


def test_random_prompts_stay_within_the_served_vocabulary():
    """A model of 1024 tokens is asked ids it has (the default range reaches 10000)."""
    from swarmfactory.bench.serving import random_prompts

    small = random_prompts(1024)(8, 64, seed=0)
    assert len(small) == 8 and all(len(p) == 64 and 0 <= min(p) and max(p) < 1024 for p in small)
    assert max(max(p) for p in random_prompts(None)(8, 64, seed=0)) >= 1024  # unknown: the wide default
    assert max(max(p) for p in random_prompts(50)(4, 16, seed=1)) < 50
