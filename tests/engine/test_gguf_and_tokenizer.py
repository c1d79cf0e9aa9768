import numpy as np
import pytest
import torch

from swarmfactory.engine.gguf_loader import _unpermute_rows, load_gguf
from swarmfactory.engine.tokenizer import IncrementalDecoder, Tokenizer


@pytest.fixture(scope="module")
def gg(model_path):
    return load_gguf(model_path)


def test_hparams_of_smollm2(gg):
    hp = gg.hparams
    assert (hp.n_layers, hp.dim, hp.n_heads, hp.n_kv_heads, hp.ffn_dim) == (30, 576, 9, 3, 1536)
    assert hp.vocab_size == 49152 and hp.tied_embeddings and hp.head_dim == 64


def test_unpermute_inverts_llama_cpp_permute():
    n_head, hd, cols = 3, 8, 5
    hf = np.random.default_rng(0).standard_normal((n_head * hd, cols))
    # llama.cpp convert_hf_to_gguf.py permute()
    stored = hf.reshape(n_head, 2, hd // 2, cols).swapaxes(1, 2).reshape(hf.shape)
    assert np.array_equal(stored[_unpermute_rows(n_head * hd, n_head)], hf)


def test_q_k_weights_match_hf_layout(gg, hf_model):
    attn = hf_model.model.layers[3].self_attn
    assert torch.equal(gg.tensor("blk.3.attn_q.weight").dequantize(), attn.q_proj.weight)
    assert torch.equal(gg.tensor("blk.3.attn_k.weight").dequantize(), attn.k_proj.weight)
    assert torch.equal(gg.tensor("token_embd.weight").dequantize(), hf_model.model.embed_tokens.weight)


def test_q4_1_blocks_dequantize_to_d_q_plus_m(gg):
    t = gg.tensor("blk.0.ffn_down.weight")
    q, d, m = t.q4_1()
    assert q.dtype == torch.uint8 and int(q.max()) <= 15
    w = t.dequantize()
    expect = q.float().view(t.rows, -1, 32) * d[..., None] + m[..., None]
    assert torch.equal(w, expect.view(t.rows, t.cols))


def test_take_returns_the_same_rows_as_dequantize(gg):
    import torch

    rows = [5, 0, 63, 64, 575]
    for name in ("blk.0.attn_q.weight", "token_embd.weight"):  # permuted and plain rows
        t = gg.tensor(name)
        assert torch.equal(t.take(rows).dequantize(), t.dequantize()[rows])


@pytest.fixture(scope="module")
def tok(gg):
    return Tokenizer(gg.metadata)


def test_tokenizer_round_trips_text(tok):
    for text in ["Hello, world!", "Numbers 2024 and 3.14", "émojis 🎉 and 中文", "  two  spaces\n\tand tabs"]:
        assert tok.decode(tok.encode(text)) == text


def test_special_tokens_are_single_ids(tok):
    assert tok.encode("<|im_start|>user") [0] == 1
    assert 2 in tok.stop_token_ids  # <|im_end|>


def test_chat_template_from_gguf(tok):
    s = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert s.startswith("<|im_start|>system\n") and s.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_incremental_decoder_never_splits_characters(tok):
    text = "naïve café 🎉🎉 中文字"
    d = IncrementalDecoder(tok)
    pieces = [d.push(i) for i in tok.encode(text)] + [d.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
