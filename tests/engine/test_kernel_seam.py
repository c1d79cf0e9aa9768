"""Kernels plug in per op; a kernel with the kernel factory's q4_1_matmul ABI runs in the engine."""

import pytest
import torch

from engine_support import get_engine

from swarmfactory.engine.kernels import KernelError, available_kernels, register_q4_1_matmul

calls = {"n": 0}


def q4_1_matmul_reference(wq, x, y, n, k, batch):
    """A real (slow) implementation of the ABI: unpack the blocks, dequantise, multiply."""
    calls["n"] += 1
    b = wq.view(n, k // 32, 20)
    d = b[..., 0:2].contiguous().view(torch.float16).float()
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    qs = b[..., 4:]
    q = torch.cat([qs & 15, qs >> 4], dim=-1).float()
    w = (q * d + m).view(n, k)
    torch.matmul(x, w.T, out=y)


register_q4_1_matmul("test_q4_1_reference", q4_1_matmul_reference)


def test_registry_lists_builtin_and_registered_kernels():
    names = available_kernels()
    assert {"dense", "int4pack", "int4x2", "test_q4_1_reference"} <= set(names)


def test_unknown_or_mismatched_kernel_fails_clearly():
    with pytest.raises(KernelError, match="unknown kernel 'nope'"):
        _build({"down": "nope"})
    with pytest.raises(KernelError, match="cannot run token_embd.weight"):
        _build({"lm_head": "int4pack"})  # the output head is stored as Q8_0


def _build(kernels):
    from swarmfactory.engine import Engine, EngineConfig

    return Engine(EngineConfig(weights="q4_1", max_batch=1, max_seq_len=64, threads=1, kernels=kernels))


def test_factory_abi_kernel_runs_per_op_and_matches_int4():
    ref = get_engine("q4_1", dense_above=())
    plugged = _build({"down": "test_q4_1_reference", "o": "test_q4_1_reference"})
    before = calls["n"]
    prompt = "The quick brown fox"
    ids = plugged.tokenizer.encode(prompt)
    a, b = plugged.score(ids), ref.score(ids)
    assert calls["n"] - before == 2 * 30  # o and down in every layer
    # fp32 dequantised math vs bf16 int4 kernel: close, not identical
    assert (a - b).abs().max().item() < 2.0  # the q4_1 bound of test_quantized_bounds
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.75
