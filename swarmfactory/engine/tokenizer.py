"""Tokenizer and chat template, both read from the GGUF metadata (no files, no downloads)."""

from __future__ import annotations

from typing import Iterable

import jinja2
import jinja2.sandbox
from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

_CONTROL = 3
_USER_DEFINED = 4
# Tokens that end a turn in common chat formats; used as stop tokens when the file has them.
_END_OF_TURN = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "</s>")
# llama.cpp's pre-tokenizer regexes, by tokenizer.ggml.pre (default: GPT-2's).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


class Tokenizer:
    """Byte-level BPE (GPT-2 style, ``tokenizer.ggml.model == "gpt2"``) built from GGUF metadata."""

    def __init__(self, metadata: dict):
        kind = metadata.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
        tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges") or []]
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=False))
        splits = [pre_tokenizers.Split(Regex(_GPT2_SPLIT), behavior="isolated")]
        if metadata.get("tokenizer.ggml.pre") == "smollm":  # every digit is its own word
            splits.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        tok.decoder = decoders.ByteLevel()
        special = [t for t, ty in zip(tokens, types) if ty == _CONTROL]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
        user = [t for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
        if user:
            tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
        self._tok = tok
        self.vocab_size = len(tokens)
        self.tokens = tokens
        self.bos_token_id = _opt_int(metadata.get("tokenizer.ggml.bos_token_id"))
        self.eos_token_id = _opt_int(metadata.get("tokenizer.ggml.eos_token_id"))
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
        stops = {vocab[t] for t in _END_OF_TURN if t in vocab and types[vocab[t]] == _CONTROL}
        if self.eos_token_id is not None:
            stops.add(self.eos_token_id)
        self.stop_token_ids = frozenset(stops)
        self._template_src = metadata.get("tokenizer.chat_template")
        self._template = None
        if self._template_src:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(self._template_src)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def token_str(self, i: int) -> str:
        return self.tokens[i] if 0 <= i < len(self.tokens) else ""

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise ValueError("this model has no chat template; use /v1/completions")
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.token_str(self.bos_token_id) if self.bos_token_id is not None else "",
            eos_token=self.token_str(self.eos_token_id) if self.eos_token_id is not None else "",
        )


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas without splitting UTF-8 characters."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] were already emitted; decoded again for context
        self.read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.tok.decode(self.ids[self.prefix : self.read])
        after = self.tok.decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        before = self.tok.decode(self.ids[self.prefix : self.read])
        after = self.tok.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]


def _opt_int(v) -> int | None:
    return None if v is None else int(v)


def _raise(msg: str):
    raise jinja2.exceptions.TemplateError(msg)
