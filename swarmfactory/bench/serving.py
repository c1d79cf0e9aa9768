"""Load generator for any OpenAI-compatible server (like ``vllm bench serve``).

Fixed input and output lengths (prompts are seeded random token ids sent to /v1/completions,
``ignore_eos`` so every request produces exactly ``output_len`` tokens), streaming on, warmup
requests first, then one closed-loop run per concurrency level. Reports output tok/s,
request/s, TTFT, TPOT = (E2E - TTFT) / (out - 1) and ITL (median and p99) and errors.
Prefix caching is neutralised: every prompt is distinct random tokens.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field

import httpx


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0  # seconds to the first generated text
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between streamed chunks after the first
    output_tokens: int = 0
    error: str = ""


@dataclass
class LevelResult:
    concurrency: int
    num_prompts: int
    completed: int
    errors: int
    duration_s: float
    output_tok_s: float
    request_s: float
    ttft_ms_median: float
    ttft_ms_p99: float
    tpot_ms_median: float
    tpot_ms_p99: float
    itl_ms_median: float
    itl_ms_p99: float
    output_tokens: int
    error_samples: list[str] = field(default_factory=list)


def make_prompts(n: int, input_len: int, seed: int, vocab_lo: int = 100, vocab_hi: int = 10000) -> list[list[int]]:
    """Seeded random token-id prompts of exactly input_len tokens (same on every server)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_lo, vocab_hi) for _ in range(input_len)] for _ in range(n)]


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one_request(client: httpx.AsyncClient, url: str, model: str | None, prompt: list[int], output_len: int,
                      headers: dict) -> RequestResult:
    body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "cache_prompt": False}
    if model:
        body["model"] = model
    r = RequestResult(ok=False)
    chunks = 0
    usage_tokens = None
    t0 = time.perf_counter()
    last = t0
    try:
        async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                r.error = f"HTTP {resp.status_code}: {text[:200]}"
                return r
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if "error" in msg:
                    r.error = str(msg["error"])[:200]
                    return r
                if msg.get("usage"):
                    usage_tokens = msg["usage"].get("completion_tokens")
                choices = msg.get("choices") or []
                if choices and choices[0].get("text"):
                    now = time.perf_counter()
                    if chunks == 0:
                        r.ttft = now - t0
                    else:
                        r.itl.append(now - last)
                    last = now
                    chunks += 1
        r.e2e = time.perf_counter() - t0
        r.output_tokens = usage_tokens if usage_tokens is not None else chunks
        r.ok = chunks > 0
        if not r.ok:
            r.error = "no tokens streamed"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        r.error = f"{type(e).__name__}: {e}"[:200]
    return r


async def run_level(url: str, prompts: list[list[int]], output_len: int, concurrency: int, model: str | None = None,
                    api_key: str | None = None, timeout: float = 600.0) -> LevelResult:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    results: list[RequestResult] = []
    queue = list(prompts)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        async def worker():
            while queue:
                p = queue.pop()
                results.append(await one_request(client, url, model, p, output_len, headers))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        dur = time.perf_counter() - t0
    ok = [r for r in results if r.ok]
    ttft = [r.ttft * 1e3 for r in ok]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) * 1e3 for r in ok if r.output_tokens > 1]
    itl = [x * 1e3 for r in ok for x in r.itl]
    out = sum(r.output_tokens for r in ok)
    return LevelResult(
        concurrency=concurrency, num_prompts=len(prompts), completed=len(ok), errors=len(results) - len(ok),
        duration_s=dur, output_tok_s=out / dur, request_s=len(ok) / dur,
        ttft_ms_median=_pct(ttft, 0.5), ttft_ms_p99=_pct(ttft, 0.99),
        tpot_ms_median=_pct(tpot, 0.5), tpot_ms_p99=_pct(tpot, 0.99),
        itl_ms_median=_pct(itl, 0.5), itl_ms_p99=_pct(itl, 0.99), output_tokens=out,
        error_samples=sorted({r.error for r in results if not r.ok})[:3],
    )


async def _detect_model(url: str, api_key: str | None) -> str | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.get(url + "/v1/models", headers=headers)
            data = r.json().get("data") or []
            return data[0]["id"] if data else None
    except (httpx.HTTPError, ValueError, KeyError):
        return None


async def bench(url: str, concurrencies: list[int], input_len: int = 128, output_len: int = 128,
                num_prompts: int = 64, seed: int = 0, warmup: int = 2, model: str | None = None,
                api_key: str | None = None, on_level=None) -> dict:
    """Warm up, then one run per concurrency level; returns a JSON-able dict."""
    url = url.rstrip("/")
    model = model or await _detect_model(url, api_key)
    if warmup:
        await run_level(url, make_prompts(warmup, input_len, seed + 10_000), output_len, min(warmup, 4), model, api_key)
    levels = []
    for i, c in enumerate(concurrencies):
        # seeded: the same prompts on every server; distinct per level so no server can
        # answer a level from a prompt cache filled by the previous one
        prompts = make_prompts(num_prompts, input_len, seed + 1 + i)
        res = await run_level(url, prompts, output_len, c, model, api_key)
        levels.append(res)
        if on_level:
            on_level(res)
    return {"url": url, "model": model, "input_len": input_len, "output_len": output_len,
            "num_prompts": num_prompts, "seed": seed, "warmup": warmup, "levels": [asdict(x) for x in levels]}


def bench_sync(url: str, concurrencies: list[int], **kw) -> dict:
    return asyncio.run(bench(url, concurrencies, **kw))
