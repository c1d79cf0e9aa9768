"""Turns a scheduled step into tensors, runs the model, and returns next-token logits.

Steps with few enough decode sequences (and, when the native decoder takes prompts, their
prompt chunks) run the native decoder in one call when the engine has one. A step with more
than one call takes runs in several: the decode rows natively in calls up to its limit, every
prompt chunk it takes natively (packed into calls up to its limit), a chunk longer than that on
the torch model (so neither a long prompt nor more sequences beside a row move it onto the other
path or change its numbers). Without the native decoder every step runs the torch model. Both
write the same KV cache.
"""

from __future__ import annotations

import torch

from .kv_cache import KVCache
from .models.decoder import Decoder
from .models.step import PrefillChunk, StepInput, offset_causal_mask
from .native import NativeDecoder
from .scheduler import Scheduled
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model: Decoder, kv: KVCache, native: NativeDecoder | None = None):
        self.model = model
        self.kv = kv
        self.native = native

    def build(self, batch: Scheduled) -> tuple[StepInput, list[Sequence]]:
        """The step's input and the sequences that get a next token, in logit-row order."""
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        wants: list[Sequence] = []
        rows: list[int] = []
        dec = batch.decode
        lens = []
        for s in dec:
            tokens.append(s.last_token())
            positions.append(s.num_tokens - 1)
            slots.append(s.slot)
            lens.append(s.num_tokens)
            rows.append(len(rows))
            wants.append(s)
        chunks = []
        for s, n in batch.prefill:
            row = len(tokens)
            tokens.extend(s.prompt_ids[s.n_cached : s.n_cached + n])
            positions.extend(range(s.n_cached, s.n_cached + n))
            slots.extend([s.slot] * n)
            mask = offset_causal_mask(n, s.n_cached) if s.n_cached else None
            chunks.append(PrefillChunk(row=row, n=n, slot=s.slot, start=s.n_cached, mask=mask))
            if s.n_cached + n == len(s.prompt_ids):
                rows.append(row + n - 1)
                wants.append(s)
        dslots = [s.slot for s in dec]
        contiguous = bool(dslots) and dslots == list(range(dslots[0], dslots[0] + len(dslots)))
        bias = None
        dlen = max(lens, default=0)
        if lens and min(lens) != dlen:
            pad = torch.arange(dlen)[None, :] >= torch.tensor(lens)[:, None]
            bias = torch.zeros(len(lens), dlen, dtype=self.model.dtype).masked_fill_(pad, float("-inf"))
            bias = bias.view(len(lens), 1, 1, dlen)
        n_rows = len(tokens)
        step = StepInput(
            tokens=torch.tensor(tokens, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            slots=torch.tensor(slots, dtype=torch.long),
            n_decode=len(dec),
            decode_slots=None if contiguous or not dslots else torch.tensor(dslots, dtype=torch.long),
            decode_range=(dslots[0], dslots[-1] + 1) if contiguous else None,
            decode_len=dlen,
            decode_bias=bias,
            prefills=chunks,
            logit_rows=None if rows == list(range(n_rows)) else torch.tensor(rows, dtype=torch.long),
        )
        return step, wants

    def native_takes(self, batch: Scheduled) -> bool:
        nat = self.native
        return (nat is not None and len(batch.decode) <= nat.max_batch
                and sum(n for _, n in batch.prefill) <= nat.max_prompt)

    def _native_decode(self, dec: list[Sequence]) -> torch.Tensor:
        logits = self.native(torch.tensor([s.last_token() for s in dec]),
                             torch.tensor([s.slot for s in dec]),
                             torch.tensor([s.num_tokens - 1 for s in dec]))
        for s in dec:
            s.n_cached += 1
        return logits

    def run(self, batch: Scheduled) -> tuple[torch.Tensor, list[Sequence]]:
        dec = batch.decode
        if self.native_takes(batch) and not batch.prefill:  # the common case, built directly
            return self._native_decode(dec), list(dec)
        nat = self.native
        if nat is not None and nat.max_batch > 0 and not self.native_takes(batch):
            # more than one native call takes: the decode rows natively in calls of at most its
            # limit, then each prompt chunk the native step takes natively (chunks packed into
            # calls up to its limit), only a chunk longer than that on torch. A row's path depends
            # on its own length, never on what else shares the step (different sequences,
            # different slots: the calls are independent, and the native step's rows do not depend
            # on the others in its call), so a prompt gets the tokens it gets alone, whether a
            # long one is prefilled beside it or more sequences decode than one call takes
            calls, group, size, long = [], [], 0, []
            for s, n in batch.prefill:
                if n > nat.max_prompt:
                    long.append((s, n))
                    continue
                if size + n > nat.max_prompt:
                    calls.append(group)
                    group, size = [], 0
                group.append((s, n))
                size += n
            calls = [g for g in calls + [group] if g]
            outs = [self._native_decode(dec[i:i + nat.max_batch]) for i in range(0, len(dec), nat.max_batch)]
            wants = list(dec)
            for part in calls + ([long] if long else []):
                logits, w = self._step(Scheduled(decode=[], prefill=part))
                outs.append(logits)
                wants += w
            return torch.cat(outs), wants
        return self._step(batch)

    def _step(self, batch: Scheduled) -> tuple[torch.Tensor, list[Sequence]]:
        """One call: the native decoder where it takes the whole step, else the torch model."""
        step, wants = self.build(batch)
        if not wants:  # only partial prompt chunks: fill the cache, skip the output head
            step.logit_rows = torch.empty(0, dtype=torch.long)
        if self.native_takes(batch):
            logits = self.native(step.tokens, step.slots, step.positions, step.logit_rows)
        else:
            logits = self.model.forward(step, self.kv)
        for s, n in batch.prefill:
            s.n_cached += n
        for s in batch.decode:
            s.n_cached += 1
        return logits, wants
