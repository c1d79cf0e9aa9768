"""Gemma 3 270M (the real file, Q4_K_M) end to end: ``engine serve --model PATH`` answers the
official openai client, and in fp32 its greedy tokens after a prompt longer than Gemma's 512-token
sliding window are HF transformers' fp32 Gemma3's, read from the same GGUF.

One fp32 server serves every test but the last, which starts the default (q4_1) one. The reference
runs in a subprocess (it takes about a minute and 3 GB to read the file), first and alone: it has
ended before the server starts, so the two never hold their memory at once. The file takes
about 95 s (2 minutes on a machine's first run, which calibrates the q4_1 thresholds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.resources import files

import openai
import pytest

from engine_support import THREADS, Server

# Minutes of CI (the GGUF assembled from its wheels, HF's fp32 reference, two servers): run where
# the code that serves it changed in the landing, and with SWARMFACTORY_SLOW=1.
pytestmark = pytest.mark.slow(covers=("swarmfactory/engine/", "swarmfactory/engine_cli.py", "swarmfactory/cli.py",
                                      "swarmfactory/bench/", "tests/engine/"))

NEW = 8
SERVED = "gemma-3-270m-q4_k_m"  # the file name's stem
WINDOW = 512
# Appended to the engine's fixed text (412 Gemma tokens) to pass the window: 614 tokens in all.
MORE = """
The next spring the river rose higher than anyone could remember. It carried away the wooden bridge
below the mill, flooded the lower fields and left a line of mud on the walls of the church, two hands
above the floor. The teacher took the children to the hill behind the school and asked them to draw
what they saw: the brown water, the roofs, the boats tied to fences, the birds that kept flying over
the same trees. Then she opened one of the old notebooks and read what had been written forty years
before, in a spring very much like this one. The water had come in April then too, after three weeks
of warm rain on the snow in the mountains, and it had gone down in nine days. The children counted
the days on the calendar by the door. On the ninth day the river was back between its banks, and the
farmers walked out to see what the flood had left in their fields.
"""

REFERENCE = r"""
import json, os, sys
import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(int(sys.argv[3]))
folder, name = os.path.split(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
ids = json.loads(sys.stdin.readline())
out = []
with torch.no_grad():  # plain argmax with the model's cache: greedy, never stopped by an end token
    step = model(torch.tensor([ids]), use_cache=True)
    for _ in range(int(sys.argv[2])):
        out.append(int(step.logits[0, -1].argmax()))
        step = model(torch.tensor([out[-1:]]), past_key_values=step.past_key_values, use_cache=True)
print(json.dumps(out), flush=True)
"""


def _prompt_text() -> str:
    return files("swarmfactory.engine").joinpath("data/ppl_text.txt").read_text() + MORE


@pytest.fixture(scope="module")
def reference(gemma_path):
    """(prompt ids, transformers' greedy tokens after them): the prompt tokenized by the engine's
    tokenizer (equal to transformers', test_tokenizers.py), the tokens from the HF subprocess,
    which has ended (and freed its ~3 GB) before the server starts."""
    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.tokenizer import Tokenizer

    ids = Tokenizer(load_gguf(gemma_path).metadata).encode(_prompt_text())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", REFERENCE, str(gemma_path), str(NEW), str(THREADS)],
                          input=json.dumps(ids) + "\n", capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return ids, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def server(gemma_path, reference):
    s = Server("--weights", "fp32", "--max-batch", "2", "--max-seq-len", "1024", model=gemma_path, wait=False)
    try:
        s.wait(timeout=300)
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def test_the_openai_client_lists_and_completes_with_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [SERVED]
    out = client.completions.create(model=SERVED, prompt="The capital of France is", max_tokens=NEW, temperature=0)
    assert out.model == SERVED and out.choices[0].text.strip()
    assert 1 <= out.usage.completion_tokens <= NEW and out.usage.prompt_tokens >= 5
    # a model the server does not serve is OpenAI's 404, naming the one it does
    with pytest.raises(openai.NotFoundError, match=SERVED):
        client.completions.create(model="another-model", prompt="The capital of France is", max_tokens=NEW)


def test_a_streamed_completion_gives_the_same_greedy_text(client):
    prompt = "The capital of France is"
    whole = client.completions.create(model=SERVED, prompt=prompt, max_tokens=NEW, temperature=0)
    chunks = list(client.completions.create(model=SERVED, prompt=prompt, max_tokens=NEW, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert all(c.model == SERVED for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_fp32_greedy_tokens_past_the_sliding_window_are_transformers(client, reference):
    extra = {"ignore_eos": True, "return_token_ids": True}
    out = client.completions.create(model=SERVED, prompt=_prompt_text(), max_tokens=NEW, temperature=0,
                                    extra_body=extra)
    choice = out.choices[0]
    prompt_ids, tokens = choice.prompt_token_ids, choice.token_ids
    assert len(prompt_ids) > WINDOW + 64 and len(tokens) == NEW
    # the same prompt given as token ids: the same tokens
    again = client.completions.create(model=SERVED, prompt=prompt_ids, max_tokens=NEW, temperature=0,
                                      extra_body=extra).choices[0]
    assert again.prompt_token_ids == prompt_ids and again.token_ids == tokens and again.text == choice.text
    ref_ids, ref_tokens = reference  # both sides saw the same prompt tokens
    assert prompt_ids == ref_ids
    assert tokens == ref_tokens, choice.text


def test_the_memory_estimate_adds_up_and_matches_the_server_process(server):
    est = server.health()["memory"]
    per_position = 2 * 1 * 256 * 4  # k and v, one kv head of 256, fp32
    assert est["kv_bytes_per_token"] == 18 * per_position
    assert est["kv_bytes_per_token_past_rings"] == 3 * per_position  # every 6th layer is global
    assert est["ring_layers"] == 15 and est["ring_positions"] == WINDOW - 1 + 256  # prefill_chunk 256
    assert est["kv_bytes_per_sequence"] == per_position * (3 * 1024 + 15 * 767)
    assert est["kv_bytes"] == est["kv_slots"] * est["kv_bytes_per_sequence"] and est["kv_slots"] == 2
    assert est["fits_sequences"] >= 2 and 1024 <= est["fits_context"] <= est["model_context"] == 32768
    # fp32 weights: the embedding, which its tied output head shares (one copy), and ~100M layer weights
    assert 0.9e9 < est["weights_bytes"] < 1.3e9
    # the process's own memory is what the estimate holds plus the interpreter, torch and the
    # vocabulary; the file's mapped pages come on top
    mem = server.memory()
    held = est["weights_bytes"] + est["kv_bytes"]
    assert held < mem["anon"] < held + 0.8e9, (mem, est)
    assert mem["peak"] < 3e9, mem
    assert "memory: weights" in server.output() and "sliding-window layers" in server.output()


def test_bench_asks_for_the_model_by_its_file(server, gemma_path, model_path):
    cmd = [sys.executable, "-m", "swarmfactory.engine_cli", "bench", "--url", server.url, "--concurrency", "1",
           "--input-len", "8", "--output-len", "4", "--num-prompts", "2", "--warmup", "0", "--json"]
    r = subprocess.run(cmd + ["--model", str(gemma_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["model"] == SERVED and res["levels"][0]["errors"] == 0 and res["levels"][0]["completed"] == 2
    wrong = subprocess.run(cmd + ["--model", str(model_path)], capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2 and f"serves {SERVED}, not {model_path.name}" in wrong.stderr, wrong.stderr


def test_the_default_weights_serve_gemma(gemma_path, server):
    """q4_1, the default: decode steps on the native block step (qstep.c: every layer on the
    stored blocks); on torch, Gemma's Q8_0 tensors on torch's int4 kernel and its other block
    types on ``qnative``; thresholds calibrated at the machine's first load of this file (36 s
    for the test, 13 s once the calibration is cached by the file's content). The fp32 server is
    stopped first: one Gemma server at a time."""
    from openai import OpenAI

    server.stop()

    s = Server("--max-batch", "2", "--max-seq-len", "1024", model=gemma_path, wait=False)
    try:
        s.wait(timeout=400)
        out = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300).completions.create(
            model=SERVED, prompt="The capital of France is", max_tokens=NEW, temperature=0)
        assert out.model == SERVED and out.choices[0].text.strip()
        health = s.health()
        assert health["paths"]["native"].startswith("blocks-") and health["paths"]["native_decode"] >= 1
        est, mem = health["memory"], s.memory()
        held = est["weights_bytes"] + est["kv_bytes"]
        assert held < mem["anon"] < held + 0.8e9, (mem, est)
    finally:
        s.stop()
