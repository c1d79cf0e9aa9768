"""Grammar-constrained decoding (engine/structured.py) against the engine's real tokenizers: SmolLM2 (GPT-2
byte-level BPE) and Gemma 3 (SentencePiece with byte fallback; skipped when its package is absent).

No engine and no model weights: the GGUF metadata gives the tokenizer, random logits stand in for the model,
and a walk that takes the best allowed token must produce text the grammar describes."""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch

pytest.importorskip("xgrammar")

from swarmfactory.engine import gguf_file
from swarmfactory.engine.structured import GrammarError, Grammars, apply_masks
from swarmfactory.engine.tokenizer import Tokenizer

try:
    import jsonschema
except ImportError:  # pragma: no cover - the test extra has it
    jsonschema = None

NEG = float("-inf")
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["color", "ok", "n"],
}
SCHEMA_SPEC = {"type": "json_schema", "schema": SCHEMA, "strict": True}
EMAIL = r"[a-z]{1,8}@[a-z]{2,5}\.(com|org)"
CHOICES = ["yes", "no", "maybe so", 'a "quoted" \\ word', "naïve ☃", "two\nlines\tand a tab"]
MAX_STEPS = 300


class Model:
    def __init__(self, name: str, path):
        meta = gguf_file.read(path).metadata  # metadata only: the tensors stay unread in the mapping
        self.name = name
        self.meta = meta
        self.tok = Tokenizer(meta)
        self.V = self.tok.vocab_size
        self.grammars = Grammars(self.tok, self.V, metadata=meta)
        self._text = None

    def ids_containing(self, chars: bytes) -> torch.Tensor:
        """Ids of the tokens whose text contains any of ``chars`` (as the grammar sees the token)."""
        if self._text is None:
            self._text = self.grammars.info.decoded_vocab
        return torch.tensor([i for i, t in enumerate(self._text) if any(c in t for c in chars)], dtype=torch.long)


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def model(request):
    path = request.getfixturevalue("model_path" if request.param == "smollm2" else "gemma_path")
    return Model(request.param, path)


@pytest.fixture(scope="module")
def smol(model_path):
    return Model("smollm2", model_path)


def walk(m: Model, spec, seed: int, bias=None) -> tuple[str, list[int]]:
    """Random logits each step, grammar masks, then: a stop token where the grammar allows one, else the
    argmax (after ``bias(step, logits)``). Fails unless the grammar terminates within MAX_STEPS."""
    g = m.grammars
    st = g.state(spec)
    gen = torch.Generator().manual_seed(seed)
    stops = torch.tensor(g.stop_token_ids)
    ids: list[int] = []
    for step in range(MAX_STEPS):
        logits = torch.randn(1, m.V, generator=gen)
        apply_masks(logits, [st])
        row = logits[0]
        assert torch.isfinite(row).any(), f"step {step}: the grammar allows nothing"
        allowed_stops = stops[torch.isfinite(row[stops])]
        if len(allowed_stops):
            tok = int(allowed_stops[0])
        else:
            if bias is not None:
                bias(step, row)
            tok = int(row.argmax())
        assert st.accept(tok), f"step {step}: the grammar refused token {tok} its own mask allowed"
        ids.append(tok)
        if st.is_terminated():
            assert tok in g.stop_token_ids
            return m.tok.decode(ids), ids
    pytest.fail(f"{m.name}: {spec['type']} not terminated after {MAX_STEPS} steps: {m.tok.decode(ids)!r}")


def check_schema(value) -> None:
    if jsonschema is not None:
        jsonschema.validate(value, {**SCHEMA, "additionalProperties": False})
    else:  # pragma: no cover
        assert set(value) == {"color", "ok", "n"}
        assert value["color"] in ("red", "green", "blue") and isinstance(value["ok"], bool)
        assert isinstance(value["n"], int) and 0 <= value["n"] <= 9


# ---- 1. random walks produce valid JSON ----
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_walk_json_schema(model, seed):
    text, _ = walk(model, SCHEMA_SPEC, seed)
    value = json.loads(text)
    check_schema(value)
    assert text == json.dumps(value), "the compact one-line layout (json.dumps' separators)"


def test_walk_json_object(model):
    """Any JSON object: wander for a while (keeping clear of '}'), then head for the exit (quotes and
    closing brackets first); whatever came out in between, json.loads must parse it."""
    closers, quotes = model.ids_containing(b"}]"), model.ids_containing(b'"')

    def bias(step, row):
        if step < 40:
            row[closers] -= 50.0
        else:
            row[quotes] += 20.0
            row[closers] += 40.0

    text, ids = walk(model, {"type": "json_object"}, seed=3, bias=bias)
    value = json.loads(text)
    assert isinstance(value, dict) and value, text
    assert len(ids) > 40


# ---- 2. stop tokens only where the grammar is complete ----
def test_eos_masked_until_complete(model):
    m, g = model, model.grammars
    st = g.state(SCHEMA_SPEC)
    eos = m.tok.eos_token_id
    text = '{"color": "green", "ok": true, "n": 7}'
    ids = m.tok.encode(text, add_bos=False)
    assert m.tok.decode(ids) == text
    # a token the grammar forbids is refused and changes nothing
    bad = m.tok.encode("x", add_bos=False)[0]
    assert not st.accept(bad)
    for k, t in enumerate(ids):
        logits = torch.zeros(1, m.V)
        apply_masks(logits, [st])
        assert logits[0, eos] == NEG, f"EOS allowed after {m.tok.decode(ids[:k])!r}"
        assert all(logits[0, s] == NEG for s in g.stop_token_ids)
        assert logits[0, t] == 0.0, f"token {t} of the valid text masked after {m.tok.decode(ids[:k])!r}"
        assert st.accept(t)
        assert not st.is_terminated()
    logits = torch.zeros(1, m.V)
    apply_masks(logits, [st])
    allowed = set(torch.nonzero(torch.isfinite(logits[0])).flatten().tolist())
    assert allowed == set(g.stop_token_ids), "complete compact JSON: only the stop tokens remain"
    assert st.accept(eos) and st.is_terminated()
    # terminated: still only stop tokens (the caller ends the sequence), and nothing more is accepted
    logits = torch.randn(1, m.V)
    apply_masks(logits, [st])
    assert set(torch.nonzero(torch.isfinite(logits[0])).flatten().tolist()) == set(g.stop_token_ids)
    assert not st.accept(ids[0])


def test_stop_token_override(smol):
    g, tok = smol.grammars, smol.tok
    other = next(s for s in g.stop_token_ids if s != tok.eos_token_id)
    st = g.state({"type": "choice", "choices": ["yes"]}, stop_token_ids=[tok.eos_token_id])
    for t in tok.encode("yes", add_bos=False):
        assert st.accept(t)
    logits = torch.zeros(1, smol.V)
    apply_masks(logits, [st])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [tok.eos_token_id]
    assert not st.accept(other)
    assert st.accept(tok.eos_token_id) and st.is_terminated()


# ---- 3. regex and choice ----
@pytest.mark.parametrize("seed", [0, 1])
def test_walk_regex(model, seed):
    text, _ = walk(model, {"type": "regex", "pattern": EMAIL}, seed)
    assert re.fullmatch(EMAIL, text), text


def test_walk_choice(model):
    seen = set()
    for seed in range(6):
        text, _ = walk(model, {"type": "choice", "choices": CHOICES}, seed)
        assert text in CHOICES, text
        seen.add(text)
    # every choice is reachable, the escaped ones included
    for c in CHOICES:
        st = model.grammars.state({"type": "choice", "choices": CHOICES})
        assert all(st.accept(t) for t in model.tok.encode(c, add_bos=False)), c
        assert st.accept(model.tok.eos_token_id) and st.is_terminated()


# ---- 4. invalid specs ----
@pytest.mark.parametrize("spec, words", [
    ({"type": "json_schema", "schema": {"type": "nonsense"}}, "nonsense"),
    ({"type": "json_schema", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}, "minimum"),
    ({"type": "json_schema", "schema": "not an object"}, "schema"),
    ({"type": "json_schema", "schema": {"type": "object"}, "strict": "yes"}, "strict"),
    ({"type": "regex", "pattern": "("}, "parenthesis"),
    ({"type": "regex", "pattern": 5}, "pattern"),
    ({"type": "choice", "choices": []}, "non-empty"),
    ({"type": "choice", "choices": ["a", 1]}, "strings"),
    ({"type": "choice", "choices": ["a\ud800"]}, "surrogate"),
    ({"type": "xml"}, "unknown grammar type"),
    (["json_object"], "object"),
])
def test_invalid_spec(smol, spec, words):
    g = smol.grammars
    before = g.cache_info()["size"]
    with pytest.raises(GrammarError) as e:
        g.compile(spec)
    msg = str(e.value)
    assert msg and "\n" not in msg and len(msg) <= 250 and words in msg, msg
    assert "/project/cpp" not in msg and "Check failed" not in msg, msg
    with pytest.raises(GrammarError):
        g.state(spec)
    assert g.cache_info()["size"] == before  # failures are not cached
    assert isinstance(e.value, ValueError)


# ---- 5. the compile cache ----
def test_cache(smol):
    g = smol.grammars
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a", "b"]}
    info0 = g.cache_info()
    c1 = g.compile({"type": "json_schema", "schema": schema})
    c2 = g.compile({"type": "json_schema", "schema": json.loads(json.dumps(schema)), "strict": True})
    reordered = {"required": ["a", "b"], "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                 "type": "object"}
    c3 = g.compile({"strict": True, "schema": reordered, "type": "json_schema"})
    info = g.cache_info()
    assert c1 is c2 is c3
    assert info["misses"] == info0["misses"] + 1 and info["hits"] == info0["hits"] + 2
    assert info["size"] == info0["size"] + 1 and info["bytes"] > 0
    # the order of the properties is the order of the output: a different grammar
    swapped = {**schema, "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    c4 = g.compile({"type": "json_schema", "schema": swapped})
    assert c4 is not c1 and g.cache_info()["misses"] == info0["misses"] + 2
    st = g.state(c4)
    assert all(st.accept(t) for t in smol.tok.encode('{"b": "x", "a": 1}', add_bos=False))
    st1 = g.state(c1)
    assert not all(st1.accept(t) for t in smol.tok.encode('{"b": "x", "a": 1}', add_bos=False))
    # strict and non-strict are different grammars
    assert g.compile({"type": "json_schema", "schema": schema, "strict": False}) is not c1


def test_cache_lru_threads_and_vocab_without_metadata(smol):
    """A second Grammars, built from the tokenizer alone: the same vocabulary as with the metadata; its LRU
    keeps ``cache_size`` grammars; concurrent compiles of one spec compile it once."""
    g = Grammars(smol.tok, smol.V, cache_size=2)
    assert g.vocab_type == smol.grammars.vocab_type
    assert g.info.special_token_ids == smol.grammars.info.special_token_ids
    assert g.stop_token_ids == smol.grammars.stop_token_ids
    specs = [{"type": "regex", "pattern": p} for p in ("a+", "b+", "c+")]
    first = [g.compile(s) for s in specs]
    assert g.cache_info()["size"] == 2
    assert g.compile(specs[2]) is first[2] and g.compile(specs[0]) is not first[0]  # "a+" was evicted
    out = []
    spec = {"type": "json_schema", "schema": SCHEMA}
    misses = g.cache_info()["misses"]

    def run():
        out.append(g.compile(spec))  # an exception would leave ``out`` short

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 4 and all(c is out[0] for c in out)
    assert g.cache_info()["misses"] == misses + 1


# ---- 6. batched application ----
def test_batch_rows_and_padding(model):
    m, g = model, model.grammars
    extra = 40
    logits = torch.randn(4, m.V + extra, generator=torch.Generator().manual_seed(5))
    logits[0, 7] = float("nan")
    logits[2, 11] = -0.0
    logits[2, m.V + 3] = float("inf")
    before = logits.clone()
    s1, s2 = g.state(SCHEMA_SPEC), g.state({"type": "regex", "pattern": EMAIL})
    apply_masks(logits, [None, s1, None, s2])
    for r in (0, 2):  # bit for bit, NaN and -0.0 included
        assert torch.equal(logits[r].view(torch.int32), before[r].view(torch.int32))
    for r in (1, 3):
        assert torch.all(logits[r, m.V:] == NEG), "columns beyond the vocabulary are never allowed"
        finite = torch.isfinite(logits[r])
        assert 0 < int(finite.sum()) < m.V
        assert torch.equal(logits[r][finite], before[r][finite])  # allowed tokens keep their logits
    assert torch.isfinite(logits[1, m.tok.encode("{", add_bos=False)[0]])
    # the same masks for a batch of its own, and no rows at all is a no-op
    alone = before[1:2, : m.V].clone()
    apply_masks(alone, [s1])
    assert torch.equal(alone[0], logits[1, : m.V])
    apply_masks(before, [None] * 4)
    with pytest.raises(ValueError):
        apply_masks(torch.zeros(2, m.V - 1), [s1, None])  # fewer columns than the vocabulary
    with pytest.raises(ValueError):
        apply_masks(torch.zeros(3, m.V), [s1, None])  # a state per row


def test_padded_model_vocab(smol):
    """A model whose logits have more columns than the tokenizer has tokens (padding): told so, the grammar
    never allows the padding ids."""
    pad = 64
    g = Grammars(smol.tok, smol.V + pad, metadata=smol.meta)
    st = g.state({"type": "json_object"})
    logits = torch.zeros(2, smol.V + pad)
    apply_masks(logits, [st, st])
    assert torch.all(logits[:, smol.V:] == NEG)
    assert torch.isfinite(logits[0, : smol.V]).any()


def test_kernels_agree(smol):
    """numpy (default), xgrammar's own kernel and the torch path for bf16 logits mask the same tokens, on a
    batch whose rows are in different places of their grammars (mostly forbidden / mostly allowed)."""
    g, tok = smol.grammars, smol.tok
    states = []
    for prefix in ("", '{"color": "red", "ok', '{"a": "some text'):
        st = g.state(SCHEMA_SPEC if "color" in prefix or not prefix else {"type": "json_object"})
        for t in tok.encode(prefix, add_bos=False):
            assert st.accept(t)
        states.append(st)
    states.insert(1, None)
    logits = torch.randn(4, smol.V, generator=torch.Generator().manual_seed(9))
    a, b, c = logits.clone(), logits.clone(), logits.to(torch.bfloat16)
    apply_masks(a, states)
    apply_masks(b, states, kernel="xgrammar")
    apply_masks(c, states)
    assert torch.equal(a, b)
    assert torch.equal(torch.isinf(a), torch.isinf(c))
    assert torch.equal(a[1], logits[1]) and torch.equal(c[1], logits[1].to(torch.bfloat16))
    assert int(torch.isfinite(a[3]).sum()) > smol.V // 2 > int(torch.isfinite(a[0]).sum())
