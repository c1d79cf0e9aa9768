"""Grammar-constrained decoding (structured output) with xgrammar, as vLLM and SGLang do it.

What the OpenAI-compatible server accepts, as a *spec* dict:

- ``{"type": "json_object"}``: any JSON object (``response_format: {"type": "json_object"}``);
- ``{"type": "json_schema", "schema": {...}, "strict": bool}``: a JSON Schema
  (``response_format: {"type": "json_schema", "json_schema": {"schema": ..., "strict": ...}}``);
- ``{"type": "regex", "pattern": str}``: vLLM's ``guided_regex`` (the whole output matches);
- ``{"type": "choice", "choices": [str, ...]}``: vLLM's ``guided_choice`` (the output is one of them).

API (one :class:`Grammars` per engine, one :class:`GrammarState` per constrained sequence):

- ``Grammars(tokenizer, vocab_size, *, metadata=None, cache_size=64, max_threads=None)``: the vocabulary
  as xgrammar sees it and a compiler. ``vocab_size`` is the number of logit columns the model produces
  (it may exceed the tokenizer's vocabulary: the extra ids are never allowed). ``metadata`` is the GGUF
  metadata the tokenizer was built from; with it the vocabulary kind (``tokenizer.ggml.model``) and the
  token types are read exactly, without it they are inferred from the tokenizer (same result for the
  models we ship).
- ``Grammars.compile(spec) -> Compiled``: validates and compiles; raises :class:`GrammarError` (a
  ``ValueError`` with a one-line message: bad schema, bad regex, empty choice list...) which the
  server turns into HTTP 400. Cached (LRU of ``cache_size`` entries) by the canonical JSON of the spec;
  thread-safe (the HTTP thread compiles while the engine thread steps). Call it in the HTTP thread: a
  big schema can take a while to compile.
- ``Grammars.state(spec_or_compiled) -> GrammarState``: a fresh matcher for one sequence (cheap when
  given a ``Compiled``; do that in the engine thread).
- ``Grammars.cache_info() -> {"hits", "misses", "size", "max_size", "bytes"}``.
- ``GrammarState.accept(token) -> bool``: advance by the sampled token; False means the token violates
  the grammar (the state is unchanged; the caller should end the sequence, e.g. finish_reason "stop",
  and may log it: with masks applied before sampling it cannot happen).
- ``GrammarState.is_terminated() -> bool``: the grammar accepted a stop token. Use: after sampling,
  ``state.accept(tok)``; a stop token (EOS, ``<|im_end|>``...) is only ever allowed where the grammar is
  complete, so the engine's usual "stop token ends the sequence" rule is all that is needed, and
  ``is_terminated()`` turning True at the same time confirms it. Stop strings and ``max_tokens`` still
  end a sequence early (truncated JSON, finish_reason "length", as in vLLM/OpenAI). Once the grammar is
  complete only stop tokens remain allowed, so whatever else masks stop tokens (``min_tokens``,
  ``ignore_eos``) must not do so on a constrained row, or the row has no token left.
- ``GrammarState.failed``: None, or why the matcher gave up (xgrammar's recursion limit on absurdly deep
  nesting); the state then allows only stop tokens, so the sequence ends.
- ``GrammarState.rollback(n)``, ``reset()``: passed through to xgrammar (speculative decoding, retries).
- ``apply_masks(logits, states, *, kernel="numpy")``: in place on ``[R, V]`` logits, one entry of
  ``states`` per row, None for unconstrained rows (left bit-identical). Forbidden tokens get -inf; columns
  beyond ``vocab_size`` always get -inf on constrained rows; a terminated (or failed) state allows only its
  stop tokens. One bitmask buffer per :class:`Grammars` (grown to the most rows seen), one
  ``fill_next_token_bitmask`` per constrained row, then the batch's bitmask is applied at once: by default
  unpacked with numpy and written with ``np.copyto(where=)``, or, where under 1/16 of the vocabulary is
  allowed, by filling the row with -inf and putting back the allowed logits (``kernel="numpy"``; torch
  ``masked_fill_`` for non-fp32 or non-CPU logits), or with one ``xgrammar.apply_token_bitmask_inplace`` call
  (``kernel="xgrammar"``, fp32 CPU); same result. numpy is the default because xgrammar's CPU kernel costs
  ~5 ns per *forbidden* token: ~4 ms for 16 rows of SmolLM2's 49k vocabulary when most tokens are
  forbidden (inside JSON structure) against ~0.3 ms when most are allowed (inside a string), while the
  numpy path takes ~0.5 ms either way (single-threaded, on a loaded 2-core machine). Apply the masks after
  penalties / logit_bias and before temperature / top-k / top-p (see ``sampler.py``): -inf stays -inf
  through all of them.

Choices made here:

- **Layout of JSON**: ``json_schema`` and ``json_object`` are compiled with ``any_whitespace=False`` and
  separators ``(", ", ": ")``, i.e. exactly ``json.dumps``' default one-line layout. With xgrammar's
  default (any whitespace between tokens) small models often emit runs of spaces/newlines, or never stop
  producing them, because whitespace is always allowed and cheap; with one fixed layout the only freedom
  left is the content. ``(", ", ": ")`` rather than fully compact ``(",", ":")``: it is the layout models
  see most (Python's json.dumps, OpenAI's docs), and BPE vocabularies have tokens for ``": "``/``", "``.
  ``json_object`` is therefore compiled as the schema ``{"type": "object"}`` (non-strict: any keys and
  values) rather than xgrammar's builtin JSON grammar, which also allows top-level arrays and free
  whitespace.
- **strict**: ``strict`` (default True when absent) maps to xgrammar's ``strict_mode``: no properties or
  array items beyond those the schema lists (as if ``additionalProperties: false`` /
  ``unevaluatedItems: false``), which is what OpenAI's strict mode requires of a schema anyway and keeps
  small models from inventing fields. ``strict: false`` follows plain JSON Schema semantics (extra
  properties allowed where the schema does not forbid them). Either way the output is constrained.
- **Cache key**: the canonical JSON of the spec, with dict keys sorted *except* the entries of a
  ``properties`` mapping, which keep their order: xgrammar emits properties in the order the schema lists
  them, so two schemas differing only there produce different outputs and must not share a grammar.
  xgrammar's own (unbounded) compiler cache is disabled; ours is a bounded LRU.
- **Vocabulary**: the GGUF token strings as they are: ``gpt2`` -> ``VocabType.BYTE_LEVEL`` (``Ġ`` is a
  space), ``llama`` -> ``VocabType.BYTE_FALLBACK`` (``▁`` is a space, ``<0x0A>`` a byte). Control, unknown
  and unused tokens (which ``Tokenizer.decode`` skips or the model never saw) are given to xgrammar as
  empty strings, which it treats as special and never allows; the stop tokens (``Tokenizer.stop_token_ids``)
  are allowed exactly where the grammar is complete. ``add_prefix_space`` is False: generated text
  continues the prompt, so a leading ``▁`` really is a space.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# tokenizer.ggml.token_type (as in tokenizer.py)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_NEVER = (_UNKNOWN, _CONTROL, _UNUSED)  # token types no grammar allows as text
SEPARATORS = (", ", ": ")  # json.dumps' default one-line layout
_TYPES = ("json_object", "json_schema", "regex", "choice")


class GrammarError(ValueError):
    """A grammar spec that cannot be compiled: one line naming what is wrong (an HTTP 400)."""


def _xgr():
    try:
        import xgrammar
    except ImportError as e:  # pragma: no cover - xgrammar is installed with the engine
        raise RuntimeError("structured output needs xgrammar (pip install xgrammar==0.2.9)") from e
    return xgrammar


@dataclass(frozen=True)
class Compiled:
    """A compiled grammar, shared by every sequence with the same spec."""

    key: str  # canonical JSON of the spec (the cache key)
    spec: dict
    grammar: Any = field(repr=False)  # xgrammar.CompiledGrammar
    compile_s: float = 0.0

    @property
    def memory_bytes(self) -> int:
        return int(self.grammar.memory_size_bytes)


class GrammarState:
    """One sequence's position in its grammar: which tokens may come next, and acceptance of the chosen one.

    Used by one thread at a time (the engine thread)."""

    __slots__ = ("_matcher", "_owner", "_stop_row", "compiled", "failed", "stop_token_ids")

    def __init__(self, owner: Grammars, compiled: Compiled, matcher, stops: tuple[int, ...]):
        self._owner, self.compiled, self._matcher = owner, compiled, matcher
        self.stop_token_ids = stops
        self._stop_row = owner._stop_row if stops == owner.stop_token_ids else _bits(stops, owner._words)
        self.failed: str | None = None

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False (state unchanged) when the grammar forbids it or has terminated."""
        token = int(token)
        if self.failed is not None or self._matcher.is_terminated():
            return False
        if token in self._owner._never and token not in self.stop_token_ids:
            return False  # a blanked token (a stop token of the vocabulary but not of this state) is no text
        try:
            return bool(self._matcher.accept_token(token))
        except (RuntimeError, ValueError, TypeError, OverflowError) as e:  # recursion limit, id out of range
            if isinstance(e, RuntimeError):
                self.failed = _one_line(e)
            return False

    def is_terminated(self) -> bool:
        """True once the grammar has accepted a stop token: the output is complete; end the sequence."""
        return bool(self._matcher.is_terminated())

    def rollback(self, n: int = 1) -> None:
        """Undo the last ``n`` accepted tokens."""
        self._matcher.rollback(n)

    def reset(self) -> None:
        self._matcher.reset()
        self.failed = None

    def fill(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed-token bitmask of the next token into ``bitmask[row]``; False when every token is
        allowed (nothing to apply). A terminated or failed state allows only its stop tokens."""
        if self.failed is None and not self._matcher.is_terminated():
            try:
                return bool(self._matcher.fill_next_token_bitmask(bitmask, row))
            except RuntimeError as e:  # recursion limit: give up on this sequence, let it stop
                self.failed = _one_line(e)
        bitmask[row].copy_(self._stop_row)
        return True


class Grammars:
    """One per engine: the tokenizer info and a compiler, with compiled grammars cached by the canonical JSON
    of their spec (an LRU of ``cache_size`` entries, behind a lock)."""

    def __init__(self, tokenizer, vocab_size: int, *, metadata: dict | None = None, cache_size: int = 64,
                 max_threads: int | None = None):
        xgr = _xgr()
        self.vocab_size = int(vocab_size)
        if self.vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        self.vocab_type, encoded, never = _encoded_vocab(tokenizer, metadata, xgr)
        encoded = encoded[: self.vocab_size]  # a model head smaller than the vocabulary never emits the rest
        stops = sorted(i for i in tokenizer.stop_token_ids if 0 <= i < self.vocab_size)
        if not stops and tokenizer.eos_token_id is not None and 0 <= tokenizer.eos_token_id < self.vocab_size:
            stops = [tokenizer.eos_token_id]
        self.info = xgr.TokenizerInfo(encoded, self.vocab_type, vocab_size=self.vocab_size,
                                      stop_token_ids=stops or None, add_prefix_space=False)
        self.stop_token_ids = tuple(sorted(self.info.stop_token_ids))  # xgrammar guesses when the file has none
        # ids that are never text: blanked tokens and ids past the vocabulary (stop tokens are among them)
        self._never = frozenset(never) | frozenset(range(len(encoded), self.vocab_size))
        if max_threads is None:  # leave the engine thread a core while the HTTP thread compiles
            max_threads = max(1, min(4, (os.cpu_count() or 2) // 2))
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads, cache_enabled=False)
        self._cache: OrderedDict[str, Compiled] = OrderedDict()
        self._inflight: dict[str, Future] = {}
        self._max = max(1, int(cache_size))
        self._hits = self._misses = 0
        self._lock = threading.Lock()
        self._buf_lock = threading.Lock()
        self._bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        self._words = self._bitmask.shape[1]
        self._stop_row = _bits(self.stop_token_ids, self._words)

    # ---- compiling ----
    def compile(self, spec: dict) -> Compiled:
        """The compiled grammar of ``spec`` (see the module docstring); GrammarError when it is invalid."""
        norm = _normalize(spec)
        key = _canonical(norm)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self._hits += 1
                return hit
            pending = self._inflight.get(key)
            if pending is None:
                self._misses += 1
                pending = self._inflight[key] = Future()
                mine = True
            else:
                self._hits += 1  # another thread is compiling it: share its result
                mine = False
        if not mine:
            return pending.result()
        try:
            compiled = self._compile(norm, key)
        except BaseException as e:
            with self._lock:
                del self._inflight[key]
            pending.set_exception(e)
            raise
        with self._lock:
            del self._inflight[key]
            self._cache[key] = compiled
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        pending.set_result(compiled)
        return compiled

    def _compile(self, norm: dict, key: str) -> Compiled:
        t0 = time.perf_counter()
        kind = norm["type"]
        c = self._compiler
        try:
            if kind == "json_object":
                g = c.compile_json_schema('{"type": "object"}', any_whitespace=False, separators=SEPARATORS,
                                          strict_mode=False)
            elif kind == "json_schema":
                g = c.compile_json_schema(json.dumps(norm["schema"], allow_nan=False), any_whitespace=False,
                                          separators=SEPARATORS, strict_mode=norm["strict"])
            elif kind == "regex":
                g = c.compile_regex(norm["pattern"])
            else:
                rule = " | ".join(_ebnf_string(s) for s in norm["choices"])
                g = c.compile_grammar(f"root ::= {rule}")
        except (RuntimeError, ValueError, TypeError, OverflowError) as e:  # xgrammar: RuntimeError from C++ checks
            what = {"json_object": "JSON object grammar", "json_schema": "JSON schema", "regex": "regex",
                    "choice": "choice list"}[kind]
            raise GrammarError(f"invalid {what}: {_one_line(e)}") from None
        return Compiled(key=key, spec=norm, grammar=g, compile_s=time.perf_counter() - t0)

    def state(self, spec: dict | Compiled, stop_token_ids: list[int] | None = None) -> GrammarState:
        """A fresh matcher for one sequence. ``stop_token_ids`` overrides the tokenizer's stop tokens."""
        compiled = spec if isinstance(spec, Compiled) else self.compile(spec)
        xgr = _xgr()
        if stop_token_ids is None:
            return GrammarState(self, compiled, xgr.GrammarMatcher(compiled.grammar), self.stop_token_ids)
        stops = tuple(sorted({int(i) for i in stop_token_ids if 0 <= int(i) < self.vocab_size}))
        if not stops:
            raise ValueError(f"no stop token id in [0, {self.vocab_size}) among {stop_token_ids}")
        matcher = xgr.GrammarMatcher(compiled.grammar, override_stop_tokens=list(stops))
        return GrammarState(self, compiled, matcher, stops)

    def cache_info(self) -> dict:
        with self._lock:
            return {"hits": self._hits, "misses": self._misses, "size": len(self._cache), "max_size": self._max,
                    "bytes": sum(c.memory_bytes for c in self._cache.values())}

    # ---- masking ----
    def _apply(self, logits: torch.Tensor, states: list, rows: list[int], kernel: str) -> None:
        V = self.vocab_size
        if logits.shape[1] < V:
            raise ValueError(f"logits have {logits.shape[1]} columns, fewer than the grammar vocabulary ({V})")
        with self._buf_lock:
            if self._bitmask.shape[0] < len(states):
                self._bitmask = _xgr().allocate_token_bitmask(len(states), V)
            buf = self._bitmask
            active = [i for i in rows if states[i].fill(buf, i)]
            if active:
                if kernel == "xgrammar" and logits.dtype == torch.float32 and logits.device.type == "cpu":
                    _xgr().apply_token_bitmask_inplace(logits, buf, vocab_size=V, indices=active)
                else:
                    _apply_unpacked(logits, buf, V, active)
        if logits.shape[1] > V:
            logits[rows, V:] = float("-inf")


def apply_masks(logits: torch.Tensor, states: list[GrammarState | None], *, kernel: str = "numpy") -> None:
    """In place on logits ``[R, V]`` (``len(states) == R``): rows whose state is None are untouched; for the
    others every token the grammar forbids gets -inf (see the module docstring).

    ``kernel="numpy"`` (default) unpacks the batch's bitmask once and writes -inf with ``np.copyto(where=)``
    per row: ~0.5 ms for 16 rows of a 49k vocabulary whatever the mask. ``kernel="xgrammar"`` uses
    ``xgrammar.apply_token_bitmask_inplace`` (fp32 CPU logits; same result), which is faster when most tokens
    are allowed (inside a string) but ~10x slower when most are forbidden (the common case in JSON structure)."""
    if kernel not in ("numpy", "xgrammar"):
        raise ValueError(f"kernel must be 'numpy' or 'xgrammar', got {kernel!r}")
    rows = [i for i, s in enumerate(states) if s is not None]
    if not rows:
        return
    if logits.dim() != 2 or logits.shape[0] != len(states):
        raise ValueError(f"logits {tuple(logits.shape)} do not match {len(states)} grammar states")
    owner = states[rows[0]]._owner
    if any(states[i]._owner is not owner for i in rows):
        raise ValueError("grammar states of one batch must come from the same Grammars")
    owner._apply(logits, states, rows, kernel)


# ---- helpers ----
def _apply_unpacked(logits: torch.Tensor, bitmask: torch.Tensor, V: int, rows: list[int]) -> None:
    """-inf where ``bitmask[r]`` has a 0 bit, for each row r in ``rows``, columns ``:V``, in place."""
    words = bitmask.numpy()[rows]  # xgrammar's layout: token j is bit j % 32 of int32 word j // 32
    if logits.dtype == torch.float32 and logits.device.type == "cpu":
        out = logits.detach().numpy()
        sparse = _popcount(words) * 16 < V  # few tokens allowed (JSON structure): keep those, fill the rest
        dense = [k for k in range(len(rows)) if not sparse[k]]
        if dense:
            forbidden = _unpack(np.invert(words[dense]), V)
        for k, r in enumerate(rows):
            row = out[r, :V]
            if sparse[k]:
                keep = np.flatnonzero(_unpack(words[k : k + 1], V)[0])
                vals = row[keep]
                row.fill(-np.inf)
                row[keep] = vals
        for d, k in enumerate(dense):
            np.copyto(out[rows[k], :V], -np.inf, where=forbidden[d])
    else:  # other dtypes (bf16) and devices: torch, row by row on views
        mask = torch.from_numpy(_unpack(np.invert(words), V)).to(logits.device)
        for k, r in enumerate(rows):
            logits[r, :V].masked_fill_(mask[k], float("-inf"))


def _unpack(words: np.ndarray, V: int) -> np.ndarray:
    """int32 bitmask rows [n, W] -> bool [n, V]."""
    return np.unpackbits(words.view(np.uint8), axis=1, count=V, bitorder="little").view(np.bool_)


def _popcount(words: np.ndarray) -> np.ndarray:
    """Set bits per row of an int32 bitmask."""
    u = words.view(np.uint32)
    if hasattr(np, "bitwise_count"):  # numpy >= 2
        return np.bitwise_count(u).sum(axis=1, dtype=np.int64)
    return np.unpackbits(u.view(np.uint8), axis=1).sum(axis=1, dtype=np.int64)


def _bits(ids, words: int) -> torch.Tensor:
    """A bitmask row (int32, xgrammar's layout: token j is bit j % 32 of word j // 32) allowing ``ids``."""
    vals = [0] * words
    for i in ids:
        vals[i // 32] |= 1 << (i % 32)
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in vals], dtype=torch.int32)


def _encoded_vocab(tokenizer, metadata: dict | None, xgr) -> tuple[Any, list[str], set[int]]:
    """(xgrammar vocab type, the token strings with never-text tokens blanked, the blanked ids)."""
    tokens = list(tokenizer.tokens)
    if metadata is not None:
        kind = metadata.get("tokenizer.ggml.model")
        types = metadata.get("tokenizer.ggml.token_type")
        never = set() if types is None else {i for i, t in enumerate(types) if t in _NEVER}
    else:  # what Tokenizer built from that metadata: the vocabulary kind and its special (control/unknown) tokens
        kind = "llama" if ("<0x0A>" in tokenizer.tokens or getattr(tokenizer, "_space_prefix", False)) else "gpt2"
        added = getattr(getattr(tokenizer, "_tok", None), "get_added_tokens_decoder", dict)()
        never = {i for i, t in added.items() if t.special}
    if kind == "gpt2":
        vtype = xgr.VocabType.BYTE_LEVEL
    elif kind == "llama":
        vtype = xgr.VocabType.BYTE_FALLBACK
    else:
        raise ValueError(f"tokenizer model {kind!r} is not supported for structured output (gpt2, llama)")
    never = {i for i in never if 0 <= i < len(tokens)}
    for i in never:
        tokens[i] = ""
    return vtype, tokens, never


def _normalize(spec) -> dict:
    """The spec reduced to what decides the grammar; GrammarError when it is malformed."""
    if not isinstance(spec, dict):
        raise GrammarError(f"grammar spec must be an object, got {type(spec).__name__}")
    kind = spec.get("type")
    if kind == "json_object":
        return {"type": kind}
    if kind == "json_schema":
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise GrammarError(f"json_schema needs a schema object, got {type(schema).__name__}")
        strict = spec.get("strict")
        if strict is None:
            strict = True
        if not isinstance(strict, bool):
            raise GrammarError(f"json_schema strict must be a boolean, got {strict!r}")
        try:
            json.dumps(schema, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise GrammarError(f"invalid JSON schema: not JSON ({e})") from None
        return {"type": kind, "schema": schema, "strict": strict}
    if kind == "regex":
        pattern = spec.get("pattern")
        if not isinstance(pattern, str):
            raise GrammarError(f"regex needs a pattern string, got {type(pattern).__name__}")
        _utf8(pattern, "regex pattern")
        return {"type": kind, "pattern": pattern}
    if kind == "choice":
        choices = spec.get("choices")
        if not isinstance(choices, (list, tuple)) or not choices:
            raise GrammarError("choice needs a non-empty list of strings")
        if not all(isinstance(c, str) for c in choices):
            raise GrammarError("choice needs a list of strings")
        for c in choices:
            _utf8(c, "choice")
        return {"type": kind, "choices": list(choices)}
    raise GrammarError(f"unknown grammar type {kind!r} (one of {', '.join(_TYPES)})")


def _utf8(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GrammarError(f"{what} is not valid Unicode (lone surrogate at position {e.start})") from None


def _canonical(norm: dict) -> str:
    """The cache key: JSON with sorted keys, except a ``properties`` mapping keeps its order (it is the output
    order of the properties)."""
    def canon(x):
        if isinstance(x, dict):
            out = {}
            for k in sorted(x, key=str):
                v = x[k]
                if k == "properties" and isinstance(v, dict):
                    out[k] = {"__ordered__": [[str(n), canon(s)] for n, s in v.items()]}
                else:
                    out[k] = canon(v)
            return out
        if isinstance(x, (list, tuple)):
            return [canon(v) for v in x]
        return x

    return json.dumps(canon(norm), sort_keys=False, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _ebnf_string(s: str) -> str:
    """``s`` as an EBNF string literal for xgrammar (GBNF escapes)."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif o < 0x20 or o == 0x7F:  # \u takes exactly 4 digits (xgrammar's \x takes as many as follow)
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_LOG_PREFIX = re.compile(r"^\[[0-9:.]+\] \S+:\d+: ")


def _one_line(e: BaseException) -> str:
    """xgrammar's message without its C++ location / check expression, on one line, bounded."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    msg = lines[0] if lines else type(e).__name__
    msg = _LOG_PREFIX.sub("", msg)
    if msg.startswith("Check failed:") and " is false: " in msg:
        msg = msg.split(" is false: ", 1)[1]
    msg = msg.strip() or type(e).__name__
    return msg if len(msg) <= 200 else msg[:197] + "..."
