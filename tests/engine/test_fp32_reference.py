"""fp32 is exact: greedy tokens equal HF transformers' fp32 model loaded from the same GGUF."""

import torch

from engine_support import PROMPTS

N_NEW = 64


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """Plain greedy decoding with HF's own KV cache (no generate() config in the way)."""
    out, cache = [], None
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            r = model(input_ids=x, cache=cache, use_cache=True)
            cache = r.cache
            t = int(r.logits[0, -1].argmax())
            out.append(t)
            x = torch.tensor([[t]])
    return out


def prompt_ids(engine):
    tok = engine.tokenizer
    chat = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS[:2]]
    raw = [tok.encode(p) for p in PROMPTS[2:]]
    return chat + raw


def test_fp32_greedy_equals_hf_single_and_batched(fp32_engine, hf_model):
    ids = prompt_ids(fp32_engine)
    ref = [hf_greedy(hf_model, x, N_NEW) for x in ids]
    single = [fp32_engine.generate(x, max_tokens=N_NEW, ignore_eos=True)[0].token_ids for x in ids]
    batched = [c.token_ids for c in fp32_engine.generate(ids, max_tokens=N_NEW, ignore_eos=True)]
    for i in range(len(ids)):
        assert single[i] == ref[i], f"prompt {i}: single-sequence tokens differ from HF"
        assert batched[i] == ref[i], f"prompt {i}: batching changed the tokens"


def test_fp32_logits_close_to_hf(fp32_engine, ppl_ids, hf_ppl_logits):
    ours = fp32_engine.score(ppl_ids)
    assert (ours - hf_ppl_logits).abs().max().item() < 1e-3
