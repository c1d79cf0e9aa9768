"""LLMEngine: add requests, step, collect tokens. Single-threaded; the server drives it."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import torch

from . import memory, model_file
from .config import EngineConfig
from .gguf_loader import load_gguf, resolve_model_path
from .model_runner import ModelRunner
from .models.step import PrefillChunk, StepInput, offset_causal_mask
from .native import build_decoder
from .paths import plan
from .sampler import TokenLogprob, sample
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence, Status
from .supply import KernelSupply
from .tokenizer import Tokenizer


class RequestError(ValueError):
    """A request the engine cannot serve (empty or too long prompt...); message says why."""


@dataclass
class StepOutput:
    seq: Sequence
    token: int | None  # None when the sequence was finished without a new token (abort)
    delta: str
    finished: bool
    logprob: TokenLogprob | None = None  # where the request asked for logprobs


@dataclass
class Completion:
    prompt_tokens: int
    token_ids: list[int]
    text: str
    finish_reason: str


class Engine:
    """A GGUF model (an architecture of ``models.ARCHITECTURES``) with a KV cache, a continuous-batching scheduler and a sampler.

    ``Engine(config).generate(prompts, max_tokens=...)`` for one-shot use; ``add_request`` and
    ``step`` for serving. Not thread-safe: drive it from one thread. ``supply`` builds the
    kernel-factory kernels the config names (``champion:...``) and hears of any caught wrong
    while serving (``engine/supply.py``; ``champions.Corridor(store)``); without one, a config
    naming a champion is refused at load.
    """

    def __init__(self, config: EngineConfig | None = None, *, supply: KernelSupply | None = None, **overrides):
        if config is None:
            config = EngineConfig.from_dict(overrides)
        elif overrides:
            config = EngineConfig.from_dict({**config.model_dump(), **overrides})
        self.config = config
        torch.set_num_threads(config.resolved_threads())
        t0 = time.perf_counter()
        self.model_path = resolve_model_path(config.model)
        gg = load_gguf(self.model_path)
        self.hparams = gg.hparams
        self.tokenizer = Tokenizer(gg.metadata)
        self.model, lib, self.paths = plan(config, gg, self.model_path, supply)
        self.max_seq_len = min(config.max_seq_len, gg.hparams.context_length)
        self.kv = self.model.new_cache(config.max_batch, self.max_seq_len)
        self.native = None
        if lib is not None:
            self.native = build_decoder(lib, gg, self.model, self.kv, self.paths.native_decode,
                                        config.resolved_threads(), max_prompt=self.paths.native_prefill)
        self.scheduler = Scheduler(self.kv, config.max_batch, config.prefill_chunk)
        self.runner = ModelRunner(self.model, self.kv, self.native)
        self.model_id = model_file.model_id(self.model_path)  # what the server serves it as
        self.load_seconds = time.perf_counter() - t0
        self._stop_ids = self.tokenizer.stop_token_ids
        self._metadata = gg.metadata
        self._grammars = None
        self._grammars_lock = threading.Lock()

    @property
    def grammars(self):
        """Structured output for this model's vocabulary (``engine/structured.py``), made on first
        use (from any thread); None where xgrammar is not installed."""
        with self._grammars_lock:
            if self._grammars is None:
                try:
                    from .structured import Grammars
                except ImportError:
                    return None
                self._grammars = Grammars(self.tokenizer, self.hparams.vocab_size, metadata=self._metadata)
            return self._grammars

    def kernel_audit(self) -> dict:
        """How the kernel-factory code this engine runs fared in the audit while serving
        (engine/audit.py): per seam, calls, audited calls and, once caught, what was reported."""
        from .native_seam import NativeLinear

        out: dict = {"native_kernels": {}, "native_matvec": None}
        layer = self.model.layers[0] if self.model.layers else None
        linear = {op: getattr(layer, op).kernel for op in ("qkv", "o", "gate_up", "down") if layer is not None}
        linear["lm_head"] = self.model.lm_head.kernel
        # the non-linear ops' kernels (native_ops.py) report as the linear ops' do
        for op, k in [*linear.items(), *self.model.ops.kernels.items()]:
            if isinstance(k, NativeLinear) or op in self.model.ops.kernels:
                st = k.audit_state
                out["native_kernels"][op] = {"calls": st["calls"], "audited": st["audited"],
                                             "dropped": st["dropped"], "audit": k.check}
        qexts = getattr(self.model, "qexts", None)  # the factory's kernels in the block kernels (native/qext.py)
        out["native_matmul"] = qexts.audit_state() if qexts is not None else {}
        ext = getattr(self.native, "_ext", None)
        if ext is not None:
            out["native_matvec"] = {"calls": ext.calls, "audited": ext.audited, "dropped": self.native.lib.dropped(),
                                    "audit": bool(ext.audit)}
        return out

    def memory_estimate(self) -> dict:
        """Bytes of weights and KV cache held, per token and per sequence, the memory available
        and the batch x context that would fit in it (``engine/memory.py``, ``estimate``)."""
        return memory.estimate(self)

    # -- serving API -----------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None) -> Sequence:
        params = params or SamplingParams()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.check_prompt(ids, params)
        seq = Sequence(ids, params, self.tokenizer)
        if params.grammar is not None:
            if self.grammars is None:
                raise RequestError("structured output needs xgrammar, which is not installed")
            try:
                seq.grammar = self.grammars.state(json.loads(params.grammar))
            except ValueError as e:
                raise RequestError(f"structured output: {e}") from None
        self.scheduler.add(seq)
        return seq

    def check_prompt(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise RequestError("the prompt is empty")
        if any((not isinstance(i, int)) or i < 0 or i >= self.hparams.vocab_size for i in ids):
            raise RequestError(f"prompt token ids must be integers in [0, {self.hparams.vocab_size})")
        if len(ids) + params.max_tokens > self.max_seq_len:
            raise RequestError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                f"context length of this engine ({self.max_seq_len} tokens)"
            )

    def abort(self, seq: Sequence) -> None:
        self.scheduler.finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def step(self) -> list[StepOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        logits, wants = self.runner.run(batch)
        if not wants:
            return []
        tokens, lps = sample(logits, wants)
        outs = []
        for s, t, lp in zip(wants, tokens, lps):
            if lp is not None:
                s.logprobs.append(lp)
            s.append(t, self._stop_ids, self.max_seq_len)
            if s.grammar is not None and not s.grammar.accept(t) and s.finish_reason is None:
                s.finish_reason = "stop"  # its mask allows only what it accepts: ends, never crashes the batch
            done = s.finish_reason is not None
            if done:
                self.scheduler.finish(s, s.finish_reason)
            outs.append(StepOutput(s, t, s.take_delta(), done, lp))
        return outs

    def score(self, ids: list[int]) -> torch.Tensor:
        """fp32 logits [len(ids), vocab] for every position of one token sequence (teacher
        forcing, chunked like a prefill); for perplexity and logit-error checks."""
        if not ids or len(ids) > self.max_seq_len:
            raise RequestError(f"score needs 1..{self.max_seq_len} tokens, got {len(ids)}")
        if not self.kv.free_slots:
            raise RuntimeError("no free KV slot to score with")
        slot = self.kv.allocate()
        out = []
        try:
            for start in range(0, len(ids), self.config.prefill_chunk):
                chunk = ids[start : start + self.config.prefill_chunk]
                n = len(chunk)
                step = StepInput(
                    tokens=torch.tensor(chunk, dtype=torch.long),
                    positions=torch.arange(start, start + n),
                    slots=torch.full((n,), slot, dtype=torch.long),
                    n_decode=0, decode_slots=None, decode_range=None, decode_len=0, decode_bias=None,
                    prefills=[PrefillChunk(row=0, n=n, slot=slot, start=start,
                                           mask=offset_causal_mask(n, start) if start else None)],
                    logit_rows=None,
                )
                out.append(self.model.forward(step, self.kv))
        finally:
            self.kv.release(slot)
        return torch.cat(out)

    # -- one-shot API ------------------------------------------------------------------------
    def generate(self, prompts: str | list[int] | list, max_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, stop: tuple[str, ...] | list[str] = (), seed: int | None = None,
                 ignore_eos: bool = False) -> list[Completion]:
        """Generate for every prompt (text or token ids), batched; returns completions in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                stop=tuple(stop), seed=seed, ignore_eos=ignore_eos)
        seqs = [self.add_request(p, params) for p in prompts]
        while any(s.status is not Status.FINISHED for s in seqs):
            self.step()
        return [Completion(len(s.prompt_ids), list(s.output_ids), s.text, s.finish_reason or "stop") for s in seqs]
