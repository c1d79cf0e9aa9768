"""Every architecture the engine serves, against transformers on the same GGUF.

Tiny random models (``tiny_models.py``) are written as llama.cpp writes them and read back by
both the engine and transformers (``from_pretrained(gguf_file=...)``, our fp32 reference), so
each test also checks our writer against transformers' reader. Gemma's prompts are longer than
its sliding window and than the ring its sliding layers keep (window - 1 + prefill_chunk).
"""

from __future__ import annotations

import logging

import pytest
import torch
from gguf import GGMLQuantizationType as QT

import tiny_models as tm
from engine_support import THREADS

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
CHUNK = 16  # prefill_chunk: gemma's sliding layers keep window - 1 + 16 = 23 positions
LONG = 40  # tokens: beyond gemma's window (8) and its ring (23)
PROMPT_LENS = (7, 19, 33)
NEW = 8
# bf16 weights and activations against the fp32 reference, max |logit error| (logits have a
# standard deviation of about 0.8): measured 0.03-0.12 over these models (0.12: gemma3, whose
# transformers bf16 model is itself 0.11 off its fp32 one).
BF16_BOUND = 0.25
# The quantised engine against the fp32 one on the same (dequantised) weights, per type: measured
# max 0.10-0.21, mean 0.014-0.038, NLL change under 0.007 nats (AVX2 path; bf16 activations on
# fp32 sgemm): bounds with room for other ISA paths' summation orders.
QUANT_MAX_BOUND = 0.3
QUANT_MEAN_BOUND = 0.06
QUANT_NLL_BOUND = 0.02  # change of the mean negative log-likelihood over the prompt (nats)

_files: dict = {}
_engines: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _release():
    yield
    _files.clear()
    _engines.clear()


def _prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(3, tm.VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _file(tmp_path_factory, arch: str, qtype: QT = QT.F32, rope: str | None = None, **overrides):
    """(path, transformers model read from it, the HF model it was written from)."""
    key = (arch, qtype, rope, tuple(sorted(overrides.items())))
    if key not in _files:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(THREADS)
        model = tm.hf_model(arch, rope, **overrides)
        path = tm.write_gguf(model, arch, tmp_path_factory.mktemp(arch) / f"tiny-{arch}-{qtype.name}.gguf", qtype)
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
        _files[key] = (path, hf, model)
    return _files[key]


def _engine(path, weights: str = "fp32", **kw):
    from swarmfactory.engine import Engine, EngineConfig

    key = (str(path), weights, repr(sorted(kw.items())))
    if key not in _engines:
        opts = {"threads": THREADS, "max_batch": 4, "max_seq_len": 128, "prefill_chunk": CHUNK, **kw}
        _engines[key] = Engine(EngineConfig(model=str(path), weights=weights, **opts))
    return _engines[key]


def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def _hf_greedy(model, ids: list[int], n: int = NEW) -> list[int]:
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16], ids=["F32", "F16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_logits_match_transformers(tmp_path_factory, arch, qtype):
    path, hf, _ = _file(tmp_path_factory, arch, qtype)
    ids = _prompt(LONG)
    err = (_engine(path).score(ids) - _hf_logits(hf, ids)).abs().max().item()
    assert err < 1e-3, f"{arch} {qtype.name}: max |logit error| {err:.2e}"


# exact attention (each sequence over its own context) masks differently only where there are
# sliding windows: gemma's
@pytest.mark.parametrize(("arch", "attention"), [(a, "padded") for a in ARCHS] + [("gemma3", "exact")])
def test_greedy_tokens_match_transformers_alone_and_batched(tmp_path_factory, arch, attention):
    path, hf, _ = _file(tmp_path_factory, arch)
    eng = _engine(path, attention=attention)
    prompts = [_prompt(n, seed=n) for n in PROMPT_LENS]
    expect = [_hf_greedy(hf, p) for p in prompts]
    alone = [eng.generate([p], max_tokens=NEW, ignore_eos=True)[0].token_ids for p in prompts]
    batched = [c.token_ids for c in eng.generate(prompts, max_tokens=NEW, ignore_eos=True)]
    assert alone == expect
    assert batched == expect


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_stays_within_its_bound(tmp_path_factory, arch):
    path, hf, _ = _file(tmp_path_factory, arch)
    ids = _prompt(LONG)
    got = _engine(path, "bf16").score(ids)
    assert torch.isfinite(got).all()
    err = (got - _hf_logits(hf, ids)).abs().max().item()
    assert err < BF16_BOUND, f"{arch}: bf16 max |logit error| {err:.3f}"


def test_sliding_window_layers_keep_a_ring_of_the_window(tmp_path_factory):
    path, _, _ = _file(tmp_path_factory, "gemma3")
    eng = _engine(path)
    ring = tm.GEMMA_WINDOW - 1 + CHUNK
    # every 6th layer is global: layer 5 of 6
    assert eng.kv.capacities == [ring] * 5 + [eng.max_seq_len]
    assert [L.window for L in eng.model.layers] == [tm.GEMMA_WINDOW] * 5 + [None]


@pytest.mark.parametrize("rope", sorted(tm.ROPE_SCALING))
def test_llama_rope_scaling_matches_hf(tmp_path_factory, rope):
    # transformers reads neither rope_freqs nor rope.scaling back from a GGUF: the reference is
    # the HF model the file was written from
    path, _, model = _file(tmp_path_factory, "llama", rope=rope)
    ids = _prompt(100)
    err = (_engine(path).score(ids) - _hf_logits(model, ids)).abs().max().item()
    assert err < 1e-3, f"{rope}: max |logit error| {err:.2e}"


def _quantised_types() -> list:
    try:
        from swarmfactory.engine import quants
    except ImportError:
        return []
    return sorted((q for q in quants.SUPPORTED if q not in (QT.F32, QT.F16)), key=lambda q: q.value)


@pytest.mark.parametrize("qtype", _quantised_types(), ids=lambda q: q.name)
def test_quantised_files_match_transformers(tmp_path_factory, qtype):
    # rows of 256 or more: the K-quants' super-blocks fit every matrix
    path, hf, _ = _file(tmp_path_factory, "qwen3", qtype, hidden_size=256, intermediate_size=512,
                        num_hidden_layers=1)
    eng = _engine(path)
    ids = _prompt(24)
    err = (eng.score(ids) - _hf_logits(hf, ids)).abs().max().item()
    assert err < 1e-3, f"{qtype.name}: max |logit error| {err:.2e}"
    assert eng.generate([ids], max_tokens=NEW, ignore_eos=True)[0].token_ids == _hf_greedy(hf, ids)


@pytest.mark.parametrize("qtype", _quantised_types(), ids=lambda q: q.name)
def test_each_type_in_its_blocks_stays_within_its_bound_of_the_dequantised_model(tmp_path_factory, qtype):
    """The quantised engine (weights kept in their blocks: qnative, or torch's int4 kernels for
    Q4_1/Q8_0; bf16 activations) against the fp32 engine on the same dequantised weights: the
    max and mean logit error and the change of the mean negative log-likelihood of the prompt.
    Bounds (docs/engine.md): those of bf16 activations, which dominate the kernels' own 8-bit
    activation rounding (qlinear.c)."""
    path, _, _ = _file(tmp_path_factory, "qwen3", qtype, hidden_size=256, intermediate_size=512,
                       num_hidden_layers=1)
    ids = _prompt(LONG)
    ref, got = _engine(path).score(ids), _engine(path, "q4_1", dense_above={}).score(ids)
    err = (got - ref).abs()
    nll = [torch.nn.functional.cross_entropy(x[:-1], torch.tensor(ids[1:])).item() for x in (ref, got)]
    print(f"{qtype.name}: max {err.max():.3f} mean {err.mean():.4f} nll {nll[0]:.4f} -> {nll[1]:.4f}")
    assert err.max() < QUANT_MAX_BOUND and err.mean() < QUANT_MEAN_BOUND, f"{qtype.name}: {err.max():.3f} {err.mean():.4f}"
    assert abs(nll[1] - nll[0]) < QUANT_NLL_BOUND


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "llama"])
def test_decode_c_declines_other_architectures_and_the_block_step_computes_them(tmp_path_factory, arch, caplog):
    """decode.c is the plain llama step: for another architecture it says why, and the native
    block step (qstep.c) runs the model's steps instead."""
    from swarmfactory.engine.native.qstep import BlockDecoder

    path, _, _ = _file(tmp_path_factory, arch, QT.Q8_0)
    with caplog.at_level(logging.INFO, logger="swarmfactory.engine"):
        eng = _engine(path, "q4_1", dense_above={}, max_batch=2, native_decode=2, native_prefill=CHUNK)
    assert isinstance(eng.native, BlockDecoder) and eng.paths.native.startswith("blocks-"), eng.paths.fallbacks
    assert not [f for f in eng.paths.fallbacks if f.startswith("native decoder")]
    assert any(arch in r.getMessage() and "block step" in r.getMessage() for r in caplog.records)
    assert len(eng.generate([_prompt(5)], max_tokens=2, ignore_eos=True)[0].token_ids) == 2


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_without_block_weights_neither_native_step_runs_and_the_line_says_why(tmp_path_factory, arch, caplog):
    path, hf, _ = _file(tmp_path_factory, arch, QT.F16)
    with caplog.at_level(logging.WARNING, logger="swarmfactory.engine"):
        eng = _engine(path, "q4_1", dense_above={}, max_batch=2)
    lines = [f for f in eng.paths.fallbacks if f.startswith("native decoder")]
    assert eng.native is None and len(lines) == 1 and "block step" in lines[0] and "F16" in lines[0], lines
    ids = _prompt(12)
    assert (eng.score(ids) - _hf_logits(hf, ids)).abs().max() < BF16_BOUND  # on torch, right


@pytest.mark.parametrize(("qtype", "overrides", "why"), [
    (QT.Q4_K, dict(hidden_size=256, intermediate_size=512, num_hidden_layers=1, head_dim=64), "Q4_1 or Q8_0"),
    (QT.Q4_1, dict(hidden_size=256, intermediate_size=512, num_hidden_layers=1), "head size"),
], ids=["Q4_K", "head_dim"])
def test_a_llama_decode_c_cannot_compute_runs_on_the_block_step(tmp_path_factory, qtype, overrides, why, caplog):
    """decode.c is the plain llama step on Q4_1/Q8_0 blocks: a Llama 3 in Q4_K_M, or a head size
    that is not hidden / heads (Mistral-style), leaves it off with its reason, never wrong; the
    block step computes the model."""
    path, hf, _ = _file(tmp_path_factory, "llama", qtype, **overrides)
    with caplog.at_level(logging.INFO, logger="swarmfactory.engine"):
        eng = _engine(path, "q4_1", dense_above={}, max_batch=2, native_decode=2, native_prefill=CHUNK)
    assert eng.paths.native.startswith("blocks-")
    assert any(why in r.getMessage() and "block step" in r.getMessage() for r in caplog.records)
    ids = _prompt(12)
    assert (eng.score(ids) - _hf_logits(hf, ids)).abs().max() < QUANT_MAX_BOUND  # computed right
    assert len(eng.generate([ids], max_tokens=4, ignore_eos=True)[0].token_ids) == 4


# -- the native block step (native/qstep.c) -------------------------------------------------------
# Its matrix products quantise activations to 8 bits (qlinear.c), where the torch path rounds
# them to bf16: against the fp32 engine on the same dequantised weights (2 layers, hidden 256),
# measured max 0.09-0.46, mean 0.017-0.065 (the torch q4_1 path: 0.11-0.54, 0.013-0.070).
BLOCK_MAX_BOUND = 0.6
BLOCK_MEAN_BOUND = 0.09


def _block_decoder(tmp_path_factory, arch, qtype, lib=None, slots=3, max_seq_len=128):
    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.native.qstep import BlockDecoder

    path, _, _ = _file(tmp_path_factory, arch, qtype, hidden_size=256, intermediate_size=512, num_hidden_layers=2)
    ref = _engine(path)
    kv = ref.model.new_cache(slots, max_seq_len)
    return ref, BlockDecoder(load_gguf(path), ref.model, kv, 4, THREADS, lib, max_prompt=CHUNK)


def _chunks(dec, ids, slot):
    """The prompt's logits, prefilled in chunks of CHUNK."""
    outs = []
    for s in range(0, len(ids), CHUNK):
        t = torch.tensor(ids[s:s + CHUNK])
        outs.append(dec(t, torch.full((len(t),), slot), torch.arange(s, s + len(t))))
    return torch.cat(outs)


@pytest.mark.parametrize(("arch", "qtype"), [(a, q) for a in ARCHS for q in (QT.Q4_K, QT.Q8_0)] +
                         [("qwen3", QT.Q6_K), ("gemma3", QT.Q5_0), ("llama", QT.Q4_1), ("qwen2", QT.Q5_K)],
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_the_block_step_stays_within_its_bound_and_is_batch_invariant(tmp_path_factory, arch, qtype):
    """Against the fp32 engine on the same dequantised weights; prompt chunks, one token at a
    time, and two sequences in one step give the same numbers (gemma's prompt is longer than
    its ring: the ring is written and read as the torch path does)."""
    ref, dec = _block_decoder(tmp_path_factory, arch, qtype)
    ids = _prompt(LONG)
    want = ref.score(ids)
    got = _chunks(dec, ids, slot=0)
    err = (got - want).abs()
    print(f"{arch} {qtype.name}: max {err.max():.3f} mean {err.mean():.4f}")
    assert err.max() < BLOCK_MAX_BOUND and err.mean() < BLOCK_MEAN_BOUND
    one = torch.cat([dec(torch.tensor([t]), torch.tensor([1]), torch.tensor([i])) for i, t in enumerate(ids)])
    assert torch.equal(one, got)
    other = _prompt(LONG, seed=2)  # slot 2 and slot 0 decode together, rows in either order
    _chunks(dec, other[:-1], slot=2)
    both = dec(torch.tensor([other[-1], ids[-1]]), torch.tensor([2, 0]), torch.tensor([LONG - 1, LONG - 1]))
    alone = _chunks(dec, other, slot=1)[-1]
    assert torch.equal(both[0], alone) and torch.equal(both[1], got[-1])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("S,D", [(37, 64), (1, 64), (13, 12), (21, 132), (9, 256), (5, 6)])
def test_decode_attention_reads_a_kv_head_once_for_its_query_heads_with_the_same_numbers(threads, S, D):
    """qstep.c's attention (sf_op_attention runs the step's q_attend): a batch large enough
    attends each kv head's query heads together (its K and V rows read once), a small one per
    query head; a row's output is the same either way, and right against fp64. Head sizes on
    both sides of 128 (8 keys at a time, one at a time), with elements past the last multiple
    of 8, and position counts that leave part of a block of 8 keys or 4 positions."""
    from swarmfactory.engine.native import element_ops

    gen = torch.Generator().manual_seed(3)
    B, H, KV = 6, 8, 2
    q, k, v = (torch.randn(*shape, generator=gen) for shape in ((B, H, D), (B, KV, S, D), (B, KV, S, D)))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        def run(rows):
            t = {"q": q[rows], "k": k[rows], "v": v[rows], "batch": len(rows), "heads": H, "kv_heads": KV,
                 "seq": S, "head_dim": D, "scale": D ** -0.5}
            return element_ops.attention(t)().clone()

        together = run(list(range(B)))  # B * KV >= 2 * threads: the query heads of a kv head together
        alone = torch.cat([run([b]) for b in range(B)]) if threads == 2 else None  # 1 * KV < 2 * 2: per head
    finally:
        torch.set_num_threads(before)
    if alone is not None:
        assert torch.equal(together, alone)
    kk, vv = (x.double().repeat_interleave(H // KV, dim=1) for x in (k, v))
    ref = torch.softmax(q.double().unsqueeze(2) @ kk.transpose(-1, -2) * D ** -0.5, -1) @ vv
    assert (together.double() - ref.squeeze(2)).abs().max() < 1e-4
    odd = {"q": q[:, :7], "k": k, "v": v, "batch": B, "heads": 7, "kv_heads": KV, "seq": S, "head_dim": D,
           "scale": 1.0}  # a problem file's shape the step never computes: refused, no read past k
    with pytest.raises(RuntimeError, match="multiple"):
        element_ops.attention(odd)


@pytest.mark.parametrize("B,H,KV,S,D", [(40, 4, 1, 1100, 68), (8, 4, 1, 1100, 256)])
def test_attention_over_caches_from_memory_gives_the_numbers_of_caches_in_cache(B, H, KV, S, D):
    """A step whose decode rows read more K/V than stays cached (over 16 MB a layer) streams each
    row's cache one key and one position at a time; fewer rows go 8 keys and 4 positions at a
    time. The same row gets the same numbers either way (bit for bit: a row's result must not
    depend on the batch it is in), with a head size past a multiple of 8 and one of 256."""
    from swarmfactory.engine.native import element_ops

    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(*shape, generator=gen) for shape in ((B, H, D), (B, KV, S, D), (B, KV, S, D)))
    assert B * KV * S * D * 8 > 16 << 20 > 2 * KV * S * D * 8  # streamed together, in cache two at a time

    def run(rows):
        t = {"q": q[rows], "k": k[rows], "v": v[rows], "batch": len(rows), "heads": H, "kv_heads": KV,
             "seq": S, "head_dim": D, "scale": D ** -0.5}
        return element_ops.attention(t)().clone()

    together = run(list(range(B)))
    apart = torch.cat([run([b, b + 1]) for b in range(0, B, 2)])
    assert torch.equal(together, apart)
    kk, vv = (x.double().repeat_interleave(H // KV, dim=1) for x in (k, v))
    ref = torch.softmax(q.double().unsqueeze(2) @ kk.transpose(-1, -2) * D ** -0.5, -1) @ vv
    assert (together.double() - ref.squeeze(2)).abs().max() < 1e-4


def test_the_block_step_gives_the_same_numbers_on_every_isa_path(tmp_path_factory):
    """Each path this CPU runs (portable C included), built and probed as at load: each within
    the bound of the fp32 model, and close to the others. Not equal: a sum rounded differently
    can move an activation across an 8-bit rounding boundary, which the next layer carries
    (measured 0.03 between portable C and AVX2)."""
    from swarmfactory.engine.native import qlinear
    from swarmfactory.engine.native.qstep import BlockLibrary

    ids = _prompt(LONG)
    results = {}
    for p in qlinear.runnable_paths():
        lib, path, _ = qlinear.load_checked([p])
        ref, dec = _block_decoder(tmp_path_factory, "gemma3", QT.Q4_K, BlockLibrary(qlinear.Loaded(lib, path.name)))
        results[p.name] = got = _chunks(dec, ids, slot=0)
        err = (got - ref.score(ids)).abs()
        assert err.max() < BLOCK_MAX_BOUND and err.mean() < BLOCK_MEAN_BOUND, p.name
    first = next(iter(results.values()))
    assert "portable" in results
    for name, got in results.items():
        assert (got - first).abs().max() < 0.15, name


def test_the_block_step_refuses_rows_it_cannot_compute(tmp_path_factory):
    """More rows of one sequence than a sliding-window ring holds at once (they would overwrite
    keys another row still reads), a slot or position out of range: a clear error, nothing run."""
    _, dec = _block_decoder(tmp_path_factory, "gemma3", QT.Q8_0, max_seq_len=64)
    n = CHUNK + 2  # the ring keeps window - 1 + CHUNK positions
    with pytest.raises(ValueError, match="block step rejected"):
        dec(torch.tensor(_prompt(n)), torch.zeros(n, dtype=torch.long), torch.arange(n))
    for slot, pos in ((3, 0), (0, 64), (-1, 0)):
        with pytest.raises(ValueError, match="block step rejected"):
            dec(torch.tensor([5]), torch.tensor([slot]), torch.tensor([pos]))


def test_the_block_step_refuses_a_file_whose_vectors_do_not_fit_its_sizes(tmp_path_factory):
    """A norm shorter than the hidden size (a damaged or hostile file): refused in one line
    naming the tensor, before the C step could read past it."""
    import dataclasses

    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.native.library import NativeUnavailable
    from swarmfactory.engine.native.qstep import BlockDecoder

    path, _, _ = _file(tmp_path_factory, "gemma3", QT.Q8_0, hidden_size=256, intermediate_size=512,
                       num_hidden_layers=2)
    ref = _engine(path)
    gg = load_gguf(path)
    for name, size in (("blk.1.ffn_norm.weight", 10), ("blk.0.attn_k_norm.weight", 8)):
        t = gg.tensors[name]
        assert t.qtype == QT.F32
        short = dataclasses.replace(t, rows=1, cols=size, raw=t.raw.reshape(-1)[:size].reshape(1, -1))
        damaged = dataclasses.replace(gg, tensors={**gg.tensors, name: short})
        with pytest.raises(NativeUnavailable) as e:
            BlockDecoder(damaged, ref.model, ref.model.new_cache(2, 64), 2, THREADS)
        assert name in str(e.value) and f"holds {size} values" in str(e.value) and "\n" not in str(e.value)


def test_unknown_architecture_fails_in_one_line(tmp_path):
    from swarmfactory.engine import Engine, EngineConfig
    from swarmfactory.engine.gguf_loader import load_gguf

    path = tm.write_unknown_arch(tmp_path / "mamba.gguf")
    for load in (lambda: load_gguf(path), lambda: Engine(EngineConfig(model=str(path), weights="fp32"))):
        with pytest.raises(ValueError) as e:
            load()
        msg = str(e.value)
        assert "\n" not in msg and "'mamba'" in msg and "llama, qwen2, qwen3, gemma3" in msg
