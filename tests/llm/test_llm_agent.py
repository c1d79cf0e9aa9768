"""LLM agents over real HTTP: a replay server for the parsing, repair and failure paths, and our
own engine serving SmolLM2 as a real local OpenAI-compatible endpoint."""

import json
import os
import subprocess
import sys

import pytest

from swarmfactory.config import RunConfig
from swarmfactory.evidence.store import Store
from swarmfactory.llm.client import ChatClient, CostCapReached, Endpoint, LLMError
from swarmfactory.problems import load_problem
from swarmfactory.swarm.coordinator import Coordinator, RunError

from replay_server import ReplayServer

GOOD = load_problem("rmsnorm").render({"vw": 4, "acc": 1, "unroll": 2, "scale": "div", "threads": "none"})
BROKEN = GOOD.replace("double total = 0.0;", "double total = 0.0")  # a syntax error
assert BROKEN != GOOD, "the template changed: break it somewhere else"
FAST = dict(rounds=3, compile_baselines=False, parallel=1, remeasure_champions=False)


def fenced(src):
    return f"Here is a faster kernel.\n```c\n{src}\n```\n"


def test_client_retries_accounts_and_caps_cost():
    with ReplayServer([{"status": 503}, {"content": "hello world"}]) as srv:
        ep = Endpoint("t", srv.url, "m", price_in=1e6, price_out=1e6, paid=False)
        client = ChatClient(ep, retries=2, backoff_s=0.01, cost_cap_usd=0.5)
        text, usage = client.chat([{"role": "user", "content": "hi"}])
        assert text == "hello world" and usage["cost_usd"] > 0.5
        assert client.usage.calls == 2 and client.usage.failures == 1
        with pytest.raises(CostCapReached):
            client.chat([{"role": "user", "content": "again"}])


def test_client_times_out_and_gives_up_with_a_typed_error():
    with ReplayServer([{"sleep": 2, "content": "late"}]) as srv:
        client = ChatClient(Endpoint("t", srv.url, "m"), timeout_s=0.5, retries=1, backoff_s=0.01)
        with pytest.raises(LLMError) as err:
            client.chat([{"role": "user", "content": "hi"}])
        assert err.value.kind == "timeout"


def test_a_paid_endpoint_without_its_key_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(RunError, match="OPENAI_API_KEY"):
        Coordinator(RunConfig.build(problems="rmsnorm", budget=1, llm="openai:gpt-4o-mini"), Store(str(tmp_path / "e.db")))


def test_llm_agent_survives_bad_answers_and_repairs_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMFACTORY_LLM_API_KEY", "sk-test-secret-123")
    script = [
        {"content": fenced(BROKEN)},                        # builds? no: build_failed
        {"content": "<<<<<<< SEARCH\nnot there\n=======\nx\n>>>>>>> REPLACE"},  # does not apply
        {"content": ""},                                    # empty
        {"content": "I think you should vectorise."},       # no code
        *[{"sleep": 3, "content": fenced(GOOD)}] * 3,       # times out, and on both retries
        {"content": fenced(GOOD.replace("acc[0] += v * v;", "acc[0] += v * v; /* fma */"))},
    ]
    store = Store(str(tmp_path / "e.db"))
    def route(body):  # the repair prompt gets the fixed kernel
        if "rejected by the harness" in body["messages"][-1]["content"]:
            return {"content": fenced(GOOD)}
        return None

    with ReplayServer(script, repeat_last=True, route=route) as srv:
        cfg = RunConfig.build(problems="rmsnorm", budget=3, time_s=120, agents="llm", llm=srv.url,
                              llm_model="replay", llm_timeout_s=1.0, **FAST)
        run_id = Coordinator(cfg, store).run()
        auth = {r["auth"] for r in srv.requests}
    calls = store.llm_calls(run_id)
    statuses = [c.status for c in calls]
    assert {"apply_error", "empty", "parse_error", "timeout"} <= set(statuses), statuses
    assert any(c.raw and "vectorise" in c.raw for c in calls if c.status == "parse_error")
    evs = [e for e in store.evaluations(run_id=run_id) if e.purpose == "search"]
    assert len(evs) == 3
    outcomes = {store.candidate(e.candidate_id).operator: e.outcome for e in evs}
    assert outcomes["rewrite-rewrite"] in ("build_failed", "faster", "not_faster")
    assert any(e.outcome == "build_failed" for e in evs)
    repair = next(c for c in calls if c.operator == "repair")
    assert repair.parent == next(e.candidate_id for e in evs if e.outcome == "build_failed")
    assert outcomes.get("repair-rewrite") in ("faster", "not_faster")
    # the key reached the server and nothing else
    assert auth == {"Bearer sk-test-secret-123"}
    with store.engine.connect() as c:
        dump = "".join(str(row) for t in ("llm_calls", "runs", "evaluations", "candidates")
                       for row in c.exec_driver_sql(f"SELECT * FROM {t}"))
    assert "sk-test-secret-123" not in dump
    summary = json.loads(subprocess.run([sys.executable, "-m", "swarmfactory.cli", "show", run_id, "--json",
                                         "--store", str(tmp_path / "e.db")], capture_output=True, text=True).stdout)
    (row,) = summary["llm"]
    assert row["calls"] == len(calls) and row["prompt_tokens"] > 0


def test_a_small_context_switches_the_agent_to_compact_prompts(tmp_path):
    seen = []

    def route(body):  # a 2048-token endpoint whose tokenizer makes 3 characters a token
        tokens = sum(len(m["content"]) for m in body["messages"]) // 3
        seen.append((tokens, body["max_tokens"]))
        if tokens + body["max_tokens"] > 2048:
            return {"status": 400, "error": f"prompt ({tokens} tokens) + max_tokens ({body['max_tokens']}) "
                                            "exceeds the context length of this engine (2048 tokens)"}
        return {"content": fenced(GOOD)}

    store = Store(str(tmp_path / "e.db"))
    with ReplayServer([{"content": ""}], route=route) as srv:
        cfg = RunConfig.build(problems="rmsnorm", budget=1, time_s=60, agents="llm", llm=srv.url,
                              llm_model="replay", **FAST)
        run_id = Coordinator(cfg, store).run()
        first, second = srv.requests[0]["body"], srv.requests[1]["body"]
    statuses = [c.status for c in store.llm_calls(run_id)]
    assert statuses[0] == "context_overflow" and statuses[1] == "ok", statuses
    assert "def reference" in first["messages"][1]["content"]
    assert "def reference" not in second["messages"][1]["content"]
    assert seen[1][0] + seen[1][1] <= 2048 < seen[0][0] + seen[0][1]
    assert len([e for e in store.evaluations(run_id=run_id) if e.purpose == "search"]) == 1


@pytest.mark.slow
def test_llm_local_runs_our_engine_with_smollm2(tmp_path):
    store = Store(str(tmp_path / "e.db"))
    # short answers for 40 s: this is about the wiring to a real local server, not the quality of a
    # 135M model's kernels (answers it cannot parse spend no budget, so the time bounds the run)
    cfg = RunConfig.build(problems="rmsnorm", budget=1, time_s=40, agents="llm", llm="local",
                          llm_timeout_s=60, llm_max_tokens=48, **FAST)
    coord = Coordinator(cfg, store)
    run_id = coord.run()
    assert coord.local_engine is None  # stopped at the end
    calls = store.llm_calls(run_id)
    assert calls, "no call reached the local engine"
    # a call still in flight when the engine stops at the end may fail to connect; the rest answered
    answered = calls[:-1] if calls[-1].status == "http" else calls
    assert answered and all(c.status in ("ok", "parse_error", "apply_error", "empty") for c in answered), calls
    assert all(c.completion_tokens > 0 and c.prompt_tokens > 0 for c in answered if c.status != "empty")


@pytest.mark.slow(covers=("swarmfactory/llm/", "swarmfactory/agents/llm.py", "swarmfactory/agents/prompts/",
                          "swarmfactory/engine/server.py"))
def test_the_local_engine_leaves_room_for_a_whole_kernel():
    """A coder prompt is ~2,000 tokens: the local engine serves SmolLM2's full 8,192-token context,
    so a prompt over 2,048 tokens is accepted with its 1,500 completion tokens (the engine's 2,048
    default would refuse it, or leave a shorter prompt a few dozen tokens to answer in)."""
    import httpx

    from swarmfactory.llm.local import LocalEngine

    with LocalEngine(max_batch=1) as eng:
        models = httpx.get(eng.url + "/models", timeout=10).json()["data"]
        assert models[0]["max_model_len"] == 8192
        body = {"model": models[0]["id"], "max_tokens": 1500, "stream": True,
                "messages": [{"role": "user", "content": "float x; " * 800 + "\nSay hi."}]}
        with httpx.stream("POST", eng.url + "/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200, r.read()
            first = next(line for line in r.iter_lines() if line.startswith("data:"))
        assert json.loads(first[5:])["choices"], first  # streaming began; closing frees the slot
        tokens = httpx.post(eng.url + "/completions", timeout=120, json={
            "model": models[0]["id"], "prompt": body["messages"][0]["content"], "max_tokens": 1}).json()
        assert tokens["usage"]["prompt_tokens"] > 2048, tokens["usage"]
