"""Tokenizer and chat template, both read from the GGUF metadata (no files, no downloads).

``tokenizer.ggml.model`` names the vocabulary:

- ``gpt2``: byte-level BPE (Llama 3, Qwen 2.5/3, SmolLM). The file lists the merges; ``tokenizer.ggml.pre``
  names how text is cut into words first.
- ``llama``: SentencePiece BPE with byte fallback (Gemma, Llama 2, Mistral). The file lists scores, not merges.
  SentencePiece (and llama.cpp) repeatedly joins the adjacent pair whose union is the best-scored token; that is
  BPE with one merge per way of cutting a token in two, ranked by the token's score.

Control, unknown and user-defined tokens are matched whole in the text before anything else, as llama.cpp does.
The chat template is rendered as transformers renders it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

log = logging.getLogger(__name__)

# tokenizer.ggml.token_type
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
# Tokens that end a turn in common chat formats; stop tokens when the file has them as control tokens.
_END_OF_TURN = (
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "</s>", "<end_of_turn>", "<EOT>",
    "<｜end▁of▁sentence｜>",
)
# Word-splitting regexes, from llama.cpp (llama-vocab.cpp) and the models' own tokenizer.json files.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class _Pre:
    """How a byte-level vocabulary cuts text into words before merging."""

    splits: tuple[str, ...]  # applied in order, each match its own word
    nfc: bool = False  # Qwen2's tokenizer normalizes to NFC first
    ignore_merges: bool = False  # Llama 3: a word that is itself a token stays whole
    add_bos: bool = False  # what llama.cpp assumes when the file has no add_bos_token


_GPT2 = _Pre((_GPT2_SPLIT,))
_LLAMA3 = _Pre((_LLAMA3_SPLIT,), ignore_merges=True, add_bos=True)
_QWEN2 = _Pre((_QWEN2_SPLIT,), nfc=True)
_PRE = {
    "default": _GPT2,
    "gpt2": _GPT2,
    "gpt-2": _GPT2,
    "smollm": _Pre((r"\p{N}", _GPT2_SPLIT)),  # every digit is its own word
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "qwen2": _QWEN2,
}


class Tokenizer:
    """Text <-> token ids for a GGUF model, with its special tokens, BOS/EOS flags and chat template.

    Read-only after construction. ``encode`` matches special-token strings in the text (``<|im_start|>``) whole.
    """

    def __init__(self, metadata: dict):
        kind = metadata.get("tokenizer.ggml.model")
        if kind not in ("gpt2", "llama"):
            raise ValueError(
                f"tokenizer model {kind!r} is not supported (only 'gpt2' byte-level BPE and 'llama' SentencePiece)"
            )
        tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        types = _array(metadata, "tokenizer.ggml.token_type", [_NORMAL] * len(tokens))
        # llama.cpp's defaults for a file that does not say
        self._space_prefix = kind == "llama" and bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
        if kind == "gpt2":
            pre = _pre_tokenization(metadata.get("tokenizer.ggml.pre"))
            tok, add_bos = _byte_level(metadata, tokens, pre), pre.add_bos
        else:
            tok, add_bos = _sentencepiece(metadata, tokens, types, self._space_prefix), True
        # Matched whole before splitting; only the control and unknown ones are skipped when decoding.
        special = [t for t, ty in zip(tokens, types) if ty in (_CONTROL, _UNKNOWN)]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
        user = [t for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
        if user:
            tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
        self._tok = tok
        self.kind = kind  # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
        self.vocab_size = len(tokens)
        self.tokens = tokens
        self._types = types
        self.bos_token_id = _opt_int(metadata.get("tokenizer.ggml.bos_token_id"))
        self.eos_token_id = _opt_int(metadata.get("tokenizer.ggml.eos_token_id"))
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos))
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        stops = {i for i in map(tok.token_to_id, _END_OF_TURN) if i is not None and types[i] == _CONTROL}
        for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
            if (i := _opt_int(metadata.get(f"tokenizer.ggml.{key}"))) is not None:
                stops.add(i)
        self.stop_token_ids = frozenset(stops)
        # What transformers passes a chat template as its special tokens map.
        names = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}
        self._template_tokens = {
            name: tokens[i]
            for name, key in names.items()
            if (i := _opt_int(metadata.get(f"tokenizer.ggml.{key}_token_id"))) is not None and 0 <= i < len(tokens)
        }
        self._template_src = metadata.get("tokenizer.chat_template")
        self._template = _TEMPLATES.from_string(self._template_src) if self._template_src else None

    def encode(self, text: str, add_bos: bool | None = None, add_eos: bool | None = None) -> list[int]:
        """Token ids of ``text``. BOS goes first when the file (or ``add_bos``) asks for it, unless the text already
        starts with it (a chat template that writes ``{{ bos_token }}``); EOS goes last only when the file (or
        ``add_eos``) asks for it."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        bos, eos = self.bos_token_id, self.eos_token_id
        if (self.add_bos if add_bos is None else add_bos) and bos is not None and ids[:1] != [bos]:
            ids = [bos] + ids
        if (self.add_eos if add_eos is None else add_eos) and eos is not None:
            ids = ids + [eos]
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids``, as transformers decodes it: without the space a SentencePiece file puts in front."""
        text = self._continuation(ids, skip_special)
        return text[1:] if self._space_prefix and text.startswith(" ") else text

    def _continuation(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids`` as it continues a prompt: "▁Paris" is " Paris"."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def token_str(self, i: int) -> str:
        return self.tokens[i] if 0 <= i < len(self.tokens) else ""

    def token_bytes(self, i: int) -> bytes:
        """The bytes token ``i`` stands for in text (a byte-level token's own bytes, a
        SentencePiece byte token's byte, "▁" as a space); a control token's name as UTF-8."""
        t = self.token_str(i)
        if not 0 <= i < len(self._types) or self._types[i] in (_CONTROL, _UNKNOWN, _USER_DEFINED):
            return t.encode()
        if self.kind == "gpt2":
            return bytes(_UNICODE_TO_BYTE.get(c, 32) for c in t)
        if self._types[i] == _BYTE and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            return bytes([int(t[3:5], 16)])
        return t.replace("\u2581", " ").encode()

    @property
    def chat_template_source(self) -> str | None:
        return self._template_src

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None,
                            documents: list | None = None, **kwargs) -> str:
        """The prompt text for ``messages``, as transformers' ``apply_chat_template`` renders it: message keys whose
        value is None are dropped, and extra keyword arguments (``enable_thinking``...) reach the template."""
        if self._template is None:
            raise ValueError("this model has no chat template; use /v1/completions")
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        return self._template.render(
            messages=messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            **{**self._template_tokens, **kwargs},
        )


class IncrementalDecoder:
    """Turns a growing list of generated token ids into text deltas without splitting UTF-8 characters. The text
    continues the prompt: a SentencePiece "▁" at the start of the first token is a space."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] were already emitted; decoded again for context
        self.read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.tok._continuation(self.ids[self.prefix : self.read])
        after = self.tok._continuation(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        before = self.tok._continuation(self.ids[self.prefix : self.read])
        after = self.tok._continuation(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]


def _pre_tokenization(name: str | None) -> _Pre:
    pre = _PRE.get(name or "default")
    if pre is None:
        log.warning("tokenizer.ggml.pre %r is not known; splitting words with the GPT-2 regex", name)
        pre = _GPT2
    return pre


def _byte_level(metadata: dict, tokens: list[str], pre: _Pre) -> HFTokenizer:
    merges = [tuple(m.split(" ", 1)) for m in _array(metadata, "tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=pre.ignore_merges))
    if pre.nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(metadata: dict, tokens: list[str], types: list[int], space_prefix: bool) -> HFTokenizer:
    """Spaces become "▁" (and every stretch of text between special tokens gets one in front when the file says
    add_space_prefix, as in llama.cpp and Llama 2's tokenizer.json); characters missing from the vocabulary become
    their UTF-8 bytes, ``<0xXX>``, or the unknown token when there are no byte tokens."""
    scores = _array(metadata, "tokenizer.ggml.scores", [0.0] * len(tokens))
    vocab = {t: i for i, t in enumerate(tokens)}
    unk = _opt_int(metadata.get("tokenizer.ggml.unknown_token_id"))
    if unk is None:
        unk = next((i for i, ty in enumerate(types) if ty == _UNKNOWN), None)
    tok = HFTokenizer(models.BPE(
        vocab=vocab, merges=_merges_from_scores(tokens, scores, vocab), byte_fallback=True, fuse_unk=True,
        unk_token=None if unk is None else tokens[unk],
    ))
    if space_prefix:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def _merges_from_scores(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every cut of a token into two tokens, best-scored union first (ties: lower id first)."""
    found = []
    for i, t in enumerate(tokens):  # ~1.7M cuts for Gemma's 262k tokens: keep this loop lean
        for k in range(1, len(t)):
            a = t[:k]
            if a in vocab:
                b = t[k:]
                if b in vocab:
                    found.append((-scores[i], i, a, b))
    found.sort()
    return [(a, b) for _, _, a, b in found]


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``, transformers' marker for assistant text: renders its body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML characters; chat templates expect plain JSON.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(msg: str):
    raise jinja2.exceptions.TemplateError(msg)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# Chat templates are untrusted code from the model file: sandboxed, immutable, and set up like transformers'.
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what byte-level vocabularies are written in)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b], n = chr(256 + n), n + 1
    return out


_UNICODE_TO_BYTE = {c: b for b, c in _byte_to_unicode().items()}

_TEMPLATES = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
)
_TEMPLATES.filters["tojson"] = _tojson
_TEMPLATES.globals.update(raise_exception=_raise, strftime_now=_strftime_now)


def _array(metadata: dict, key: str, default: list) -> list:
    v = metadata.get(key)
    return default if v is None else list(v)


def _opt_int(v) -> int | None:
    return None if v is None else int(v)
