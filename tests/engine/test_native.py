"""The native decoder (engine/native): numerics of every ISA path, bounds, batch invariance."""

import logging
import math

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from engine_support import THREADS, get_engine
from swarmfactory.engine import Engine, EngineConfig
from swarmfactory.engine import native as native_mod
from swarmfactory.engine.config import ConfigError
from swarmfactory.engine.native import (PATHS, PROBE_TOLERANCE, NativeUnavailable, linear_error, load_checked,
                                        load_library, runnable_paths)
from swarmfactory.hardware import cpu_features

from test_quantized_bounds import BOUNDS, ppl

# Paths are tested on what the host can execute, whatever SWARMFACTORY_CPU_MASK says: the mask
# decides what the engine picks, not what this machine can check.
HOST = cpu_features(mask=None)


def _path_param(path):
    missing = path.missing(HOST)
    marks = [pytest.mark.skip(reason=f"{path.name} needs {', '.join(missing)}, which this CPU lacks")] if missing else []
    return pytest.param(path, id=path.name, marks=marks)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_every_isa_path_builds_here_even_where_it_cannot_run(path):
    """Compiling needs no CPU support: each path's code compiles with its flags on every host
    (loading it and asking sf_isa runs no path-specific instruction)."""
    lib = load_library(path)
    assert lib.sf_isa().decode() == path.name


@pytest.mark.parametrize("path", [_path_param(p) for p in PATHS])
def test_every_isa_path_computes_the_quantised_product(path):
    lib = load_library(path)
    assert lib.sf_isa().decode() == path.name  # the flags built the path they name
    for qtype in (QT.Q4_1, QT.Q8_0):
        for B in (1, 3, 17):  # 17: more sequences than one pass holds
            # 10 rows: a padded group; 96 columns: 3 blocks, the first all zero in sequence 0
            err = linear_error(lib, qtype, rows=10, cols=96, batch=B, seed=B + int(qtype), threads=2)
            assert err < PROBE_TOLERANCE, (qtype.name, B, err)


def test_a_path_that_fails_its_check_falls_back_and_says_so(monkeypatch, caplog):
    paths = runnable_paths(HOST)
    if len(paths) < 2:
        pytest.skip("this CPU runs only one native path")
    first = paths[0]
    real = native_mod.probe
    monkeypatch.setattr(native_mod.library, "probe",
                        lambda lib: "simulated wrong result" if lib.sf_isa().decode() == first.name else real(lib))
    with caplog.at_level(logging.WARNING, logger="swarmfactory.engine"):
        lib, chosen, fallbacks = load_checked(paths)
    assert chosen == paths[1] and lib.sf_isa().decode() == paths[1].name
    assert f"{first.name} path failed its check (simulated wrong result)" in caplog.text
    assert len(fallbacks) == 1


@pytest.fixture
def q4_engine():
    return get_engine("q4_1")


def test_default_q4_1_engine_decodes_natively_on_the_best_path_allowed(q4_engine):
    assert q4_engine.native is not None
    assert q4_engine.paths.native == q4_engine.native.isa == runnable_paths()[0].name  # honours the mask
    assert 1 <= q4_engine.native.max_batch <= q4_engine.config.max_batch


def test_prompt_rows_in_a_native_step_match_decoding_them_one_by_one(q4_engine):
    """A prompt chunk run natively (rows of one slot at consecutive positions, mixed with
    another sequence's decode row) gives each token exactly the logits it gets when decoded."""
    nat = q4_engine.native
    ids = q4_engine.tokenizer.encode("The capital of France is Paris, and the capital of Spain is")[:10]
    other = q4_engine.tokenizer.encode("def fibonacci(n):")[:3]
    one_by_one = _teacher_forced(nat, q4_engine.kv, {0: ids}, {0: 0})[0]
    _teacher_forced(nat, q4_engine.kv, {2: other[:2]}, {2: 0})  # slot 2 holds a running sequence
    n = len(ids)
    tokens = torch.tensor([other[2]] + ids)
    slots = torch.tensor([2] + [1] * n)
    positions = torch.tensor([2] + list(range(n)))
    big = native_mod.NativeDecoder(_gguf(q4_engine), q4_engine.kv, 1, THREADS, nat.lib, max_prompt=n)
    mixed = big(tokens, slots, positions, torch.arange(n + 1))
    assert torch.equal(mixed[1:], one_by_one)
    last = big(tokens, slots, positions, torch.tensor([n]))  # only the prompt's last row
    assert torch.equal(last[0], one_by_one[-1])


def _gguf(engine):
    from swarmfactory.engine.gguf_loader import load_gguf

    return load_gguf(engine.model_path)


def _teacher_forced(native, kv, seqs: dict[int, list[int]], starts: dict[int, int]):
    """Feed each slot's tokens one decode step at a time, slot k joining at step starts[k];
    returns slot -> logits [len, vocab]."""
    out = {k: [] for k in seqs}
    steps = max(starts[k] + len(v) for k, v in seqs.items())
    for t in range(steps):
        live = [k for k in seqs if starts[k] <= t < starts[k] + len(seqs[k])]
        logits = native(torch.tensor([seqs[k][t - starts[k]] for k in live]), torch.tensor(live),
                        torch.tensor([t - starts[k] for k in live]))
        for k, row in zip(live, logits):
            out[k].append(row)
    return {k: torch.stack(v) for k, v in out.items()}


def test_batching_never_changes_a_sequences_logits(q4_engine):
    tok = q4_engine.tokenizer
    seqs = {0: tok.encode("The capital of France is Paris, and the capital of Spain is")[:12],
            1: tok.encode("def fibonacci(n): return n if n < 2 else")[:12],
            2: tok.encode("Write a haiku about the sea and the sky.")[:12]}
    alone = {k: _teacher_forced(q4_engine.native, q4_engine.kv, {k: v}, {k: 0})[k] for k, v in seqs.items()}
    together = _teacher_forced(q4_engine.native, q4_engine.kv, seqs, {0: 0, 1: 3, 2: 5})
    for k in seqs:
        assert torch.equal(alone[k], together[k]), f"slot {k} changed when batched"


def test_native_decode_is_within_the_q4_1_bound(fp32_logits, q4_engine, ppl_ids):
    ref = fp32_logits
    logits = _teacher_forced(q4_engine.native, q4_engine.kv, {0: ppl_ids}, {0: 0})[0]
    err = (logits - ref).abs()
    max_err, mean_err, rel_ppl = BOUNDS["q4_1"]
    p_ref, p = ppl(ref, ppl_ids), ppl(logits, ppl_ids)
    assert err.max().item() <= max_err, f"max logit error {err.max().item():.3f}"
    assert err.mean().item() <= mean_err, f"mean logit error {err.mean().item():.3f}"
    assert abs(p / p_ref - 1) <= rel_ppl, f"perplexity {p:.3f} vs fp32 {p_ref:.3f}"
    assert (logits.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9
    assert math.isfinite(p)


def test_thread_count_never_changes_the_logits(q4_engine):
    from swarmfactory.engine.gguf_loader import load_gguf
    from swarmfactory.engine.native import NativeDecoder

    ids = q4_engine.tokenizer.encode("List three colours: red, green and")[:10]
    other = NativeDecoder(load_gguf(q4_engine.model_path), q4_engine.kv, 2, threads=2)
    a = _teacher_forced(q4_engine.native, q4_engine.kv, {0: ids}, {0: 0})[0]
    b = _teacher_forced(other, q4_engine.kv, {1: ids}, {1: 0})[1]
    assert torch.equal(a, b)


def test_engine_serves_through_the_native_path(q4_engine):
    out = q4_engine.generate(["The capital of France is", "List three colours: red,"], max_tokens=12,
                             ignore_eos=True)
    assert [len(c.token_ids) for c in out] == [12, 12]
    assert "Paris" in out[0].text


def test_config_rules():
    with pytest.raises(ConfigError, match="native_decode needs weights q4_1"):
        EngineConfig.from_dict({"weights": "bf16", "native_decode": 4})
    with pytest.raises(ConfigError, match="cannot be combined with kernels"):
        EngineConfig.from_dict({"native_decode": 4, "kernels": {"o": "int4pack"}})
    with pytest.raises(ConfigError, match="native_prefill needs the native decoder"):
        EngineConfig.from_dict({"native_decode": 0, "native_prefill": 16})
    assert not EngineConfig(kernels={"o": "int4pack"}).native_applies()
    assert not EngineConfig(weights="fp32").native_applies()
    assert EngineConfig(max_batch=4).native_applies()


def test_explicit_thresholds_are_used_as_given():
    eng = get_engine("q4_1", native_decode=3, native_prefill=16, dense_above=(("o", 5),))
    assert (eng.native.max_batch, eng.native.max_prompt) == (3, 16)
    assert eng.paths.thresholds == "config" and eng.paths.dense_above == {"o": 5}
    assert eng.model.layers[0].o.dense_above == 5 and eng.model.layers[0].qkv.dense is None


def test_without_a_compiler_the_default_falls_back_and_an_explicit_request_fails(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("SWARMFACTORY_CACHE", str(tmp_path / "cache"))
    opts = {"max_batch": 2, "max_seq_len": 64, "threads": THREADS, "dense_above": {}}
    with caplog.at_level(logging.WARNING, logger="swarmfactory.engine"):
        eng = Engine(EngineConfig(**opts))
    assert "native decoder unavailable" in caplog.text and "using torch for every step" in caplog.text
    assert eng.native is None and eng.paths.native is None
    assert eng.generate("The capital of France is", max_tokens=4)[0].token_ids
    with pytest.raises(NativeUnavailable, match="not found"):
        Engine(EngineConfig(native_decode=2, **opts))


def test_short_prompts_prefilled_together_beyond_the_native_limit_stay_native_and_keep_their_tokens(monkeypatch):
    """Four short prompts admitted in one step hold more prompt tokens than the native step takes
    (more than 16): each chunk still runs natively (packed into calls up to the limit), none on torch,
    so each prompt gets the tokens it gets alone. Before, the whole step's prompts went to torch
    (bf16 activations where the native step quantises to 8 bits): a near tie could flip, as it did
    for Gemma 3 270M under load ("under load vs alone" diverged at token 18)."""
    from swarmfactory.engine.sequence import SamplingParams

    eng = get_engine("q4_1", native_decode=4, native_prefill=16, prefill_chunk=64, dense_above=())
    texts = ["The capital of France is", "Water boils at a temperature of", "The largest planet in our solar system is",
             "Write a short poem about the sea"]
    prompts = [eng.tokenizer.encode(t) for t in texts]
    assert all(len(p) <= 16 for p in prompts) and sum(len(p) for p in prompts) > 16
    alone = [eng.generate([p], max_tokens=12, ignore_eos=True)[0].token_ids for p in prompts]
    torch_steps = []
    forward = eng.model.forward
    monkeypatch.setattr(eng.model, "forward", lambda s, kv: torch_steps.append(s) or forward(s, kv))
    seqs = [eng.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts]
    while eng.has_unfinished():
        eng.step()
    assert torch_steps == []
    assert [s.output_ids for s in seqs] == alone


def test_more_sequences_than_one_native_call_takes_decode_natively_and_keep_their_tokens(monkeypatch):
    """Six sequences decoding where one native call takes two (a calibration that measured torch
    faster above two rows, with max_batch above it): every decode row still runs natively, in calls
    of at most two, none on torch, so each prompt gets the tokens it gets alone. Before, a step of
    more sequences than the native limit went to torch whole (bf16 activations where the native
    step quantises to 8 bits): Gemma 3 270M's default design on a Zen 4 (native_decode
    calibrated below max_batch 64) failed "under load vs alone" at token 15."""
    from swarmfactory.engine.sequence import SamplingParams

    eng = get_engine("q4_1", native_decode=2, native_prefill=16, prefill_chunk=16, max_batch=8, dense_above=())
    assert eng.native.max_batch == 2 and eng.scheduler.max_batch >= 6
    texts = ["The capital of France is", "Water boils at a temperature of", "The largest planet in our solar system is",
             "Write a short poem about the sea", "One, two, three,", "The opposite of hot is"]
    prompts = [eng.tokenizer.encode(t) for t in texts]
    alone = [eng.generate([p], max_tokens=10, ignore_eos=True)[0].token_ids for p in prompts]
    torch_steps = []
    forward = eng.model.forward
    monkeypatch.setattr(eng.model, "forward", lambda s, kv: torch_steps.append(s) or forward(s, kv))
    seqs = [eng.add_request(p, SamplingParams(max_tokens=10, ignore_eos=True)) for p in prompts]
    wide = 0
    while eng.has_unfinished():
        wide = max(wide, len([s for s in seqs if not s.prefilling and not s.finished]))
        eng.step()
    assert wide > 2  # more sequences decoded together than one native call takes
    assert torch_steps == []
    assert [s.output_ids for s in seqs] == alone


def test_with_a_measured_native_prefill_the_native_step_takes_every_prompt_chunk(monkeypatch):
    """Where native_prefill is measured (the default) and the native step won at all, it takes
    every prompt chunk the scheduler makes (prefill_chunk): no prompt row depends on what shares
    its step, and prompts are not cut into the measured size's small chunks (16 tokens on a Zen 4:
    Gemma 3 270M at 64 streams took 34.1 s to a p99 first token against 13.5 s in chunks of 256).
    An explicit native_prefill stays as given."""
    from swarmfactory.engine import calibrate

    measured = calibrate.Calibration(dense_above={}, native_decode=8, native_prefill=16, seconds=0.0, key={})
    monkeypatch.setattr(calibrate, "load_cached", lambda key, path: measured)
    eng = Engine(EngineConfig(weights="q4_1", max_batch=8, max_seq_len=256, threads=THREADS, prefill_chunk=64))
    assert (eng.native.max_prompt, eng.scheduler.prefill_chunk) == (64, 64)
    assert "<= 8 sequences + 64 prompt tokens a call" in eng.paths.summary()
    explicit = get_engine("q4_1", native_decode=4, native_prefill=16, prefill_chunk=64, dense_above=())
    assert (explicit.native.max_prompt, explicit.scheduler.prefill_chunk) == (16, 64)


def test_a_measured_native_decode_below_max_batch_still_takes_every_decode_row(monkeypatch):
    """Calibration measured torch faster above 4 decode rows, but the native decoder, where it is
    on, takes every decode row (in one call up to max_batch): larger batches on torch would give a
    sequence other numbers when more sequences decode beside it. An explicit native_decode stays
    as given (larger batches then go in several native calls)."""
    from swarmfactory.engine import calibrate

    measured = calibrate.Calibration(dense_above={}, native_decode=4, native_prefill=16, seconds=0.0, key={})
    monkeypatch.setattr(calibrate, "load_cached", lambda key, path: measured)
    eng = Engine(EngineConfig(weights="q4_1", max_batch=12, max_seq_len=256, threads=THREADS))
    assert (eng.native.max_batch, eng.paths.native_decode) == (12, 12)
    assert "<= 12 sequences + 256 prompt tokens a call" in eng.paths.summary()
    off = calibrate.Calibration(dense_above={}, native_decode=0, native_prefill=0, seconds=0.0, key={})
    monkeypatch.setattr(calibrate, "load_cached", lambda key, path: off)
    assert Engine(EngineConfig(weights="q4_1", max_batch=12, max_seq_len=256, threads=THREADS)).native is None
    assert get_engine("q4_1", native_decode=2, native_prefill=16, prefill_chunk=16, dense_above=()).native.max_batch == 2


def test_a_long_prompt_leaves_the_running_sequences_on_the_native_step(monkeypatch):
    """A step whose prompt chunk is longer than the native step takes runs in two calls: the
    decode rows natively, the chunk on torch. So a running sequence stays on the native path
    (and keeps its tokens) while a long prompt is prefilled beside it."""
    from swarmfactory.engine.sequence import SamplingParams

    eng = get_engine("q4_1", native_decode=4, native_prefill=16, prefill_chunk=64, dense_above=())
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    short = eng.tokenizer.encode("The capital of France is")
    alone = eng.generate([short], max_tokens=24, ignore_eos=True)[0].token_ids
    long_prompt = (eng.tokenizer.encode("List three colours: red, green and blue. ") * 20)[:200]

    torch_steps = []
    forward = eng.model.forward
    monkeypatch.setattr(eng.model, "forward", lambda s, kv: torch_steps.append(s.n_decode) or forward(s, kv))
    a = eng.add_request(short, params)
    while a.prefilling or not a.output_ids:  # a is decoding before the long prompt arrives
        eng.step()
    b = eng.add_request(long_prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    assert b.finished and len(b.output_ids) == 2
    assert len(torch_steps) >= 3 and set(torch_steps) == {0}  # the 200-token prompt's chunks, alone
    assert a.output_ids == alone
