"""Continuous batching: joining, leaving, chunked prefill and aborts never change a sequence."""

from engine_support import PROMPTS, get_engine

from swarmfactory.engine import SamplingParams


def solo(engine, prompt, n):
    return engine.generate(prompt, max_tokens=n, ignore_eos=True)[0].token_ids


def test_requests_joining_mid_flight_get_their_solo_tokens(fp32_engine):
    eng = fp32_engine
    want = {p: solo(eng, p, 24) for p in PROMPTS}
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    seqs = [eng.add_request(PROMPTS[0], params)]
    for p in PROMPTS[1:]:  # each new request arrives after a few decode steps of the others
        for _ in range(5):
            eng.step()
        seqs.append(eng.add_request(p, params))
    while eng.has_unfinished():
        eng.step()
    for p, s in zip(PROMPTS, seqs):
        assert s.output_ids == want[p], p
    assert eng.kv.free_slots == eng.config.max_batch


def test_chunked_prefill_equals_one_shot_prefill(fp32_engine):
    eng_small = get_engine("fp32", prefill_chunk=16)
    prompt = " ".join(PROMPTS) * 3  # ~70 tokens: five chunks of 16
    assert len(eng_small.tokenizer.encode(prompt)) > 48
    assert solo(eng_small, prompt, 16) == solo(fp32_engine, prompt, 16)


def test_more_requests_than_slots_wait_their_turn():
    eng = get_engine("bf16", max_batch=2)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    seqs = [eng.add_request(f"Item {i}", params) for i in range(5)]
    peak = 0
    while eng.has_unfinished():
        eng.step()
        peak = max(peak, eng.num_running)
    assert peak == 2
    assert all(len(s.output_ids) == 4 and s.finish_reason == "length" for s in seqs)
    assert eng.kv.free_slots == 2


def test_abort_frees_the_slot_and_leaves_others_alone(fp32_engine):
    eng = fp32_engine
    want = solo(eng, PROMPTS[1], 12)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    a = eng.add_request(PROMPTS[0], params)
    b = eng.add_request(PROMPTS[1], params)
    eng.step()
    eng.step()
    eng.abort(a)
    assert a.finish_reason == "abort" and a.slot == -1
    while eng.has_unfinished():
        eng.step()
    assert b.output_ids == want
    assert eng.kv.free_slots == eng.config.max_batch


def test_eos_and_max_tokens_finish_sequences(fp32_engine):
    eng = fp32_engine
    chat = eng.tokenizer.apply_chat_template([{"role": "user", "content": "Reply with one word: yes or no?"}])
    out = eng.generate(chat, max_tokens=200)[0]
    assert out.finish_reason == "stop" and len(out.token_ids) < 200
    assert out.token_ids[-1] in eng.tokenizer.stop_token_ids
    out = eng.generate("One, two,", max_tokens=5)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5
