"""The load generator against the engine's own server (tiny sizes: behaviour, not speed)."""

from swarmfactory.bench.serving import bench_sync, make_prompts


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
