"""Load generator for any OpenAI-compatible server (like ``vllm bench serve``).

Fixed output lengths (``ignore_eos``, so every request produces exactly ``output_len`` tokens)
and prompts of ``input_len`` tokens: seeded random token ids (``dataset="random"``), or seeded
windows of the bundled English text (``"text"``, about ``input_len`` tokens: the server's usage
counts them), sent to /v1/completions, streaming on, warm-up requests first. Per concurrency
level, the requests go all at once (a closed loop: at most ``concurrency`` in flight) or, with
``request_rate``, arrive as a seeded Poisson process of that many requests/s (still at most
``concurrency`` in flight). Reports output tok/s, request/s, TTFT, TPOT = (E2E - TTFT) / (out -
1), ITL and E2E latency (p50, p90, p99; the median and p99 fields stay for older readers),
errors, and with an SLO (``parse_slo``: TTFT, TPOT, E2E limits in ms) the goodput: requests/s
that met every limit. Prefix caching is neutralised: every prompt is distinct.

Contention (``swarmfactory/contention.py``): every level records what else ran on the machine
while it was measured, in its ``contention`` dict. The criterion is ``others``: the share of the
CPUs' time (the CPUs the server and this load generator may run on) used by processes that are
not ours; ours are the server's process and its descendants (found by the port it listens on,
or given) and this process. Machine-wide CPU pressure (``suffered``) is recorded too, but is not
the criterion: under load the engine's own threads wait for each other. A level on which others
took more than ``contention.BUSY`` is *disturbed*: after waiting (at most ``QUIET_WAIT_S``) for
others to drop under ``contention.QUIET``, it is measured again with fresh prompts, at most
``LEVEL_REPEATS`` more times; the least disturbed attempt is kept, marked ``busy`` when even
that one was disturbed, and the result's ``warnings`` say so in one line. The wait watches
``others`` rather than the machine's pressure: one other process holding a whole CPU leaves
the pressure low while it takes half of a two-CPU machine.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import os
import random
import socket
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from swarmfactory import contention as C

LEVEL_REPEATS = 2       # a disturbed level is measured again at most this many times
QUIET_WAIT_S = 5.0      # ... after waiting at most this long for the machine to quiet down
REPEAT_SEED = 1_000_003  # a repeat's prompts: the level's seed + this x the attempt (fresh prompts)


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0  # seconds to the first generated text
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between streamed chunks after the first
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""

    @property
    def tpot_ms(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1) in ms; None with fewer than two tokens."""
        return (self.e2e - self.ttft) / (self.output_tokens - 1) * 1e3 if self.output_tokens > 1 else None


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
    contention: dict | None = None  # what else ran while it was measured (see the module docstring)
    request_rate: float | None = None  # Poisson arrivals at this many requests/s (None: all at once)
    prompt_tokens_mean: float = 0.0  # as the server counted them (usage)
    # {"ttft_ms": {"p50": ..., "p90": ..., "p99": ...}, "tpot_ms": ..., "itl_ms": ..., "e2el_ms": ...}
    percentiles: dict = field(default_factory=dict)
    goodput: dict | None = None  # {"slo": {"ttft_ms": 500, ...}, "request_s": ..., "share": ...}


# -- contention: whose CPU time is ours, one level's attempts ----------------------------------------
def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            try:
                if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f[9])
            except (ValueError, IndexError):
                continue
    return inodes


def listening_pids(port: int) -> list[int]:
    """The processes (that we may look into) holding a socket listening on ``port`` here."""
    want = {f"socket:[{i}]" for i in _listening_inodes(port)}
    if not want:
        return []
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{d}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{d}/fd/{fd}") in want:
                    pids.append(int(d))
                    break
            except OSError:
                continue
    return pids


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children, ... (from /proc/PID/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except (OSError, ValueError):
                continue
            for k in kids:
                if k not in out:
                    out.append(k)
                    todo.append(k)
    return out


def _is_local(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    for fam, _, _, _, addr in infos:
        try:
            ip = ipaddress.ip_address(addr[0].split("%")[0])
        except ValueError:
            continue
        if ip.is_loopback or ip.is_unspecified:
            return True
        try:
            with socket.socket(fam, socket.SOCK_DGRAM) as s:
                s.bind((addr[0], 0))  # binds only to one of this machine's addresses
            return True
        except OSError:
            continue
    return False


def server_pids(url: str) -> list[int] | None:
    """The processes serving ``url`` on this machine: [] where the server runs elsewhere (its CPU
    time is not here), None where it runs here but no process we can look into listens on its
    port (its CPU time cannot be told from other work)."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not _is_local(host):
        return []
    return listening_pids(port) or None


class ServingMeter:
    """Contention readings over a serving level: ``contention.Meter`` on the CPUs the server and
    this process may run on, ours being this process, the server's processes and their
    descendants. ``servers`` None: the server is here but unknown (``others`` is not read)."""

    def __init__(self, servers: list[int] | None):
        self.known = servers is not None
        self.servers = list(servers or [])
        cpus = set(os.sched_getaffinity(0))
        for p in self.servers:
            try:
                cpus |= os.sched_getaffinity(p)
            except OSError:
                pass
        self.meter = C.Meter(sorted(cpus), ours=self.ours)

    @classmethod
    def for_url(cls, url: str, server_pid: int | None = None) -> ServingMeter:
        return cls([server_pid] if server_pid is not None else server_pids(url))

    def ours(self) -> list[int]:
        pids = {os.getpid()}
        for p in self.servers:
            pids.add(p)
            pids.update(descendants(p))
        return sorted(pids)

    def snapshot(self) -> C.Snapshot:
        return self.meter.snapshot()

    def between(self, a: C.Snapshot, b: C.Snapshot) -> C.Reading:
        r = self.meter.between(a, b)
        if not self.known:
            r = C.Reading(r.seconds, r.suffered, None, r.steal, r.mhz, r.sources)
        return r

    def wait_for_quiet(self, max_s: float, level: float = C.QUIET, window_s: float = 0.5) -> tuple[bool, float]:
        """Wait (at most ``max_s``) for a ``window_s`` window in which others took under ``level``
        of the CPUs (the criterion a level is judged by; machine-wide pressure can be low while
        another process holds a whole CPU). Returns (quiet, seconds waited)."""
        if not self.known:
            return C.wait_for_quiet(max_s)
        t0 = time.monotonic()
        while True:
            a = self.snapshot()
            time.sleep(window_s)
            r = self.between(a, self.snapshot())
            if r.others is not None and r.others < level:
                return True, time.monotonic() - t0
            if time.monotonic() - t0 + window_s > max_s:
                return False, time.monotonic() - t0


MIN_READING_S = 0.25  # a shorter window's share is a few clock ticks: no reading of others at all


def disturbed(reading: C.Reading) -> bool:
    """Other processes took more than ``contention.BUSY`` of the CPUs (unknown, or a window too
    short to tell, ``MIN_READING_S``: not disturbed)."""
    return reading.others is not None and reading.seconds >= MIN_READING_S and reading.others > C.BUSY


def _r(x, digits: int = 4):
    return None if x is None else round(x, digits)


class LevelAttempts:
    """One level's attempts: iterate for the attempt numbers (0, 1, ...), report each attempt's
    result with ``done``; a disturbed attempt is followed by another (after waiting for quiet)
    while repeats and time (``deadline``, time.monotonic) are left. ``result()``: the least
    disturbed attempt's result and its ``contention`` dict."""

    def __init__(self, meter: ServingMeter, repeats: int | None = None, wait_s: float | None = None,
                 deadline: float | None = None):
        self.meter, self.deadline = meter, deadline
        self.repeats = LEVEL_REPEATS if repeats is None else repeats
        self.wait_s = QUIET_WAIT_S if wait_s is None else wait_s
        self.tried = 0
        self.waited = 0.0
        self.best: tuple | None = None  # (others, result, reading)
        self._a: C.Snapshot | None = None
        self._t0 = 0.0
        self._last: C.Reading | None = None

    def __iter__(self):
        while True:
            if self.tried:
                if not disturbed(self._last) or self.tried > self.repeats:
                    return
                last_s = time.monotonic() - self._t0
                if self.deadline is not None and time.monotonic() + last_s + self.wait_s > self.deadline:
                    return  # another attempt does not fit in the time left
                if self.wait_s > 0:
                    _, waited = self.meter.wait_for_quiet(self.wait_s)
                    self.waited += waited
            self._t0 = time.monotonic()
            self._a = self.meter.snapshot()
            self.tried += 1
            yield self.tried - 1

    def done(self, result) -> None:
        self._last = self.meter.between(self._a, self.meter.snapshot())
        others = self._last.others if self._last.others is not None else 0.0
        if self.best is None or others < self.best[0]:
            self.best = (others, result, self._last)

    def failed(self, exc: BaseException) -> None:
        """An attempt that raised: the exception carries the contention it ran under."""
        r = self.meter.between(self._a, self.meter.snapshot())
        try:
            exc.contention = self._dict(r)
        except AttributeError:
            pass

    def _dict(self, r: C.Reading) -> dict:
        return {"others": _r(r.others) if r.seconds >= MIN_READING_S else None, "suffered": _r(r.suffered), "steal": _r(r.steal), "mhz": _r(r.mhz, 1),
                "attempts": self.tried, "busy": disturbed(r), "waited_s": round(self.waited, 1)}

    def result(self):
        _, res, r = self.best
        c = self._dict(r)
        if isinstance(res, LevelResult):
            res.contention = c
        elif isinstance(res, dict):
            res["contention"] = c
        return res, c


def measure_level(run, meter: ServingMeter, repeats: int | None = None, wait_s: float | None = None,
                  deadline: float | None = None, keep_on: tuple = ()):
    """``measure_level_async`` for a plain function ``run(attempt)`` (called outside any event loop)."""
    async def arun(attempt: int):
        return run(attempt)
    return asyncio.run(measure_level_async(arun, meter, repeats, wait_s, deadline, keep_on))


async def measure_level_async(run, meter: ServingMeter, repeats: int | None = None, wait_s: float | None = None,
                              deadline: float | None = None, keep_on: tuple = ()):
    """``await run(attempt)`` (one measurement of the level: a LevelResult or a level dict) with
    its contention, measured again while disturbed (``LevelAttempts``). An exception of a type in
    ``keep_on`` on a repeat ends the repeats and keeps what was measured; any other exception, or
    one on the first attempt, propagates with the contention it ran under (``.contention``).
    ``repeats``, ``wait_s``: default ``LEVEL_REPEATS``, ``QUIET_WAIT_S``. Returns (result,
    contention dict); the result carries the dict too."""
    attempts = LevelAttempts(meter, repeats, wait_s, deadline)
    for attempt in attempts:
        try:
            res = await run(attempt)
        except BaseException as e:
            if attempts.best is not None and isinstance(e, keep_on):
                break
            attempts.failed(e)
            raise
        attempts.done(res)
    return attempts.result()


def worst_contention(levels) -> dict | None:
    """What a set of levels (dicts) was measured under, for a verdict's evidence: the worst
    level's ``others`` (as ``suffered`` too: the serving criterion, read by
    ``evidence/quality.py``), the worst machine-wide pressure, and ``busy`` when any level stayed
    busy. None when no level recorded contention."""
    cs = [(lv.get("concurrency"), lv["contention"]) for lv in levels if isinstance(lv.get("contention"), dict)]
    if not cs:
        return None
    others = [c["others"] for _, c in cs if c.get("others") is not None]
    psi = [c["suffered"] for _, c in cs if c.get("suffered") is not None]
    worst = max(others) if others else None
    return {"suffered": worst, "others": worst, "psi": max(psi) if psi else None,
            "busy": any(c.get("busy") for _, c in cs), "criterion": "others",
            "busy_levels": [lvl for lvl, c in cs if c.get("busy")], "levels": len(cs),
            "attempts": sum(c.get("attempts") or 1 for _, c in cs)}


def busy_warning(levels, what: str = "") -> str | None:
    """One line naming the levels (dicts) that stayed busy after their repeats, or None."""
    busy = [lv for lv in levels if isinstance(lv.get("contention"), dict) and lv["contention"].get("busy")]
    if not busy:
        return None
    shares = ", ".join(f"c={lv['concurrency']} {lv['contention']['others']:.0%}" for lv in busy)
    return (f"{what + ': ' if what else ''}the machine stayed busy at {len(busy)} level(s) after "
            f"{max(lv['contention']['attempts'] for lv in busy)} attempt(s): other processes took more than "
            f"{C.BUSY:.0%} of the CPUs ({shares}); those figures are not reliable")


def random_prompts(vocab: int | None):
    """``make_prompts`` with ids within a vocabulary of ``vocab`` tokens (None: unknown, the
    default range): a small model's may hold fewer than 10000."""
    hi = min(10000, vocab) if vocab else 10000
    return functools.partial(make_prompts, vocab_lo=min(100, hi // 2), vocab_hi=hi)


def _served(data, model: str | None = None) -> tuple[str | None, int | None]:
    """From /v1/models' ``data``: the id of the model asked for (``model``, else the first entry)
    and the vocabulary size its entry states (ours, and servers that add it), else None."""
    entries = [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []
    entry = next((d for d in entries if d.get("id") == model), None) if model else (entries[0] if entries else None)
    vocab = (entry or {}).get("vocab_size")
    return model or (entry or {}).get("id"), (vocab if isinstance(vocab, int) and vocab > 1 else None)


def served_vocab(url: str, timeout: float = 10) -> int | None:
    """The vocabulary size the server at ``url`` states in /v1/models (ours does), or None."""
    try:
        data = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return _served(data)[1]


def make_prompts(n: int, input_len: int, seed: int, vocab_lo: int = 100, vocab_hi: int = 10000) -> list[list[int]]:
    """Seeded random token-id prompts of exactly input_len tokens (same on every server)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_lo, vocab_hi) for _ in range(input_len)] for _ in range(n)]


WORDS_PER_TOKEN = 0.75  # English prose in a BPE vocabulary: about 3 words to 4 tokens


def text_prompts(n: int, input_len: int, seed: int) -> list[str]:
    """Seeded windows of the bundled English text (the engine's perplexity text), about
    ``input_len`` tokens each (``WORDS_PER_TOKEN``; the server's usage counts the real number):
    prompts a model reads as language, as a dataset of real prompts is, on any server."""
    from importlib.resources import files

    words = files("swarmfactory.engine").joinpath("data/ppl_text.txt").read_text().split()
    want = max(1, round(input_len * WORDS_PER_TOKEN))
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.randrange(len(words))
        out.append(" ".join(words[(start + k) % len(words)] for k in range(want)))
    return out


def arrivals(n: int, rate: float | None, seed: int) -> list[float]:
    """Seconds from the start at which each of ``n`` requests is sent: a Poisson process of
    ``rate`` requests/s (exponential gaps, seeded), or all at once when ``rate`` is None."""
    if rate is None or rate == float("inf"):
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"request rate must be positive, got {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


PERCENTILES = (50, 90, 99)
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


def parse_slo(items: list[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` (milliseconds, as ``vllm bench serve --goodput``) ->
    ``{"ttft_ms": 500.0, "tpot_ms": 50.0}``; ValueError naming a bad item."""
    out = {}
    for item in items:
        key, _, val = item.partition(":")
        name = key.strip().lower() + "_ms"
        try:
            ms = float(val)
        except ValueError:
            ms = -1.0
        if name not in SLO_KEYS or ms <= 0:
            raise ValueError(f"bad SLO {item!r}: use ttft:MS, tpot:MS or e2el:MS with MS > 0")
        out[name] = ms
    return out


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one_request(client: httpx.AsyncClient, url: str, model: str | None, prompt: list[int] | str,
                      output_len: int, headers: dict) -> RequestResult:
    body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "cache_prompt": False}  # llama-server: no prompt cache
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
                    r.prompt_tokens = int(msg["usage"].get("prompt_tokens") or 0)
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


async def run_level(url: str, prompts: list, output_len: int, concurrency: int, model: str | None = None,
                    api_key: str | None = None, timeout: float = 600.0, request_rate: float | None = None,
                    seed: int = 0, slo: dict | None = None) -> LevelResult:
    """Send ``prompts`` (token-id lists or text) with at most ``concurrency`` in flight: all at
    once (a closed loop), or arriving as a Poisson process of ``request_rate`` requests/s."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    results: list[RequestResult] = []
    gate = asyncio.Semaphore(concurrency)
    times = arrivals(len(prompts), request_rate, seed)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()

        async def send(p, at: float):
            wait = at - (time.perf_counter() - t0)
            if wait > 0:
                await asyncio.sleep(wait)
            async with gate:
                results.append(await one_request(client, url, model, p, output_len, headers))

        await asyncio.gather(*(send(p, at) for p, at in zip(prompts, times)))
        dur = time.perf_counter() - t0
    return summarise(results, len(prompts), concurrency, dur, request_rate, slo)


def summarise(results: list[RequestResult], num_prompts: int, concurrency: int, dur: float,
              request_rate: float | None = None, slo: dict | None = None) -> LevelResult:
    ok = [r for r in results if r.ok]
    per = {"ttft_ms": [r.ttft * 1e3 for r in ok],
           "tpot_ms": [r.tpot_ms for r in ok if r.tpot_ms is not None],
           "itl_ms": [x * 1e3 for r in ok for x in r.itl],
           "e2el_ms": [r.e2e * 1e3 for r in ok]}
    ttft, tpot, itl = per["ttft_ms"], per["tpot_ms"], per["itl_ms"]
    out = sum(r.output_tokens for r in ok)
    good = None
    if slo:
        def meets(r: RequestResult) -> bool:
            v = {"ttft_ms": r.ttft * 1e3, "e2el_ms": r.e2e * 1e3,
                 "tpot_ms": r.tpot_ms or 0.0}
            return all(v[k] <= lim for k, lim in slo.items())

        n_good = sum(1 for r in ok if meets(r))
        good = {"slo": dict(slo), "request_s": n_good / dur, "share": n_good / max(1, num_prompts)}
    return LevelResult(
        concurrency=concurrency, num_prompts=num_prompts, completed=len(ok), errors=len(results) - len(ok),
        duration_s=dur, output_tok_s=out / dur, request_s=len(ok) / dur,
        ttft_ms_median=_pct(ttft, 0.5), ttft_ms_p99=_pct(ttft, 0.99),
        tpot_ms_median=_pct(tpot, 0.5), tpot_ms_p99=_pct(tpot, 0.99),
        itl_ms_median=_pct(itl, 0.5), itl_ms_p99=_pct(itl, 0.99), output_tokens=out,
        error_samples=sorted({r.error for r in results if not r.ok})[:3],
        request_rate=request_rate,
        prompt_tokens_mean=(sum(r.prompt_tokens for r in ok) / len(ok)) if ok else 0.0,
        percentiles={k: {f"p{q}": _pct(v, q / 100) for q in PERCENTILES} for k, v in per.items()},
        goodput=good,
    )


async def _detect_model(url: str, api_key: str | None, model: str | None = None) -> tuple[str | None, int | None]:
    """The served model's id (``model``, else the first of /v1/models) and its vocabulary size
    where the server says it (ours and vLLM-style servers that add it), else None."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.get(url + "/v1/models", headers=headers)
            data = r.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return model, None
    return _served(data, model)


async def bench(url: str, concurrencies: list[int], input_len: int = 128, output_len: int = 128,
                num_prompts: int = 64, seed: int = 0, warmup: int = 2, model: str | None = None,
                api_key: str | None = None, on_level=None, server_pid: int | None = None,
                repeats: int | None = None, quiet_wait_s: float | None = None, request_rate: float | None = None,
                dataset: str = "random", slo: dict | None = None) -> dict:
    """Warm up, then one run per concurrency level (a disturbed one again, see the module
    docstring); returns a JSON-able dict. ``server_pid``: the server's process, where known
    (else it is found by the port it listens on); ``repeats``, ``quiet_wait_s``: default
    ``LEVEL_REPEATS``, ``QUIET_WAIT_S``. ``request_rate``: Poisson arrivals (requests/s) with
    the level's concurrency as the most in flight; ``dataset``: ``random`` token ids or ``text``
    (windows of the bundled English text); ``slo``: ``parse_slo``'s limits for goodput."""
    if dataset not in ("random", "text"):
        raise ValueError(f"dataset must be random or text, got {dataset!r}")
    url = url.rstrip("/")
    model, vocab = await _detect_model(url, api_key, model)
    if dataset == "text":
        make = text_prompts
    else:
        make = random_prompts(vocab)
    meter = ServingMeter.for_url(url, server_pid)
    warnings = []
    if not meter.known:
        warnings.append(f"no process of ours listens on {url}: its CPU time cannot be told from other work, "
                        "so contention (others) is not measured")
    if warmup:
        await run_level(url, make(warmup, input_len, seed + 10_000), output_len, min(warmup, 4), model, api_key)
    levels = []
    for i, c in enumerate(concurrencies):
        # seeded: the same prompts on every server; distinct per level (and per repeat) so no
        # server can answer a level from a prompt cache filled by the previous one
        def one(attempt: int, i=i, c=c):
            level_seed = seed + 1 + i + REPEAT_SEED * attempt
            return run_level(url, make(num_prompts, input_len, level_seed), output_len, c, model, api_key,
                             request_rate=request_rate, seed=level_seed, slo=slo)

        res, _ = await measure_level_async(one, meter, repeats, quiet_wait_s)
        levels.append(res)
        if on_level:
            on_level(res)
    out = [asdict(x) for x in levels]
    line = busy_warning(out)
    if line:
        warnings.append(line)
    return {"url": url, "model": model, "input_len": input_len, "output_len": output_len,
            "num_prompts": num_prompts, "seed": seed, "warmup": warmup, "request_rate": request_rate,
            "dataset": dataset, "slo": slo, "levels": out, "warnings": warnings}


def bench_sync(url: str, concurrencies: list[int], **kw) -> dict:
    return asyncio.run(bench(url, concurrencies, **kw))
