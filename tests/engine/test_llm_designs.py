"""The design LLM over real HTTP: a replay server on 127.0.0.1 stands in for the paid API (no
model is loaded). Good answers give designs the engine accepts; bad answers and failed calls give
none and a reason, never an exception."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmfactory.engine.config import EngineConfig
from swarmfactory.enginefactory import design as D
from swarmfactory.enginefactory.llm_designs import DesignLLM, design_prompt, parse_designs
from swarmfactory.llm.client import ChatClient, Endpoint

sys.path.insert(0, str(Path(__file__).parents[1] / "llm"))
from replay_server import ReplayServer  # noqa: E402

GOOD = """Two ideas.
```json
[{"native_decode": 32, "native_prefill": 64, "dense": "calibrated", "kv_dtype": "fp32", "prefill_chunk": 64,
  "max_batch": 32, "threads": 0, "why": "all native: invariant"},
 {"native_decode": 0, "native_prefill": 0, "dense": "none", "kv_dtype": "bf16", "prefill_chunk": 128,
  "max_batch": 64, "threads": 0, "attention": "exact", "why": "all int4 with a smaller cache"}]
```"""
MEASURED = [
    {"knobs": dict(D.DEFAULT_KNOBS), "verdict": "wrong", "ratio": 0.0,
     "detail": "batched vs alone: prompt 0 diverged at token 5"},
    {"knobs": {**D.DEFAULT_KNOBS, "native_decode": 64, "native_prefill": 128, "prefill_chunk": 128, "max_batch": 64},
     "verdict": "not_faster", "ratio": 0.97, "detail": "0.97x the default design",
     "serving": {"128x128": {"c1": 21.5, "c16": 140.2}}},
]
BASE = EngineConfig(weights="q4_1")


def agent(srv, timeout_s=5.0):
    return DesignLLM(ChatClient(Endpoint("replay", srv.url, "replay"), timeout_s=timeout_s, retries=0),
                     target="q4_1 weights; workloads 128x128; concurrency 1, 16")


def test_a_good_answer_gives_designs_the_engine_builds_and_the_prompt_shows_space_and_evidence():
    with ReplayServer([{"content": GOOD}]) as srv:
        llm = agent(srv)
        props = llm.propose(D.KNOBS, MEASURED, {}, 4)
        body = srv.requests[0]["body"]
    assert [p.rationale for p in props] == ["all native: invariant", "all int4 with a smaller cache"]
    for p in props:
        design = D.build(p.knobs, BASE)
        assert D.batch_invariant(design.knobs)
    assert llm.calls[-1].status == "ok" and llm.calls[-1].dropped == []
    prompt = body["messages"][-1]["content"]
    for name, values in D.KNOBS.items():
        assert f"`{name}`: " + ", ".join("null" if v is None else json.dumps(v) for v in values) in prompt
    assert "0.970x the default" in prompt and "prompt 0 diverged at token 5" in prompt and "c16" in prompt
    assert prompt.index("native_decode=64") < prompt.index("native_decode=null")  # best first, failures after
    assert "q4_1 weights; workloads 128x128" in prompt and "Batch invariance" in prompt
    assert "up to 4 new designs" in prompt


def test_fixed_knobs_override_the_answer_and_are_stated_in_the_prompt():
    with ReplayServer([{"content": GOOD}]) as srv:
        props = agent(srv).propose(D.KNOBS, [], (("threads", 1), ("max_batch", 32)), 4)  # as TuneConfig.fixed
        prompt = srv.requests[0]["body"]["messages"][-1]["content"]
    assert props and all(p.knobs["threads"] == 1 and p.knobs["max_batch"] == 32 for p in props)
    assert "fixed by the deployment to 1" in prompt and "nothing yet" in prompt


def test_a_new_knob_in_the_space_is_offered_with_its_values_and_accepted():
    space = {**D.KNOBS, "spec_decode": ("off", "ngram")}  # a knob the prompt has no words for yet
    with ReplayServer([{"content": '[{"spec_decode": "ngram", "max_batch": 16}]'}]) as srv:
        props = agent(srv).propose(space, [], {}, 2)
        prompt = srv.requests[0]["body"]["messages"][-1]["content"]
    assert props[0].knobs == {"spec_decode": "ngram", "max_batch": 16}
    assert '- `spec_decode`: "off", "ngram"\n' in prompt
    assert '- `kernels`: "builtin", "champion". builtin = ' in prompt  # a known knob comes with its meaning


@pytest.mark.parametrize("script, status, reason", [
    ({"content": "%%% not json at all }{"}, "parse_error", "no JSON"),
    ({"content": "I would raise max_batch and use the native decoder."}, "parse_error", "no JSON"),
    ({"content": ""}, "empty", "no JSON"),
    ({"content": '[{"batch_size": 48, "speculative": true}]'}, "no_designs", "unknown knob 'batch_size'"),
    ({"content": '[{"max_batch": 48}, {"kv_dtype": "fp8"}, {"threads": true}]'}, "no_designs",
     "max_batch=48 is not one of [16, 32, 64, 128]"),
    ({"content": '["all native", 3, null]'}, "no_designs", "not an object"),
    ({"status": 500}, "http", "HTTP 500"),
    ({"sleep": 1.5, "content": GOOD}, "timeout", "no answer within"),
])
def test_a_bad_answer_or_a_failed_call_gives_no_design_and_a_recorded_reason(script, status, reason):
    with ReplayServer([script]) as srv:
        llm = agent(srv, timeout_s=0.5)
        assert llm.propose(D.KNOBS, MEASURED, {}, 3) == []
    rec = llm.calls[-1]
    assert rec.status == status and reason in rec.error, rec
    assert llm.disabled is None


def test_parsing_keeps_what_it_can_and_says_why_for_the_rest():
    text = ('{"designs": [{"knobs": {"native_decode": "32", "weights": "q4_1"}, "why": "a"}, '
            '{"native_decode": 32.0}, {"dense": null}, {"native_decode": "calibrated"}]}')
    props, dropped = parse_designs(text, D.KNOBS, {}, 2)
    assert [p.knobs for p in props] == [{"native_decode": 32}, {"dense": "calibrated"}]
    assert any("unknown knob 'weights'" in d for d in dropped)
    assert any("same design as an earlier one" in d for d in dropped)
    assert any("more than the 2 asked for" in d for d in dropped)
    single, _ = parse_designs('Sure: {"max_batch": 64, "rationale": "more slots"} hope it helps', D.KNOBS, {}, 3)
    assert single[0].knobs == {"max_batch": 64} and single[0].rationale == "more slots"


def test_calls_run_in_the_background_and_repeated_fatal_errors_disable_the_agent(store):
    with ReplayServer([{"sleep": 0.5, "content": GOOD}, {"status": 400}]) as srv:
        llm = agent(srv)
        llm.bind(store, "run1", "engine:test")
        t0 = time.monotonic()
        assert llm.submit(D.KNOBS, MEASURED, {}, 2) and time.monotonic() - t0 < 0.3  # does not wait
        assert not llm.submit(D.KNOBS, MEASURED, {}, 2)  # one call at a time
        assert llm.ready() == []
        while llm.busy():
            time.sleep(0.05)
        assert len(llm.ready()) == 2 and llm.ready() == []
        for _ in range(3):  # HTTP 400: unrecoverable
            assert llm.submit(D.KNOBS, MEASURED, {}, 2)
            while llm.busy():
                time.sleep(0.05)
            assert llm.ready() == []
        assert "3 unrecoverable errors in a row" in llm.disabled
        assert not llm.submit(D.KNOBS, MEASURED, {}, 2) and llm.propose(D.KNOBS, MEASURED, {}, 2) == []
        assert len(srv.requests) == 4
    rows = store.llm_calls("run1")
    assert [r.status for r in rows] == ["ok", "http_fatal", "http_fatal", "http_fatal"]
    assert rows[0].operator == "design" and rows[0].problem == "engine:test"
    assert rows[0].prompt_tokens > 0 and rows[0].raw is None and "HTTP 400" in rows[1].error


def test_the_cost_cap_disables_the_agent():
    with ReplayServer([{"content": GOOD}]) as srv:
        ep = Endpoint("replay", srv.url, "replay", price_in=1e6, price_out=1e6)
        llm = DesignLLM(ChatClient(ep, retries=0, cost_cap_usd=0.01))
        assert len(llm.propose(D.KNOBS, [], {}, 2)) == 2
        assert llm.propose(D.KNOBS, [], {}, 2) == [] and llm.calls[-1].status == "cost_cap"
        assert "cost cap reached" in llm.disabled and len(srv.requests) == 1


def test_the_prompt_caps_the_measured_designs_and_keeps_the_best():
    rows = [{"knobs": {**D.DEFAULT_KNOBS, "max_batch": 16}, "verdict": "not_faster", "ratio": 0.5 + i / 100,
             "detail": f"row {i}"} for i in range(30)]
    rows += [{"knobs": dict(D.DEFAULT_KNOBS), "verdict": "crashed", "ratio": 0.0, "detail": f"crash {i}"}
             for i in range(8)]
    prompt = design_prompt(D.KNOBS, rows, {}, 3, "")[1]["content"]
    assert "row 29" in prompt and "row 15" in prompt and "row 14" not in prompt
    assert "crash 7" in prompt and "crash 2" not in prompt and "18 more not shown" in prompt


def test_engine_tune_refuses_a_bad_llm_endpoint_before_any_work(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    for args, needle in [(("--llm", "bad-spec"), "bad --llm 'bad-spec'"),
                         (("--llm", "http://127.0.0.1:9/v1"), "--llm-model"),
                         (("--llm", "openai:gpt-4o-mini"), "OPENAI_API_KEY"),
                         (("--llm", "local"), "not available for engine tune")]:
        r = subprocess.run([sys.executable, "-m", "swarmfactory.engine_cli", "tune", *args, "--store",
                            str(tmp_path / "e.db"), "--model", str(tmp_path / "missing.gguf")],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "e.db").exists()  # refused before the store, the model or the reference


def test_the_tune_loop_measures_the_llms_designs_first_and_records_why(tmp_path):
    """Wiring: the Tuner starts a call without waiting, queues the answer's valid designs ahead of
    its own proposals (dropping a non-invariant one, with a log line), and the rationale goes into
    the evidence. No engine is loaded: the loop's proposal step alone."""
    from swarmfactory.enginefactory.measure import Entry
    from swarmfactory.enginefactory.tune import TuneConfig, Tuner
    from swarmfactory.evidence.store import Store

    mixed = json.dumps([{"native_decode": 8, "max_batch": 32, "why": "mixes paths by batch"},
                        {"native_decode": 0, "dense": "none", "attention": "exact", "max_batch": 64,
                         "why": "int4 throughout, exact attention"}])
    logs = []
    with ReplayServer([{"content": mixed}]) as srv:
        tuner = Tuner(TuneConfig(workloads=((16, 8),), concurrency=(1,)), Store(str(tmp_path / "e.db")),
                      llm=agent(srv), log=logs.append)
        tuner.default = Entry(D.build({}, tuner.base), 1.0, 10.0)
        first = tuner._propose()  # the call starts; the loop does not wait for it
        assert first is not None and first[1] != tuner.llm.name
        deadline = time.time() + 10
        while tuner.llm.busy() and time.time() < deadline:
            time.sleep(0.05)
        design, agent_name, parents = tuner._propose()
    assert agent_name == "llm-design:replay" and parents == []
    assert design.knobs["attention"] == "exact" and design.config.max_batch == 64
    assert tuner.proposer.rationale[design.key] == "int4 throughout, exact attention"
    assert any("not batch invariant" in m for m in logs), logs
    prompt = srv.requests[0]["body"]["messages"][-1]["content"]
    assert "`attention`: " in prompt and "`kernels`: " in prompt
