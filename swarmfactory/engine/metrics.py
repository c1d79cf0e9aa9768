"""What the server exposes for operations: Prometheus series on ``/metrics`` and an access log.

The series are vLLM's core ones under the ``swarmfactory:`` prefix (a vLLM dashboard works with
``vllm:`` replaced), each labelled with the served model:

| series | type | what |
| --- | --- | --- |
| `swarmfactory:num_requests_running` | gauge | sequences in the running batch |
| `swarmfactory:num_requests_waiting` | gauge | requests queued for a KV slot |
| `swarmfactory:kv_cache_usage_perc` | gauge | share of KV slots in use (0-1) |
| `swarmfactory:prompt_tokens_total` | counter | prompt tokens of finished requests |
| `swarmfactory:generation_tokens_total` | counter | generated tokens of finished requests |
| `swarmfactory:request_success_total` | counter | finished requests, by `finished_reason` |
| `swarmfactory:time_to_first_token_seconds` | histogram | arrival to first token |
| `swarmfactory:time_per_output_token_seconds` | histogram | (last - first token) / (tokens - 1), per request |
| `swarmfactory:e2e_request_latency_seconds` | histogram | arrival to last token |

Each registry belongs to one app (``prometheus_client.CollectorRegistry``), so several servers
in one process do not mix their figures. The access log is one line per HTTP request on the
``swarmfactory.engine.access`` logger (stderr when the server runs from the command line).
"""

from __future__ import annotations

import logging
import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (the /metrics content type)
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

ACCESS = logging.getLogger("swarmfactory.engine.access")

# vLLM's buckets (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)


class Metrics:
    """The series of one served model; ``request()`` follows one request's events."""

    def __init__(self, engine, model_id: str):
        self.registry = reg = CollectorRegistry()
        label = {"model_name": model_id}
        p = "swarmfactory:"

        def gauge(name: str, doc: str, fn) -> None:
            Gauge(p + name, doc, ["model_name"], registry=reg).labels(**label).set_function(fn)

        gauge("num_requests_running", "Requests in the running batch.", lambda: engine.num_running)
        gauge("num_requests_waiting", "Requests waiting for a KV slot.", lambda: engine.num_waiting)
        gauge("kv_cache_usage_perc", "Share of KV cache slots in use (1 = all).",
              lambda: 1.0 - engine.kv.free_slots / max(1, engine.config.max_batch))
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests.", ["model_name"],
                                     registry=reg).labels(**label)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens of finished requests.",
                                         ["model_name"], registry=reg).labels(**label)
        self._success = Counter(p + "request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=reg)
        self._model = model_id
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first token.", ["model_name"],
                              buckets=TTFT_BUCKETS, registry=reg).labels(**label)
        self.tpot = Histogram(p + "time_per_output_token_seconds", "Mean time between output tokens.",
                              ["model_name"], buckets=TPOT_BUCKETS, registry=reg).labels(**label)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Arrival to last token.", ["model_name"],
                             buckets=E2E_BUCKETS, registry=reg).labels(**label)

    def request(self) -> RequestTimer:
        return RequestTimer(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Arrival, first and last token of one request; ``finish`` records them once."""

    def __init__(self, metrics: Metrics):
        self.m = metrics
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.done = False

    def event(self, ev) -> None:
        if ev.token is not None:
            now = time.perf_counter()
            self.first = self.first or now
            self.last = now
        if ev.finished:
            self.finish(ev)

    def finish(self, ev) -> None:
        if self.done or ev.finish_reason in (None, "abort", "error"):
            return
        self.done = True
        m = self.m
        m.prompt_tokens.inc(ev.prompt_tokens)
        m.generation_tokens.inc(ev.completion_tokens)
        m._success.labels(model_name=m._model, finished_reason=ev.finish_reason).inc()
        end = self.last or time.perf_counter()
        if self.first is not None:
            m.ttft.observe(self.first - self.start)
            if ev.completion_tokens > 1:
                m.tpot.observe((end - self.first) / (ev.completion_tokens - 1))
        m.e2e.observe(end - self.start)


class AccessLog:
    """A pure ASGI middleware (Starlette's BaseHTTPMiddleware would hide client disconnects from
    the endpoints, and disconnects free KV slots): one line per request, when its response ends:
    client, method, path, status, response bytes and seconds."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status, size = time.perf_counter(), 0, 0

        async def tap(message):
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, tap)
        finally:
            client = scope.get("client") or ("-", 0)
            ACCESS.info('%s "%s %s" %s %d %.3fs', client[0], scope.get("method"), scope.get("path"),
                        status or "-", size, time.perf_counter() - t0)
