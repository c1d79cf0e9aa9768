"""A request as the engine sees it: prompt, sampling parameters, generated tokens and text."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

import torch

from .tokenizer import IncrementalDecoder, Tokenizer


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax; ties go to the lowest token id). The rest as in the
    OpenAI API (and vLLM's extras: top_k, min_p, repetition_penalty); ``engine/sampler.py`` says
    in which order they apply. ``logprobs``: None for none, else how many best alternatives to
    return beside the chosen token's (0-20). ``grammar``: the canonical JSON of a structured
    output spec (``engine/structured.py``), or None."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    grammar: str | None = None

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError("temperature must be in [0, 100]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0: off)")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise ValueError("repetition_penalty must be in (0, 10]")
        if any(not -100.0 <= b <= 100.0 for _, b in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100]")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError("top_logprobs must be in [0, 20]")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError("seed must be a 64-bit integer")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        """Whether anything changes this request's logits before the choice (penalties, bias)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    tokenizer: Tokenizer | None = None  # None: token ids only, no text or stop strings
    id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    slot: int = -1
    n_cached: int = 0  # tokens whose K/V are in the cache
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    text: str = ""  # generated text (stop string excluded)
    emitted: int = 0  # characters of text already handed out as deltas

    def __post_init__(self):
        self.logprobs: list = []  # a sampler.TokenLogprob per output token, where params ask
        self.grammar = None  # a structured.GrammarState where params.grammar names one
        self.generator = None
        if self.params.seed is not None and not self.params.greedy:
            self.generator = torch.Generator().manual_seed(self.params.seed)
        self._decoder = IncrementalDecoder(self.tokenizer) if self.tokenizer else None
        self._hold = max((len(s) for s in self.params.stop), default=1) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefilling(self) -> bool:
        return self.n_cached < len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    def append(self, token: int, stop_ids: frozenset[int], max_len: int) -> None:
        """Record a sampled token; finish on EOS, stop string, max_tokens or cache length."""
        self.output_ids.append(token)
        if token in stop_ids and not self.params.ignore_eos:
            self.finish_reason = "stop"
        elif self._decoder is not None:
            start = max(0, len(self.text) - self._hold - 1)
            self.text += self._decoder.push(token)
            for s in self.params.stop:
                i = self.text.find(s, start)
                if i >= 0:
                    self.text, self.finish_reason = self.text[:i], "stop"
                    break
        if self.finish_reason is None and (
            len(self.output_ids) >= self.params.max_tokens or self.num_tokens >= max_len
        ):
            self.finish_reason = "length"
            if self._decoder is not None:
                self.text += self._decoder.flush()

    def take_delta(self) -> str:
        """Text not yet handed out; holds back a possible stop-string prefix until finished."""
        end = len(self.text) if self.finish_reason else max(self.emitted, len(self.text) - self._hold)
        delta, self.emitted = self.text[self.emitted : end], end
        return delta
