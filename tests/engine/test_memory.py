"""The memory estimate against the tensors an engine really holds (a tiny Gemma 3: five
sliding-window layers keeping a ring, one global layer)."""

from __future__ import annotations

import pytest
import torch

import tiny_models as tm
from engine_support import THREADS
from swarmfactory.engine import memory

CHUNK = 16
CONTEXT = 128
SLOTS = 3


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    return tm.write_gguf(tm.hf_model("gemma3"), "gemma3", tmp_path_factory.mktemp("gemma3") / "tiny-gemma3.gguf")


def _engine(path, **kw):
    from swarmfactory.engine import Engine, EngineConfig

    return Engine(EngineConfig(model=str(path), weights="fp32", threads=THREADS, max_batch=SLOTS,
                               max_seq_len=CONTEXT, prefill_chunk=CHUNK, **kw))


def _storages(tensors) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def test_the_estimate_counts_every_weight_once_and_the_cache_as_allocated(gemma_file, monkeypatch):
    eng = _engine(gemma_file)
    m = eng.model
    tensors = [m.embed, m.norm, m.embed_mul, m._zero, m.lm_head.kernel.w, *[t for pair in m.rope_tables for t in pair]]
    for L in m.layers:
        tensors += [L.attn_norm, L.qk_norm, L.post_attn_norm, L.ffn_norm, L.post_ffn_norm,
                    *(getattr(L, op).kernel.w for op in ("qkv", "o", "gate_up", "down"))]
    budget = 2048 * (5 * 23 + CONTEXT) // 2  # half a sequence more than the cache holds
    monkeypatch.setattr(memory, "available_bytes", lambda: (budget, "MemAvailable"))
    est = eng.memory_estimate()
    assert est["weights_bytes"] == _storages([t for t in tensors if t is not None])
    ring = tm.GEMMA_WINDOW - 1 + CHUNK
    per_position = 2 * 1 * 256 * 4  # k and v of one kv head of 256, fp32
    assert eng.kv.capacities == [ring] * 5 + [CONTEXT]
    assert est["kv_bytes"] == eng.kv.nbytes() == SLOTS * est["kv_bytes_per_sequence"]
    assert est["kv_bytes_per_sequence"] == per_position * (5 * ring + CONTEXT)
    assert est["kv_bytes_per_token"] == 6 * per_position and est["kv_bytes_per_token_past_rings"] == per_position
    assert (est["ring_layers"], est["ring_positions"]) == (5, ring)
    # the allocated cache counts as available to a larger one
    assert est["fits_sequences"] == (budget + est["kv_bytes"]) // est["kv_bytes_per_sequence"] == SLOTS
    longest = est["fits_context"]
    assert CONTEXT < longest < est["model_context"]

    def cost(n: int) -> int:
        return SLOTS * per_position * (5 * min(n, ring) + n)

    assert cost(longest) <= budget + est["kv_bytes"] < cost(longest + 1)
    lines = memory.describe(est)
    assert len(lines) == 2 and "5 sliding-window layers" in lines[0] and f"3 sequences of 128 tokens, or 3 of {longest} tokens" in lines[1]


def test_an_int8_cache_counts_its_scales(gemma_file):
    est = _engine(gemma_file, kv_dtype="int8").memory_estimate()
    assert est["kv_bytes_per_token"] == 6 * (2 * 256 + 2 * 4)  # int8 values and one fp32 scale each for k and v


def test_available_memory_is_read_from_the_system():
    avail, source = memory.available_bytes()
    assert source in ("MemAvailable", "cgroup limit") and avail > 0


def test_numpy_arrays_count_only_where_they_own_their_data():
    owned = torch.zeros(10).numpy().copy()  # 40 bytes of its own
    view = owned[2:]
    assert memory.held_bytes([owned, view]) == 40 and memory.held_bytes([view]) == 40
