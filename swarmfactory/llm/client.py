"""A small OpenAI-compatible chat client: concurrency limit, timeouts, retries with backoff,
token and cost accounting, and a hard cost cap for paid endpoints.

The API key is read from an environment variable whose *name* is configured; the key itself is
never stored on the object's public surface, in the evidence store, in logs or in a worker's
environment.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import httpx

from swarmfactory.redact import redact

# USD per million tokens (input, output) for endpoints that charge; unknown models cost 0 unless
# the user sets a price. Local servers are free.
PRICES = {"gpt-4o": (2.5, 10.0), "gpt-4o-mini": (0.15, 0.6), "gpt-4.1": (2.0, 8.0),
          "gpt-4.1-mini": (0.4, 1.6), "o4-mini": (1.1, 4.4)}


class LLMError(Exception):
    """A call that failed for good (after retries; a refused connection at once, kind
    ``unreachable``); ``kind`` says how."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class CostCapReached(LLMError):
    def __init__(self, spent: float, cap: float):
        super().__init__("cost_cap", f"cost cap reached: ${spent:.4f} spent of ${cap:.4f}")


@dataclass
class Usage:
    calls: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0


@dataclass
class Endpoint:
    """Where to send requests. ``key_env`` names the environment variable holding the key."""

    label: str
    base_url: str
    model: str
    key_env: str | None = None
    price_in: float = 0.0       # USD per million prompt tokens
    price_out: float = 0.0      # USD per million completion tokens
    paid: bool = False
    extra: dict = field(default_factory=dict)

    def public(self) -> dict:
        """What may be recorded: never the key, only the name of its variable (nor a password in
        the URL)."""
        return {"label": redact(self.label), "base_url": redact(self.base_url), "model": self.model,
                "key_env": self.key_env, "paid": self.paid}


class ChatClient:
    def __init__(self, endpoint: Endpoint, timeout_s: float = 120.0, retries: int = 2,
                 concurrency: int = 1, cost_cap_usd: float | None = None, backoff_s: float = 1.0):
        self.endpoint, self.timeout_s, self.retries = endpoint, timeout_s, retries
        self.cost_cap_usd, self.backoff_s = cost_cap_usd, backoff_s
        self.usage = Usage()
        self._sem = threading.Semaphore(max(1, concurrency))
        self._lock = threading.Lock()
        if endpoint.paid and not self._key():
            raise LLMError("config", f"{endpoint.label}: set {endpoint.key_env} in the environment")

    def _key(self) -> str | None:
        return os.environ.get(self.endpoint.key_env) if self.endpoint.key_env else None

    def _headers(self) -> dict:
        key = self._key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def chat(self, messages: list[dict], max_tokens: int = 1024, temperature: float = 0.7,
             seed: int | None = None) -> tuple[str, dict]:
        """One completion; returns (text, usage of this call). Raises LLMError when it gives up."""
        if self.cost_cap_usd is not None and self.usage.cost_usd >= self.cost_cap_usd:
            raise CostCapReached(self.usage.cost_usd, self.cost_cap_usd)
        body = {"model": self.endpoint.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": temperature, **({"seed": seed} if seed is not None else {})}
        url = self.endpoint.base_url.rstrip("/") + "/chat/completions"
        last = None
        with self._sem:
            for attempt in range(self.retries + 1):
                t0 = time.monotonic()
                try:
                    r = httpx.post(url, json=body, headers=self._headers(), timeout=self.timeout_s)
                    if r.status_code in (429, 500, 502, 503, 504):
                        raise LLMError("http", f"HTTP {r.status_code}: {r.text[:200]}")
                    if r.status_code >= 400:  # a client error will not improve by retrying
                        self._account(0, 0, time.monotonic() - t0, failed=True)
                        kind = "context_overflow" if "context" in r.text.lower() else "http_fatal"
                        raise LLMError(kind, f"HTTP {r.status_code}: {r.text[:300]}")
                    data = r.json()
                    text = data["choices"][0]["message"].get("content") or ""
                    u = data.get("usage") or {}
                    call = self._account(int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0)),
                                         time.monotonic() - t0)
                    return text, call
                except LLMError as exc:
                    if exc.kind in ("http_fatal", "context_overflow"):
                        raise
                    last = exc
                except httpx.ConnectError as exc:  # nothing listens there: retrying at once will not help
                    self._account(0, 0, time.monotonic() - t0, failed=True)
                    raise LLMError("unreachable", f"cannot connect to {redact(url)}: {exc}") from None
                except httpx.TimeoutException:
                    last = LLMError("timeout", f"no answer within {self.timeout_s:.0f}s")
                except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                    last = LLMError("http", redact(f"{type(exc).__name__}: {exc}"))
                self._account(0, 0, time.monotonic() - t0, failed=True)
                if attempt < self.retries:
                    time.sleep(self.backoff_s * (2 ** attempt))
        raise last

    def _account(self, p: int, c: int, seconds: float, failed: bool = False) -> dict:
        cost = (p * self.endpoint.price_in + c * self.endpoint.price_out) / 1e6
        with self._lock:
            self.usage.calls += 1
            self.usage.failures += int(failed)
            self.usage.prompt_tokens += p
            self.usage.completion_tokens += c
            self.usage.cost_usd += cost
            self.usage.seconds += seconds
        return {"prompt_tokens": p, "completion_tokens": c, "cost_usd": cost, "seconds": seconds}


def served_model(base_url: str) -> str:
    """The id a local OpenAI-compatible server serves (its first ``/v1/models`` entry): the
    engine answers an unknown model with 404, as OpenAI does."""
    try:
        r = httpx.get(base_url.rstrip("/") + "/models", timeout=10)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise LLMError("config", f"{redact(base_url)}: cannot read the served model ({e})") from None


def parse_endpoint(spec: str, model: str | None = None, local_url: str | None = None) -> Endpoint:
    """``local``, ``openai:MODEL``, or a base URL (with ``model``)."""
    if spec == "local":
        if local_url is None:
            raise LLMError("config", "the local engine is not running")
        return Endpoint("local", local_url, model or served_model(local_url))
    if spec.startswith("openai:"):
        name = spec.split(":", 1)[1] or model
        if not name:
            raise LLMError("config", "openai:MODEL needs a model name")
        pin, pout = PRICES.get(name, (0.0, 0.0))
        return Endpoint(f"openai:{name}", os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
                        name, "OPENAI_API_KEY", pin, pout, paid=True)
    if spec.startswith(("http://", "https://")):
        if not model:
            raise LLMError("config", f"{redact(spec)}: give the model name with --llm-model")
        return Endpoint(redact(spec), spec, model, "SWARMFACTORY_LLM_API_KEY")  # the label names agents: no password
    raise LLMError("config", f"bad --llm {redact(spec)!r}: use local, openai:MODEL or an http(s) URL ending in /v1")
