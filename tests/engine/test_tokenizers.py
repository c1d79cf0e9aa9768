"""Tokenizers and chat templates built from GGUF metadata, checked against transformers (loaded from the same GGUF
files), against llama.cpp's SentencePiece algorithm restated in plain Python, and on tiny vocabularies written here."""

from __future__ import annotations

import heapq
import logging
import time

import jinja2
import pytest

from swarmfactory.engine.gguf_loader import load_gguf
from swarmfactory.engine.tokenizer import IncrementalDecoder, Tokenizer

CORPUS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "  two  spaces",
    "multiple     spaces   here",
    "    indented line",
    "tabs\tand\t\ttabs",
    "line1\nline2\r\nline3\n\n\nend",
    "\n",
    "12345 678.90 3.14159 1e10 -42",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "日本語のテキストと한국어 中文",
    "naïve café résumé Ærøskøbing",
    "😀 👨‍👩‍👧‍👦 🎉🚀 🫨🧌",
    "I'm sure you'll see HE'S right",
    "!!!???... --- ***",
    "<b>bold</b> and <s>struck</s>",
    "a\u00a0b\u2003c",
    "ſ ﬁ ⅷ ①",
]
GEMMA_SPECIAL = ["<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<bos>text<eos> <unk><pad>"]
SMOLLM_SPECIAL = ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "a<|endoftext|>b"]
# A run of more than 31 spaces: Gemma's whitespace tokens stop at 31. llama.cpp matches these user-defined tokens
# whole, longest first (31 + 9); transformers respells them "▁▁..." and merges them as BPE (16 + 24).
LONG_SPACES = "x" + " " * 40 + "y"


# --- llama.cpp's SentencePiece tokenizer (llama-vocab.cpp, with parse_special), restated as a reference ---

class _LlamaCppSpm:
    def __init__(self, metadata: dict):
        self.tokens = list(metadata["tokenizer.ggml.tokens"])
        self.scores = list(metadata["tokenizer.ggml.scores"])
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        types = metadata["tokenizer.ggml.token_type"]
        # control, unknown and user-defined tokens are cut out first, longest first
        specials = (i for i, ty in enumerate(types) if ty in (2, 3, 4))
        self.specials = sorted(specials, key=lambda i: -len(self.tokens[i].encode()))
        self.prefix = metadata.get("tokenizer.ggml.add_space_prefix", True)
        self.unk = metadata.get("tokenizer.ggml.unknown_token_id")

    def encode(self, text: str) -> list[int]:
        parts: list = [text] if text else []
        for sid in self.specials:
            s = self.tokens[sid]
            if not any(isinstance(p, str) and s in p for p in parts):
                continue
            cut = []
            for p in parts:
                if not isinstance(p, str):
                    cut.append(p)
                    continue
                for k, piece in enumerate(p.split(s)):
                    cut += ([sid] if k else []) + ([piece] if piece else [])
            parts = cut
        out: list[int] = []
        for p in parts:  # every stretch of text follows a special token or starts the text: gets the prefix
            out += self._merge(((" " if self.prefix else "") + p).replace(" ", "▁")) if isinstance(p, str) else [p]
        return out

    def _merge(self, text: str) -> list[int]:
        sym = list(text)
        nxt, prv = list(range(1, len(sym) + 1)), list(range(-1, len(sym) - 1))
        nxt[-1] = -1
        queue: list = []

        def pair(left, right):  # best score first, then leftmost
            if left >= 0 and right >= 0 and (u := sym[left] + sym[right]) in self.ids:
                heapq.heappush(queue, (-self.scores[self.ids[u]], left, right, len(u)))

        for i in range(1, len(sym)):
            pair(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue  # stale: one side was merged since
            sym[left], sym[right] = sym[left] + sym[right], ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            pair(prv[left], left)
            pair(left, nxt[left])
        out, i = [], 0
        while i != -1:
            if sym[i] in self.ids:
                out.append(self.ids[sym[i]])
            else:
                out += [self.ids.get(f"<0x{b:02X}>", self.unk) for b in sym[i].encode()]
            i = nxt[i]
        return out


def _spm_metadata(pieces: dict[str, float], byte_tokens: bool = True, **extra) -> dict:
    """A tiny SentencePiece vocabulary: <unk>, <s>, </s>, a control token <|turn|>, byte tokens, then ``pieces``."""
    tokens, types = ["<unk>", "<s>", "</s>", "<|turn|>"], [2, 3, 3, 3]
    if byte_tokens:
        tokens += [f"<0x{b:02X}>" for b in range(256)]
        types += [6] * 256
    scores = [0.0] * len(tokens) + list(pieces.values())
    return {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens + list(pieces), "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types + [1] * len(pieces), "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": False, **extra,
    }


# "bc" scores better than "ab": SentencePiece joins the best pair first, not the leftmost
PIECES = {"▁": -1.0, "a": -2.0, "b": -3.0, "c": -4.0, "bc": -5.0, "ab": -6.0, "▁ab": -7.0, "▁a": -8.0}


def _ids(meta: dict, *pieces: str) -> list[int]:
    return [meta["tokenizer.ggml.tokens"].index(p) for p in pieces]


# --- real models: fixtures load each reference once per module ---

@pytest.fixture(scope="module")
def smol_meta(model_path):
    return load_gguf(model_path).metadata


@pytest.fixture(scope="module")
def smol(smol_meta):
    return Tokenizer(smol_meta)


@pytest.fixture(scope="module")
def hf_smol(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)


@pytest.fixture(scope="module")
def gemma_meta(gemma_path):
    # transformers' reader takes a second; gguf.GGUFReader takes ~20 s on a 262k-token vocabulary.
    from transformers.integrations.gguf.reader import read_gguf_metadata

    return read_gguf_metadata(str(gemma_path), ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))[0]


@pytest.fixture(scope="module")
def gemma_build(gemma_meta):
    start = time.perf_counter()
    tok = Tokenizer(gemma_meta)
    return tok, time.perf_counter() - start


@pytest.fixture(scope="module")
def gemma(gemma_build):
    return gemma_build[0]


@pytest.fixture(scope="module")
def hf_gemma(gemma_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gemma_path.parent), gguf_file=gemma_path.name)


# --- Gemma 3 (SentencePiece, 262,144 tokens) ---

def test_gemma_builds_in_seconds(gemma_build):
    tok, seconds = gemma_build
    assert tok.vocab_size == 262144
    assert seconds < 15, f"building Gemma's tokenizer took {seconds:.1f} s"


def test_gemma_ids_match_transformers(gemma, hf_gemma):
    for text in CORPUS + GEMMA_SPECIAL:
        assert gemma.encode(text, add_bos=False) == hf_gemma.encode(text, add_special_tokens=False), text
    for text in CORPUS:
        assert gemma.encode(text) == hf_gemma.encode(text), text  # BOS as the file asks


def test_gemma_ids_match_llama_cpp(gemma, gemma_meta, hf_gemma):
    ref = _LlamaCppSpm(gemma_meta)
    for text in CORPUS + GEMMA_SPECIAL + [LONG_SPACES]:
        assert gemma.encode(text, add_bos=False) == ref.encode(text), text
    assert gemma.encode(LONG_SPACES, add_bos=False) == _ids(gemma_meta, "x", " " * 31, " " * 9, "y")
    assert hf_gemma.encode(LONG_SPACES, add_special_tokens=False) != ref.encode(LONG_SPACES)


def test_gemma_decodes_like_transformers(gemma, hf_gemma):
    for text in CORPUS + GEMMA_SPECIAL:
        ids = gemma.encode(text)
        assert gemma.decode(ids) == hf_gemma.decode(ids, skip_special_tokens=True), text
        assert gemma.decode(ids, skip_special=False) == hf_gemma.decode(ids), text
    for text in CORPUS:
        assert gemma.decode(gemma.encode(text)) == text


def test_gemma_special_tokens_flags_and_stops(gemma):
    assert (gemma.bos_token_id, gemma.eos_token_id, gemma.add_bos, gemma.add_eos) == (2, 1, True, False)
    assert gemma.encode("Hi")[0] == 2 and gemma.encode("Hi")[-1] != 1
    assert gemma.encode("<bos>Hi").count(2) == 1  # a prompt that writes BOS itself gets no second one
    assert gemma.encode("<start_of_turn>user", add_bos=False)[0] == 105
    assert {1, 106} <= gemma.stop_token_ids  # <eos>, <end_of_turn>
    assert 212 not in gemma.stop_token_ids  # Gemma's "</s>" is an HTML tag, not an end of sequence
    assert gemma.decode(gemma.encode("<start_of_turn>user\nHi<end_of_turn>")) == "user\nHi"
    assert not gemma.has_chat_template  # the base model's file has none
    with pytest.raises(ValueError, match="no chat template"):
        gemma.apply_chat_template([{"role": "user", "content": "Hi"}])


def test_incremental_decoder_joins_byte_fallback_characters(gemma):
    text = "naïve 🫨🧌 ꙮ 中文 𝔘 end"  # 🫨, 🧌, ꙮ and 𝔘 are not in the vocabulary: 3-4 byte tokens each
    ids = gemma.encode(text, add_bos=False)
    assert sum(gemma.token_str(i).startswith("<0x") for i in ids) >= 14
    d = IncrementalDecoder(gemma)
    pieces = [d.push(i) for i in ids] + [d.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


# --- SmolLM2 (byte-level BPE) and the pre-tokenizers ---

def test_smollm_ids_match_transformers(smol, hf_smol):
    for text in CORPUS + SMOLLM_SPECIAL + [LONG_SPACES]:
        if text == "ſ ﬁ ⅷ ①":  # see test_smollm_splits_every_numeric_character
            continue
        assert smol.encode(text) == hf_smol.encode(text, add_special_tokens=False), text
        ids = smol.encode(text)
        assert smol.decode(ids) == hf_smol.decode(ids, skip_special_tokens=True), text


def test_smollm_splits_every_numeric_character(smol, hf_smol):
    """SmolLM2's own tokenizer.json and llama.cpp ("smollm") isolate every \\p{N} character; transformers' GGUF
    conversion knows no "smollm" and keeps " ⅷ" whole. We follow the model's tokenizer."""
    from tokenizers import pre_tokenizers

    text = "ſ ﬁ ⅷ ①"
    assert smol.encode(text) != hf_smol.encode(text, add_special_tokens=False)
    own = hf_smol.backend_tokenizer
    saved = own.pre_tokenizer
    own.pre_tokenizer = pre_tokenizers.Sequence(  # SmolLM2's tokenizer.json
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    try:
        for t in CORPUS + [text]:
            assert smol.encode(t) == own.encode(t, add_special_tokens=False).ids, t
    finally:
        own.pre_tokenizer = saved


@pytest.mark.parametrize("pre", ["default", "gpt2", "llama-bpe", "qwen2"])
def test_pre_tokenizers_match_transformers(smol_meta, pre):
    """SmolLM2's vocabulary split as Llama 3 / Qwen2 / GPT-2 split text, against transformers' GGUF conversion for
    that ``pre``, given the settings of those models' own tokenizer.json: Llama 3 keeps a word that is a token whole
    (ignore_merges), Qwen2 normalizes to NFC."""
    from tokenizers import normalizers
    from transformers.integrations.gguf import gguf_tokenizer_mapping as hf_gguf

    names = hf_gguf.GGUF_TOKENIZER_MAPPING["tokenizer"]
    hf = hf_gguf.convert_gguf_tokenizer(
        "llama", {n: smol_meta[f"tokenizer.{k}"] for k, n in names.items() if f"tokenizer.{k}" in smol_meta}
        | {"pre_tokenizer_type": pre},
    )[0]
    if pre == "llama-bpe":
        hf.model.ignore_merges = True
    if pre == "qwen2":
        hf.normalizer = normalizers.NFC()
    ours = Tokenizer(smol_meta | {"tokenizer.ggml.pre": pre})
    for text in CORPUS + SMOLLM_SPECIAL + [LONG_SPACES, "e\u0301 cafe\u0301"]:
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False).ids, (pre, text)
    if pre == "qwen2":
        assert ours.encode("cafe\u0301") == ours.encode("café")


def test_unknown_pre_tokenizer_warns_and_splits_like_gpt2(smol_meta, caplog):
    with caplog.at_level(logging.WARNING, logger="swarmfactory.engine.tokenizer"):
        tok = Tokenizer(smol_meta | {"tokenizer.ggml.pre": "brand-new-pre"})
    assert [r.getMessage() for r in caplog.records if "brand-new-pre" in r.getMessage()] == [
        "tokenizer.ggml.pre 'brand-new-pre' is not known; splitting words with the GPT-2 regex"
    ]
    gpt2 = Tokenizer(smol_meta | {"tokenizer.ggml.pre": "gpt2"})
    assert all(tok.encode(t) == gpt2.encode(t) for t in CORPUS)


def test_unsupported_model_is_one_line_error():
    with pytest.raises(ValueError, match=r"^tokenizer model 'bert' is not supported[^\n]*$"):
        Tokenizer({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[PAD]"]})


# --- tiny SentencePiece vocabularies ---

@pytest.mark.parametrize("text, pieces", [
    ("abc", ["a", "bc"]),  # best-scored pair first
    ("cab", ["c", "ab"]),
    ("ab ab", ["ab", "▁ab"]),
    ("é", ["<0xC3>", "<0xA9>"]),  # not in the vocabulary: its UTF-8 bytes
    ("a😀", ["a", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]),
    ("<|turn|>ab<unk>", ["<|turn|>", "ab", "<unk>"]),  # control and unknown tokens match whole
])
def test_sentencepiece_merges_by_score_with_byte_fallback(text, pieces):
    meta = _spm_metadata(PIECES)
    tok = Tokenizer(meta)
    assert tok.encode(text, add_bos=False) == _ids(meta, *pieces) == _LlamaCppSpm(meta).encode(text)
    assert tok.decode(tok.encode(text)) == text.replace("<|turn|>", "").replace("<unk>", "")


def test_sentencepiece_space_prefix_after_every_special_token():
    meta = _spm_metadata(PIECES, **{"tokenizer.ggml.add_space_prefix": True})
    tok = Tokenizer(meta)
    for text, pieces in [("ab a", ["▁ab", "▁a"]), ("<|turn|>ab", ["<|turn|>", "▁ab"]), (" a", ["▁", "▁a"])]:
        assert tok.encode(text, add_bos=False) == _ids(meta, *pieces) == _LlamaCppSpm(meta).encode(text), text
    assert tok.decode(tok.encode("ab a")) == "ab a"  # the prefix is not part of the text
    d = IncrementalDecoder(tok)  # ...but generated text continues a prompt: "▁ab" is " ab"
    assert "".join(d.push(i) for i in tok.encode("ab a", add_bos=False)) + d.flush() == " ab a"


def test_sentencepiece_space_prefix_against_transformers():
    """transformers builds a Llama-type GGUF tokenizer with Metaspace(prepend_scheme="first"): no "▁" in front of text
    that starts with a space or follows a special token. llama.cpp, SentencePiece and Llama 2's own tokenizer.json
    (Prepend normalizer) put one in front of every stretch of text; we follow them. Elsewhere the ids agree."""
    from transformers.integrations.gguf import gguf_tokenizer_mapping as hf_gguf

    meta = _spm_metadata(PIECES, **{"tokenizer.ggml.add_space_prefix": True})
    names = hf_gguf.GGUF_TOKENIZER_MAPPING["tokenizer"]
    hf = hf_gguf.convert_gguf_tokenizer(
        "llama", {n: meta[f"tokenizer.{k}"] for k, n in names.items() if f"tokenizer.{k}" in meta}
    )[0]
    tok = Tokenizer(meta)
    for text in ["", "ab a", "abc", "cab", "ab  ab", "é", "a😀", "ab\nab", "ab "]:
        assert tok.encode(text, add_bos=False) == hf.encode(text, add_special_tokens=False).ids, text
    for text, pieces in [(" a", ["▁", "▁a"]), ("<|turn|>ab", ["<|turn|>", "▁ab"]), ("<unk>ab", ["<unk>", "▁ab"])]:
        assert tok.encode(text, add_bos=False) == _ids(meta, *pieces) != hf.encode(text, add_special_tokens=False).ids


def test_sentencepiece_without_byte_tokens_uses_the_unknown_token():
    meta = _spm_metadata(PIECES, byte_tokens=False, **{"tokenizer.ggml.unknown_token_id": 0})
    tok = Tokenizer(meta)
    assert tok.encode("aé€b", add_bos=False) == _ids(meta, "a", "<unk>", "b")  # one <unk> per unknown run


def test_bos_and_eos_follow_the_file():
    silent = Tokenizer(_spm_metadata(PIECES))  # SentencePiece files that say nothing get BOS, as in llama.cpp
    assert silent.encode("ab") == [1] + silent.encode("ab", add_bos=False)
    flags = {"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True}
    eos = Tokenizer(_spm_metadata(PIECES, **flags))
    assert eos.encode("ab") == eos.encode("ab", add_eos=False) + [2]
    assert eos.encode("ab")[0] != 1
    assert 2 in eos.stop_token_ids


def test_incremental_decoder_on_byte_tokens():
    tok = Tokenizer(_spm_metadata(PIECES))
    text = "aé€😀b"
    d = IncrementalDecoder(tok)
    pieces = [d.push(i) for i in tok.encode(text)] + [d.flush()]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)


# --- chat templates, rendered against transformers' apply_chat_template ---

GEMMA3_STYLE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- set role = "model" if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

LLAMA3_STYLE = """{{- bos_token }}
{%- set ns = namespace(system="") %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Today Date: " + strftime_now("%d %b %Y") + "\n\n" }}
{%- if tools is not none %}
    {{- "You may call these functions:\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{%- if documents %}
    {%- for d in documents %}
        {{- "Document: " + d.title + "\n" + d.text + "\n" }}
    {%- endfor %}
{%- endif %}
{{- ns.system + "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role == 'ignore' %}{% continue %}{% endif %}
    {%- if message.role == 'stop' %}{% break %}{% endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}
    {%- if message.content is defined %}{{ message['content'] | trim }}{% endif %}
    {%- for call in message.tool_calls | default([]) %}
        {{- '{"name": "' + call.function.name + '", "parameters": ' }}
        {{- call.function.arguments | tojson(separators=(",", ":")) + '}' }}
    {%- endfor %}
    {{- '<|eot_id|>' }}
{%- endfor %}
{%- if enable_thinking is defined and not enable_thinking %}<think>

</think>
{% endif %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

GENERATION_TAG = """{% for m in messages %}
{% if m.role == 'assistant' %}{% generation %}[{{ m.content }}]{% endgeneration %}
{% else %}{{ m.role }}: {{ m.content }}
{% endif %}
{% endfor %}"""

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather <now> in a city, e.g. Zürich",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}]
CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "ü 😀 \"quoted\" <tag> & more"},
     {"role": "assistant", "content": "  Hello!\n"}, {"role": "user", "content": "Again?"}],
]
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
    {"role": "ignore", "content": "skipped"},
    {"role": "tool", "content": "21 °C"},
    {"role": "stop", "content": "ends the loop"},
    {"role": "user", "content": "never shown"},
]


def _with_template(meta: dict, template: str) -> Tokenizer:
    return Tokenizer(meta | {"tokenizer.chat_template": template})


@pytest.mark.parametrize("name", ["smollm2-from-file", "gemma3-style", "llama3-style", "generation-tag"])
def test_chat_templates_render_like_transformers(smol_meta, hf_smol, name):
    template = {"smollm2-from-file": smol_meta["tokenizer.chat_template"], "gemma3-style": GEMMA3_STYLE,
                "llama3-style": LLAMA3_STYLE, "generation-tag": GENERATION_TAG}[name]
    ours = _with_template(smol_meta, template)
    for chat in CHATS:
        for gen in (True, False):
            want = hf_smol.apply_chat_template(chat, chat_template=template, add_generation_prompt=gen, tokenize=False)
            assert ours.apply_chat_template(chat, add_generation_prompt=gen) == want


def test_chat_template_tools_documents_and_extra_arguments(smol_meta, hf_smol):
    ours = _with_template(smol_meta, LLAMA3_STYLE)
    docs = [{"title": "Notes", "text": "Zürich is in Switzerland."}]
    kw = {"tools": TOOLS, "documents": docs, "enable_thinking": False}
    want = hf_smol.apply_chat_template(TOOL_CHAT, chat_template=LLAMA3_STYLE, add_generation_prompt=True,
                                       tokenize=False, **kw)
    got = ours.apply_chat_template(TOOL_CHAT, **kw)
    assert got == want
    assert '"description": "Weather <now> in a city, e.g. Zürich"' in got  # tojson: no HTML or ASCII escaping
    assert '{"name": "get_weather", "parameters": {"city":"Zürich"}}' in got
    assert "None" not in got and "skipped" not in got and "never shown" not in got


def test_chat_template_raise_exception(smol_meta, hf_smol):
    chat = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        hf_smol.apply_chat_template(chat, chat_template=GEMMA3_STYLE, tokenize=False)
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        _with_template(smol_meta, GEMMA3_STYLE).apply_chat_template(chat)


def test_chat_template_with_sentencepiece_special_tokens():
    tok = Tokenizer(_spm_metadata(PIECES, **{"tokenizer.chat_template": GEMMA3_STYLE}))
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}]) == (
        "<s><start_of_turn>user\nab<end_of_turn>\n<start_of_turn>model\n"
    )
