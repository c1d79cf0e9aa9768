"""The int8 KV cache (``kv_dtype: int8``): each token's k and v per kv head as int8 with its own
fp32 scale. Its logits stay within the q4_1 bounds (test_quantized_bounds.py); here: what it
stores and reads back, what it costs in memory, and that a sequence's tokens do not depend on
what else is in the batch (each token is quantised alone, so batching changes nothing)."""

from __future__ import annotations

import pytest
import torch

from engine_support import PROMPTS, get_engine

from swarmfactory.engine.config import EngineConfig
from swarmfactory.engine.kv_cache import KVCache, quantize_int8


def test_write_and_read_back_within_half_a_step_per_head_and_token():
    g = torch.Generator().manual_seed(0)
    cache = KVCache(2, 3, 2, 16, 8, torch.int8)
    kv = torch.randn(4, 2, 2, 8, generator=g) * torch.tensor([0.01, 1.0, 30.0, 0.0]).view(4, 1, 1, 1)
    slots, pos = torch.tensor([0, 2, 2, 1]), torch.tensor([0, 3, 4, 15])
    cache.write(1, slots, pos, kv)
    for i in range(4):
        for plane in (0, 1):
            got = cache.read(1, plane, int(slots[i]), int(pos[i]) + 1, torch.float32)[:, int(pos[i])]
            want = kv[i, plane]
            step = want.abs().amax(-1, keepdim=True) / 127
            assert ((got - want).abs() <= step / 2 + 1e-7).all()
    assert torch.equal(cache.read(1, 0, 1, 15, torch.float32), torch.zeros(2, 15, 8))  # untouched: zeros
    q, s = quantize_int8(torch.zeros(3, 8))
    assert torch.equal(q, torch.zeros(3, 8, dtype=torch.int8)) and torch.equal(s, torch.ones(3, 1))


def test_int8_cache_is_about_a_quarter_of_fp32():
    args = (30, 8, 3, 2048, 64)
    fp32, int8 = KVCache(*args, torch.float32).nbytes(), KVCache(*args, torch.int8).nbytes()
    assert int8 == fp32 // 4 + fp32 // 64  # + one fp32 scale per 64 values


def test_config_accepts_int8_and_keeps_the_native_decoder_off():
    cfg = EngineConfig(kv_dtype="int8")
    assert not cfg.native_applies()
    with pytest.raises(ValueError, match="native_decode needs weights q4_1 and kv_dtype fp32"):
        EngineConfig(kv_dtype="int8", native_decode=8)


def test_tokens_alone_equal_tokens_batched():
    eng = get_engine("q4_1", kv_dtype="int8", dense_above=(), attention="exact", max_batch=4)
    assert eng.kv.scales is not None and eng.native is None
    batched = [c.token_ids for c in eng.generate(PROMPTS, max_tokens=16, ignore_eos=True)]
    alone = [eng.generate([p], max_tokens=16, ignore_eos=True)[0].token_ids for p in PROMPTS]
    assert batched == alone
