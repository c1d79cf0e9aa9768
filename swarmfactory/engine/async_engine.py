"""Drives an Engine step loop while an asyncio server streams its tokens.

The engine is single-threaded; all calls into it happen on one thread, the engine thread.
Requests and aborts arrive through a thread-safe inbox and are applied between steps, which is
what makes batching continuous: a new request joins at the next step, a finished or aborted one
frees its KV slot at once.

``serve`` runs the step loop on the process's main thread and the HTTP server on a helper
thread: torch's CPU kernels measured 2-2.5x slower per step when called from a secondary
thread than from the main thread on the 2-core machine this was built on. ``start_thread``
runs the loop on a helper thread instead (for embedding the app in another server).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass

from .engine import Engine
from .sampler import TokenLogprob
from .sequence import SamplingParams, Sequence

log = logging.getLogger("swarmfactory.engine")


@dataclass
class Event:
    delta: str
    token: int | None
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    logprob: TokenLogprob | None = None  # where the request asked for logprobs


class Handle:
    """One request's stream of Events, read on the asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, prompt_ids: list[int], params: SamplingParams):
        self.loop = loop
        self.prompt_ids = prompt_ids
        self.params = params
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.seq: Sequence | None = None
        self.done = False

    async def __aiter__(self):
        while True:
            ev = await self.events.get()
            yield ev
            if ev.finished:
                return


def _deliver(batch: list[tuple[Handle, Event]]) -> None:
    for h, ev in batch:
        h.events.put_nowait(ev)


class AsyncEngine:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._running = False
        self.error: BaseException | None = None

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self.run, name="engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Handle:
        """Queue a request (already validated with engine.check_prompt); returns its Handle."""
        h = Handle(asyncio.get_running_loop(), prompt_ids, params)
        self._inbox.put(("add", h))
        self._wake.set()
        return h

    def abort(self, h: Handle) -> None:
        if not h.done:
            self._inbox.put(("abort", h))
            self._wake.set()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._running and self.error is None

    def _emit(self, h: Handle, ev: Event) -> None:
        self._emit_many([(h, ev)])

    def _emit_many(self, items: list[tuple[Handle, Event]]) -> None:
        """Hand events to their loops, one wake-up per loop per step: every wake-up makes the
        HTTP thread take the GIL the step loop needs between torch ops."""
        by_loop: dict = {}
        for h, ev in items:
            if ev.finished:
                h.done = True
            by_loop.setdefault(h.loop, []).append((h, ev))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # loop closed: the server is going away
                pass

    def _drain(self) -> None:
        eng = self.engine
        while True:
            try:
                kind, h = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                try:
                    h.seq = eng.add_request(h.prompt_ids, h.params)
                except Exception as e:  # one request the engine cannot take ends alone, never the loop
                    log.warning("request refused by the engine: %s: %s", type(e).__name__, e)
                    self._emit(h, Event("", None, True, "error", len(h.prompt_ids), 0))
                    continue
                h.seq.handle = h
            elif kind == "abort" and h.seq is not None and not h.done:
                eng.abort(h.seq)
                self._emit(h, Event("", None, True, "abort", len(h.prompt_ids), len(h.seq.output_ids)))

    def run(self, keep_going=lambda: True) -> None:
        """The step loop, on the calling thread, until shutdown() or keep_going() is false."""
        eng = self.engine
        self._running = True
        try:
            while not self._stop and keep_going():
                self._drain()
                if not eng.has_unfinished():
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                items = []
                for o in eng.step():
                    h = getattr(o.seq, "handle", None)
                    if h is None or h.done:
                        continue
                    s = o.seq
                    items.append((h, Event(o.delta, o.token, o.finished, s.finish_reason if o.finished else None,
                                           len(s.prompt_ids), len(s.output_ids), o.logprob)))
                if items:
                    self._emit_many(items)
        except BaseException as e:  # surface engine crashes to every waiting request
            self.error = e
            for s in list(eng.scheduler.running) + list(eng.scheduler.waiting):
                h = getattr(s, "handle", None)
                if h is not None and not h.done:
                    self._emit(h, Event("", None, True, "error", len(s.prompt_ids), len(s.output_ids)))
            raise
        finally:
            self._running = False
