"""Continuous batching with chunked prefill.

Every step decodes one token for each running sequence whose prompt is fully cached and spends
up to ``prefill_chunk`` tokens on prompts: first the one being prefilled, then newly admitted
requests (FIFO) while KV slots are free. New requests therefore join between decode steps and
finished ones leave at once; a long prompt never stalls running sequences for more than one
chunk.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .kv_cache import KVCache
from .sequence import Sequence, Status


@dataclass
class Scheduled:
    decode: list[Sequence]
    prefill: list[tuple[Sequence, int]]  # (sequence, tokens of its prompt to process now)

    def __bool__(self) -> bool:
        return bool(self.decode or self.prefill)


class Scheduler:
    def __init__(self, kv: KVCache, max_batch: int, prefill_chunk: int):
        self.kv = kv
        self.max_batch = min(max_batch, kv.slots)
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Scheduled:
        decode = [s for s in self.running if not s.prefilling]
        budget = self.prefill_chunk
        prefill = []
        for s in self.running:  # admitted earlier, prompt not yet fully cached
            if s.prefilling and budget > 0:
                n = min(budget, len(s.prompt_ids) - s.n_cached)
                prefill.append((s, n))
                budget -= n
        while budget > 0 and self.waiting and len(self.running) < self.max_batch and self.kv.free_slots:
            s = self.waiting.popleft()
            s.slot = self.kv.allocate()
            s.status = Status.RUNNING
            self.running.append(s)
            n = min(budget, len(s.prompt_ids))
            prefill.append((s, n))
            budget -= n
        return Scheduled(decode, prefill)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Remove a sequence (finished or aborted) and free its slot; idempotent."""
        if seq.status is Status.FINISHED:
            return
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.kv.release(seq.slot)
            seq.slot = -1
        else:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = seq.finish_reason or reason
