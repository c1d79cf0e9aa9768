"""The OpenAI-compatible server, tested over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from engine_support import Server


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=120, **kw)


def stream_events(server, path, body):
    events = []
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def wait_idle(server, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        h = server.health()
        if h["running"] == 0 and h["waiting"] == 0:
            return h
        time.sleep(0.1)
    raise AssertionError(f"server still busy: {server.health()}")


def test_health_and_models(server):
    h = server.health()
    assert h["status"] == "ok" and h["free_slots"] == h["max_batch"] == 4
    paths = h["paths"]  # what runs where on this machine
    assert paths["q4_kernel"] and paths["torch_cpu"] and "thresholds" in paths
    assert paths["native"] is None or paths["native_decode"] >= 1
    assert h["memory"]["kv_bytes"] > 0 and h["memory"]["weights_bytes"] > 0
    data = httpx.get(server.url + "/v1/models", timeout=10).json()
    assert data["object"] == "list" and data["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1"  # the file's stem
    assert data["data"][0]["vocab_size"] == 49152  # what a load generator draws random prompt ids from


def test_chat_completion(server):
    r = post(server, "/v1/chat/completions",
             {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 24,
              "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    msg = body["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"].strip()
    assert body["usage"]["completion_tokens"] <= 24 and body["usage"]["prompt_tokens"] > 10


def test_streaming_equals_non_streaming(server):
    req = {"prompt": "The three primary colours are", "max_tokens": 20, "temperature": 0}
    full = post(server, "/v1/completions", req).json()
    chunks = stream_events(server, "/v1/completions", {**req, "stream_options": {"include_usage": True}})
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == full["choices"][0]["text"]
    assert chunks[-1]["usage"]["completion_tokens"] == full["usage"]["completion_tokens"]
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finals == [full["choices"][0]["finish_reason"]]


def test_chat_streaming_format(server):
    chunks = stream_events(server, "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8})
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_ignore_eos_gives_exact_length_and_stop_strings_cut(server):
    r = post(server, "/v1/completions", {"prompt": "Count: 1, 2, 3,", "max_tokens": 40, "temperature": 0,
                                          "ignore_eos": True}).json()
    assert r["usage"]["completion_tokens"] == 40 and r["choices"][0]["finish_reason"] == "length"
    text = r["choices"][0]["text"]
    stop = text[10:13]
    r2 = post(server, "/v1/completions", {"prompt": "Count: 1, 2, 3,", "max_tokens": 40, "temperature": 0,
                                           "ignore_eos": True, "stop": [stop]}).json()
    assert r2["choices"][0]["finish_reason"] == "stop"
    assert r2["choices"][0]["text"] == text[: text.index(stop)]


def test_token_ids_are_returned_on_request(server):
    req = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain = post(server, "/v1/completions", req).json()["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain
    choice = post(server, "/v1/completions", {**req, "return_token_ids": True}).json()["choices"][0]
    assert len(choice["token_ids"]) == 6 and len(choice["prompt_token_ids"]) >= 5 and choice["text"] == plain["text"]
    # the prompt given as those ids: the same completion
    again = post(server, "/v1/completions", {**req, "prompt": choice["prompt_token_ids"],
                                            "return_token_ids": True}).json()["choices"][0]
    assert again["token_ids"] == choice["token_ids"]
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                                  "return_token_ids": True}).json()["choices"][0]
    assert 1 <= len(chat["token_ids"]) <= 4 and chat["prompt_token_ids"]
    r = post(server, "/v1/completions", {**req, "return_token_ids": True, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_token_ids"


def test_seeded_sampling_is_reproducible(server):
    req = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    a = post(server, "/v1/completions", req).json()["choices"][0]["text"]
    b = post(server, "/v1/completions", req).json()["choices"][0]["text"]
    assert a == b


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "JSON object"),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n=1"),
    ("/v1/completions", {"prompt": ""}, 400, "empty"),
    ("/v1/completions", {"prompt": [1, 2, 10**9]}, 400, "token ids"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
])
def test_malformed_requests_get_4xx_with_message(server, path, body, status, needle):
    if isinstance(body, bytes):
        r = httpx.post(server.url + path, content=body, timeout=30, headers={"content-type": "application/json"})
    else:
        r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"


def test_oversized_requests_are_rejected(server):
    r = post(server, "/v1/completions", {"prompt": "word " * 600, "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 100000})
    assert r.status_code == 400 and "exceeds" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", content=b"x" * (5 * 1024 * 1024), timeout=30)
    assert r.status_code == 413


def test_bad_requests_do_not_disturb_a_running_stream(server):
    result = {}

    def run():
        result["chunks"] = stream_events(server, "/v1/completions",
                                         {"prompt": "Tell me a story.", "max_tokens": 48, "ignore_eos": True,
                                          "temperature": 0, "stream_options": {"include_usage": True}})

    t = threading.Thread(target=run)
    t.start()
    for _ in range(5):
        assert post(server, "/v1/completions", {"prompt": "x", "max_tokens": 10**6}).status_code == 400
        assert httpx.post(server.url + "/v1/chat/completions", content=b"{", timeout=30).status_code == 400
    t.join(120)
    assert result["chunks"][-1]["usage"]["completion_tokens"] == 48


def test_concurrent_requests_are_batched(server):
    wait_idle(server)
    seen = []
    results = []

    def one(i):
        r = post(server, "/v1/completions", {"prompt": f"Story {i}:", "max_tokens": 48, "ignore_eos": True,
                                              "temperature": 0})
        results.append(r.json())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen.append(server.health()["running"])
        time.sleep(0.05)
    assert max(seen) >= 3, f"requests were not batched together: {seen}"
    assert sorted(r["usage"]["completion_tokens"] for r in results) == [48] * 4
    wait_idle(server)


def test_client_disconnect_frees_the_slot(server):
    wait_idle(server)
    body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 4:
                break  # leave mid-stream: closes the connection
    with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up
        httpx.post(server.url + "/v1/completions", json=body, timeout=1.5)
    h = wait_idle(server, timeout=20)
    assert h["free_slots"] == h["max_batch"]


def test_api_key_is_enforced(model_path):
    s = Server("--weights", "bf16", "--max-batch", "1", "--max-seq-len", "128", api_key="s3cret")
    try:
        body = {"prompt": "hi", "max_tokens": 2}
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=30, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=30, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        assert httpx.get(s.url + "/health", timeout=10).status_code == 200  # health stays open
    finally:
        s.stop()
