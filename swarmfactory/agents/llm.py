"""LLM coder agents: free-form kernel rewrites through any OpenAI-compatible endpoint.

Each agent wraps one endpoint (a hosted API, vLLM, llama.cpp, our own engine). Calls run in the
background (``concurrency`` at a time) so the swarm never waits on a model: ``propose`` hands
back whatever answers have arrived and starts new calls. Every call is recorded (tokens, cost,
seconds, status and, when the answer could not be used, the raw text). A candidate of this agent
that failed to build or verify is sent back once with its error (the repair loop).

An agent whose endpoint fails ``MAX_FAILURES`` calls in a row (refused connections, timeouts,
server or client errors) stops for good: ``stopped`` says why, naming the endpoint, and a call
row with status ``stopped`` records it, so the run's summary says so.
"""

from __future__ import annotations

import inspect
import json
import re
import textwrap
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import jinja2

from swarmfactory.agents.base import Agent, Board, Entry, Proposal
from swarmfactory.agents.edits import EditError, extract_source
from swarmfactory.backends import get_backend
from swarmfactory.evidence.store import content_hash
from swarmfactory.llm.client import ChatClient, CostCapReached, LLMError
from swarmfactory.outcome import MEASURED
from swarmfactory.redact import redact

PROMPTS = Path(__file__).with_name("prompts")
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(str(PROMPTS)), undefined=jinja2.StrictUndefined,
                          trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
# `{{ problem.backend | fence }}`: the tag of the fenced blocks the prompts show that backend's sources in
_ENV.filters["fence"] = lambda backend: get_backend(backend).language.fence
REPAIRABLE = ("build_failed", "wrong")
MAX_FAILURES = 3       # consecutive failed calls of any kind (refused, timed out, HTTP errors) before the agent stops
MAX_FATAL = MAX_FAILURES  # the engine factory's designer: unrecoverable errors in a row before it stops
BACKOFF_CAP_S = 30.0   # pause after consecutive failed calls grows up to this
UNREACHABLE_PAUSE_S = 0.1   # ... but after a refused connection, this per failure: nothing is listening
CLOSE_GRACE_S = 3.0    # at the end of a run, what a call in flight gets to finish and record itself


def _us(x) -> str | None:
    """Microseconds as a prompt shows them: 3 significant figures."""
    return None if not x else format(x, ".3g") if x < 1000 else f"{x:.0f}"


def render_prompt(name: str, **values) -> str:
    return _ENV.get_template(name).render(**values)


def reference_source(problem) -> str:
    try:
        return textwrap.dedent(inspect.getsource(problem.reference)).strip()
    except (OSError, TypeError):
        return f"# see {problem.source_path}"


class LLMAgent(Agent):
    def __init__(self, client: ChatClient, concurrency: int = 1, max_tokens: int = 1500,
                 temperature: float = 0.7):
        self.client, self.concurrency = client, max(1, concurrency)
        self.name = f"llm:{client.endpoint.label}"
        self.max_tokens, self.temperature = max_tokens, temperature
        self.pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="sf-llm")
        self.pending: list[Future] = []
        self.repaired: set[str] = set()      # failed candidates already sent back once
        self.repairs: set[str] = set()       # candidates that are themselves repairs
        self.capped = False                  # no more calls: cost cap, or stopped
        self.compact = False                 # the endpoint's context is small: shorter prompts
        self.context_tokens: int | None = None
        self.chars_per_token = 3.0
        self.failures = 0                    # consecutive failed calls
        self.last_kind: str | None = None    # how the last failed call failed
        self.stopped: str | None = None      # why it stopped for good (Agent.stopped)
        self.asked = False                   # a request has been sent in this run
        self.store, self.run_id = None, None

    def bind(self, store, run_id: str) -> None:
        self.store, self.run_id = store, run_id

    def busy(self) -> bool:
        return any(not f.done() for f in self.pending)

    def leads(self, board: Board) -> bool:
        """Asked first until its first request is out: asking costs the turn nothing (the call runs
        in the background), and the run learns at its start whether the endpoint answers at all."""
        return not self.asked and not self.capped

    # -- proposing ------------------------------------------------------------------------------
    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        ready = [f for f in self.pending if f.done()]
        self.pending = [f for f in self.pending if not f.done()]
        out = [p for f in ready for p in ([f.result()] if f.result() else [])]
        if not self.capped and len(self.pending) < self.concurrency:
            job = self._next_request(board)
            if job is not None:
                self.asked = True
                self.pending.append(self.pool.submit(self._call, *job))
        return out[:max(n, len(out))]

    def _next_request(self, board: Board):
        """(messages, parent id, parent source, operator, problem, generation) or None."""
        p = board.problem
        backend = get_backend(p.backend)  # its language record: the system prompt, its target, the ABI
        system = render_prompt(backend.language.system_prompt, **backend.target(), symbol=p.entry,
                               signature=backend.signature(p))
        failed = self._to_repair(board)
        if failed is not None and self.store is not None:
            cand = self.store.candidate(failed.candidate_id)
            self.repaired.add(failed.candidate_id)
            user = render_prompt("repair.md.j2", problem=p, reference_source=self._reference(p),
                                 outcome=failed.outcome, source=self._clip(cand.source),
                                 detail=failed.detail[:800 if self.compact else 3000])
            return ([{"role": "system", "content": system}, {"role": "user", "content": user}],
                    failed, cand.source, "repair", p)
        parent = board.champion or next(iter(board.elites(1)), None)
        parent_src = None
        if parent is not None and self.store is not None:
            cand = self.store.candidate(parent.candidate_id)
            parent_src = cand.source if cand else None
        if parent_src is None and p.template is not None:
            parent_src, parent = p.render(), None
        user = render_prompt("rewrite.md.j2", problem=p, reference_source=self._reference(p),
                             workload=self._workload(board, parent), champion=board.champion,
                             lessons=board.lessons[:2 if self.compact else 8],
                             parent_source=self._clip(parent_src) if parent_src else "/* none yet */",
                             parent_outcome=parent.outcome if parent else "template default",
                             parent_speedup=f"{parent.speedup:.2f}" if parent and parent.speedup else None,
                             parent_detail=parent.detail[:1500] if parent else None)
        return ([{"role": "system", "content": system}, {"role": "user", "content": user}],
                parent, parent_src, "rewrite", p)

    def _learn_context(self, error: str, messages) -> None:
        """From "prompt (N tokens) ... context length ... (C tokens)": the endpoint's context and
        this tokenizer's characters per token, to size later requests."""
        ctx = re.search(r"context length[^(\d]*\(?(\d+)", error)
        prompt = re.search(r"prompt \((\d+) tokens", error)
        if ctx:
            self.context_tokens = int(ctx.group(1))
        if prompt and int(prompt.group(1)) > 0:
            self.chars_per_token = sum(len(m["content"]) for m in messages) / int(prompt.group(1))

    def _max_tokens(self, messages) -> int:
        """Within a known context: what the prompt leaves, with a margin."""
        if not self.context_tokens:
            return self.max_tokens
        prompt = sum(len(m["content"]) for m in messages) / self.chars_per_token * 1.1 + 32
        return max(64, min(self.max_tokens, int(self.context_tokens - prompt)))

    def _reference(self, problem) -> str:
        return f"# {problem.description}" if self.compact else reference_source(problem)

    def _clip(self, source: str) -> str:
        limit = 1800 if self.compact else 20000
        return source if len(source) <= limit else source[:limit] + "\n/* ... truncated ... */\n"

    def _to_repair(self, board: Board) -> Entry | None:
        for e in reversed(board.entries):
            if (e.agent == self.name and e.outcome in REPAIRABLE and e.candidate_id not in self.repaired
                    and e.candidate_id not in self.repairs):
                return e
        return None

    def _workload(self, board: Board, parent: Entry | None = None) -> list[dict]:
        """The timed shapes with bytes and flops, and where the store has them the champion's,
        the baseline's and (when it is not the champion) the parent's microseconds per call."""
        p = board.problem
        champ = self._timings(board.champion.candidate_id if board.champion else None)
        apart = parent is not None and (board.champion is None or parent.candidate_id != board.champion.candidate_id)
        mine = self._timings(parent.candidate_id if apart else None)
        rows = []
        for shape in p.workload:
            rl = p.roofline(shape) if p.roofline else None
            key = json.dumps(dict(shape), sort_keys=True)
            c, m = champ.get(key, {}), mine.get(key, {})
            rows.append({"label": p.shape_label(shape), "bytes": int(rl.bytes) if rl else "?",
                         "flops": int(rl.flops) if rl else "?", "champion_us": _us(c.get("candidate_us")),
                         "baseline_us": _us(c.get("baseline_us") or m.get("baseline_us")),
                         "parent_us": _us(m.get("candidate_us"))})
        return rows

    def _timings(self, candidate_id: str | None) -> dict[str, dict]:
        """Per-shape timings of a candidate's latest correct evaluation on this hardware."""
        if self.store is None or not candidate_id:
            return {}
        for ev in reversed(self.store.evaluations(candidate_id=candidate_id, this_hardware=True)):
            if ev.outcome in MEASURED and ev.shapes:
                return {json.dumps(dict(s["shape"]), sort_keys=True): s for s in ev.shapes}
        return {}

    # -- in the background ---------------------------------------------------------------------------
    def _call(self, messages, parent: Entry | None, parent_src: str | None, operator: str, problem) -> Proposal | None:
        """One request; sent again at once (after a short pause) while nothing listens at the
        endpoint, until it answers or the agent stops: a dead endpoint is found in about a second,
        however rarely the agent is asked."""
        while True:
            proposal, status = self._attempt(messages, parent, parent_src, operator, problem)
            if status != "unreachable" or self.capped:
                return proposal

    def _attempt(self, messages, parent: Entry | None, parent_src: str | None, operator: str,
                 problem) -> tuple[Proposal | None, str]:
        status, raw, proposal, usage = "ok", None, None, {}
        if self.failures:
            time.sleep(UNREACHABLE_PAUSE_S * self.failures if self.last_kind == "unreachable"
                       else min(BACKOFF_CAP_S, 0.5 * 2 ** self.failures))
        switched = False
        try:
            text, usage = self.client.chat(messages, self._max_tokens(messages), self.temperature)
            try:
                source, how = extract_source(text, parent_src, problem.entry, problem.backend)
                gen = (parent.generation + 1) if parent else 0
                if operator == "repair":
                    self.repairs.add(content_hash(source, problem.backend))
                proposal = Proposal(source, self.name, f"{operator}-{how}", None,
                                    [parent.candidate_id] if parent else [], gen)
            except EditError as exc:
                status, raw = exc.kind, text
                usage = {**usage, "error": str(exc)}
        except CostCapReached as exc:
            self.capped = True
            status, usage = "cost_cap", {"error": str(exc)}
        except LLMError as exc:
            status, usage = exc.kind, {"error": str(exc)}
            if exc.kind == "context_overflow":
                self._learn_context(str(exc), messages)
            if exc.kind == "context_overflow" and not self.compact:
                self.compact = switched = True  # from now on: no reference source, a shorter parent
                usage["error"] += " (switching to compact prompts)"
        except Exception as exc:  # never let a model call take the run down
            status, usage = "error", {"error": f"{type(exc).__name__}: {exc}"}
        stopping = False
        if status in ("ok", "empty", "parse_error", "apply_error"):  # the endpoint answered
            self.failures, self.last_kind = 0, None
        elif status != "cost_cap" and not switched:
            self.failures += 1
            self.last_kind = status
            if self.failures >= MAX_FAILURES and self.stopped is None:
                stopping, self.capped = True, True
                self.stopped = (f"LLM agent {self._where()} stopped after {self.failures} failed calls in a row: "
                                f"{status}: {usage.get('error', '')}")
        self._record(problem.name, operator, status, raw, usage, parent)
        if stopping:
            self._record(problem.name, operator, "stopped", None, {"error": self.stopped}, parent)
        return proposal, status

    def _where(self) -> str:
        """The agent and, where its name does not say it, its endpoint's URL (no password)."""
        ep = self.client.endpoint
        return redact(self.name if redact(ep.base_url) in ep.label else f"{self.name} ({ep.base_url})")

    def _record(self, problem: str, operator: str, status: str, raw: str | None, usage: dict,
                parent: Entry | None) -> None:
        if self.store is None:
            return
        self.store.record_llm_call({
            "run_id": self.run_id, "agent": self.name, "endpoint": self.client.endpoint.public(),
            "model": self.client.endpoint.model, "problem": problem, "operator": operator,
            "status": status, "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0), "cost_usd": usage.get("cost_usd", 0.0),
            "seconds": usage.get("seconds", 0.0), "error": usage.get("error"),
            "raw": (raw or "")[:20000] or None, "parent": parent.candidate_id if parent else None})

    def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop asking; a call still in flight gets ``grace_s`` to finish and record itself (a
        refused endpoint's last retries take a fraction of a second), so the run's summary says
        what its calls did; one that takes longer (a model still generating) is abandoned."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + grace_s
        for f in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                f.exception(timeout=left)
            except Exception:  # noqa: BLE001 - cancelled or timed out: abandoned
                pass
