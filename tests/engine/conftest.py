"""Shared fixtures for engine tests: the real SmolLM2 GGUF, engines per format, a live server."""

from __future__ import annotations

import os

import pytest

from engine_support import THREADS, Server, get_engine

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
def fp32_engine(model_path):
    return get_engine("fp32")


@pytest.fixture(scope="session")
def hf_model(model_path):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(THREADS)
    m = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                             dtype=torch.float32)
    m.eval()
    return m


@pytest.fixture(scope="session")
def ppl_ids(fp32_engine):
    from importlib.resources import files

    text = files("swarmfactory.engine").joinpath("data/ppl_text.txt").read_text()
    return fp32_engine.tokenizer.encode(text)


@pytest.fixture(scope="session")
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
