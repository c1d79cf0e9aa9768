"""OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models, /health.

Bad requests get a 4xx with an OpenAI-style error body naming the problem; they are rejected
before they reach the engine, so they never disturb running requests. A client that goes away
(streaming or not) has its request aborted and its KV slot freed at the next engine step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .async_engine import AsyncEngine, Handle
from .engine import Engine, RequestError
from .sequence import SamplingParams

MAX_BODY_BYTES = 4 * 1024 * 1024


class _Common(BaseModel):
    # Unknown OpenAI fields (user, logit_bias...) are ignored, as OpenAI-compatible servers do.
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    ignore_eos: bool = False  # vLLM / llama.cpp extension, used by fixed-length benchmarks
    return_token_ids: bool = False  # vLLM extension: the choice carries prompt_token_ids and token_ids


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = ""


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        self.status, self.message, self.param, self.code = status, message, param, code


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


def _content_text(c) -> str:
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    parts = []
    for p in c:
        if p.get("type") != "text":
            raise ApiError(400, f"message content part of type {p.get('type')!r} is not supported", "messages")
        parts.append(str(p.get("text", "")))
    return "".join(parts)


def create_app(engine: Engine, api_key: str | None = None, driver: AsyncEngine | None = None) -> FastAPI:
    """The HTTP app. ``driver``: an AsyncEngine whose step loop the caller runs (see serve);
    without one, the app starts its own on a helper thread."""
    app = FastAPI(title="swarmfactory engine", docs_url=None, redoc_url=None)
    api = _Api(engine, api_key, driver)
    app.on_event("startup")(api.start)
    app.on_event("shutdown")(api.stop)
    app.exception_handler(ApiError)(_api_error)
    app.get("/health")(api.health)
    app.get("/v1/models")(api.models)
    app.post("/v1/chat/completions")(api.chat)
    app.post("/v1/completions")(api.completions)
    return app


async def _api_error(request: Request, e: ApiError):
    return _error(e.status, e.message, e.param, e.code)


class _Api:
    """The routes of one app over one engine: the request checks (key, size, JSON, fields), the
    handlers, and the answer, whole or streamed."""

    def __init__(self, engine: Engine, api_key: str | None, driver: AsyncEngine | None):
        self.engine, self.api_key, self.driver = engine, api_key, driver
        self.ae: AsyncEngine | None = driver  # the step loop; the app's own from startup where no driver
        self.model_id = engine.model_id
        self.created = int(time.time())

    async def start(self):
        if self.driver is None:
            self.ae = AsyncEngine(self.engine)
            self.ae.start_thread()

    async def stop(self):
        self.ae.shutdown()

    def _guard(self, request: Request) -> None:
        # A plain check, not an HTTP middleware: Starlette's BaseHTTPMiddleware hides client
        # disconnects from the endpoint, and disconnects must free KV slots.
        if self.api_key:
            auth = request.headers.get("authorization", "")
            token = auth[7:] if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                raise ApiError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')")
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")

    async def health(self):
        engine, ae = self.engine, self.ae
        ok = ae is not None and ae.alive
        body = {"status": "ok" if ok else "error", "running": engine.num_running,
                "waiting": engine.num_waiting, "free_slots": engine.kv.free_slots,
                "max_batch": engine.config.max_batch, "paths": engine.paths.as_dict(),
                "kernel_audit": engine.kernel_audit(), "memory": engine.memory_estimate()}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def models(self, request: Request):
        self._guard(request)
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "created": self.created,
                                            "owned_by": "swarmfactory", "max_model_len": self.engine.max_seq_len}]}

    async def _parse(self, request: Request, cls):
        self._guard(request)
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "request body must be a JSON object")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise ApiError(400, f"{loc}: {err['msg']}" if loc else err["msg"], loc or None) from None

    def _params(self, req: _Common, prompt_ids: list[int], max_tokens: int | None) -> SamplingParams:
        if req.n != 1:
            raise ApiError(400, "only n=1 is supported", "n")
        if req.return_token_ids and req.stream:
            raise ApiError(400, "return_token_ids is supported without stream only", "return_token_ids")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stop) > 8 or any(not s for s in stop):
            raise ApiError(400, "stop must be at most 8 non-empty strings", "stop")
        if max_tokens is None:
            max_tokens = max(1, self.engine.max_seq_len - len(prompt_ids))
        params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                                stop=tuple(stop), seed=req.seed, ignore_eos=req.ignore_eos)
        try:
            self.engine.check_prompt(prompt_ids, params)
        except RequestError as e:
            raise ApiError(400, str(e), "messages" if isinstance(req, ChatRequest) else "prompt",
                           "context_length_exceeded" if "exceeds" in str(e) else None) from None
        return params

    async def chat(self, request: Request):
        req = await self._parse(request, ChatRequest)
        tokenizer = self.engine.tokenizer
        if not tokenizer.has_chat_template:
            raise ApiError(400, "this model has no chat template; use /v1/completions")
        msgs = [{"role": m.role, "content": _content_text(m.content)} for m in req.messages]
        try:
            text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
        except Exception as e:  # the template may reject a conversation (raise_exception)
            raise ApiError(400, f"chat template rejected the messages: {e}", "messages") from None
        ids = tokenizer.encode(text)
        params = self._params(req, ids, req.max_completion_tokens or req.max_tokens)
        return await self._respond(request, req, ids, params, chat=True)

    async def completions(self, request: Request):
        req = await self._parse(request, CompletionRequest)
        p = req.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise ApiError(400, "only one prompt per request is supported", "prompt")
            p = p[0]
        ids = self.engine.tokenizer.encode(p) if isinstance(p, str) else list(p)
        params = self._params(req, ids, req.max_tokens if req.max_tokens is not None else 16)
        return await self._respond(request, req, ids, params, chat=False)

    async def _respond(self, request: Request, req: _Common, ids: list[int], params: SamplingParams, chat: bool):
        ae = self.ae
        if not ae.alive:
            raise ApiError(503, "the engine has stopped; restart the server")
        h = ae.submit(ids, params)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        obj = "chat.completion" if chat else "text_completion"
        if req.stream:
            usage = bool((req.stream_options or {}).get("include_usage"))
            return StreamingResponse(self._stream(ae, h, rid, obj + (".chunk" if chat else ""), chat, usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._collect(request, ae, h, rid, obj, chat, req.return_token_ids)

    async def _collect(self, request: Request, ae: AsyncEngine, h: Handle, rid: str, obj: str, chat: bool,
                       token_ids: bool):
        parts, tokens, last = [], [], None
        watch = asyncio.create_task(_watch_disconnect(request))
        try:
            async for ev in _until_disconnect(h, watch):
                parts.append(ev.delta)
                if ev.token is not None:
                    tokens.append(ev.token)
                last = ev
        finally:
            watch.cancel()
            if not h.done:
                ae.abort(h)
        if last is None or last.finish_reason == "abort":
            return _error(499, "client closed request")
        if last.finish_reason == "error":
            return _error(500, "the engine failed while generating")
        text = "".join(parts)
        choice = {"index": 0, "finish_reason": last.finish_reason, "logprobs": None}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        if token_ids:
            choice.update(prompt_token_ids=list(h.prompt_ids), token_ids=tokens)
        return {"id": rid, "object": obj, "created": int(time.time()), "model": self.model_id,
                "choices": [choice], "usage": _usage(last)}

    async def _stream(self, ae: AsyncEngine, h: Handle, rid: str, obj: str, chat: bool, usage: bool):
        created_at = int(time.time())
        head = {"id": rid, "object": obj, "created": created_at, "model": self.model_id}

        def chunk(delta: str | None, finish: str | None, role: bool = False) -> str:
            if chat:
                d: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                    {} if delta is None else {"content": delta})
                c = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                c = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
            return "data: " + json.dumps({**head, "choices": [c]}) + "\n\n"

        try:
            if chat:
                yield chunk(None, None, role=True)
            last = None
            async for ev in h:
                last = ev
                if ev.finish_reason in ("abort", "error"):
                    break
                if ev.delta:
                    yield chunk(ev.delta, None)
            if last is not None and last.finish_reason == "error":
                yield "data: " + json.dumps({"error": {"message": "the engine failed while generating",
                                                       "type": "server_error"}}) + "\n\n"
            elif last is not None and last.finish_reason != "abort":
                yield chunk(None if chat else "", last.finish_reason)
                if usage:
                    yield "data: " + json.dumps({**head, "choices": [], "usage": _usage(last)}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:  # runs on normal end and when the client disconnects (generator closed)
            ae.abort(h)


def _usage(ev) -> dict:
    return {"prompt_tokens": ev.prompt_tokens, "completion_tokens": ev.completion_tokens,
            "total_tokens": ev.prompt_tokens + ev.completion_tokens}


async def _watch_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.05)


async def _until_disconnect(h: Handle, watch: asyncio.Task):
    """Events of h until it finishes; stops early when the watch task ends (client gone)."""
    while True:
        get = asyncio.ensure_future(h.events.get())
        done, _ = await asyncio.wait({get, watch}, return_when=asyncio.FIRST_COMPLETED)
        if get not in done:
            get.cancel()
            return
        ev = get.result()
        yield ev
        if ev.finished:
            return


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          log_level: str = "warning") -> None:
    """Serve until interrupted: HTTP on a helper thread, the engine's step loop on this one."""
    import threading

    import uvicorn

    # The step loop releases and retakes the GIL around every torch op; when the HTTP thread
    # holds it, the default 5 ms switch interval can stall a step for that long per op.
    sys.setswitchinterval(0.0005)
    driver = AsyncEngine(engine)
    config = uvicorn.Config(create_app(engine, api_key, driver), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    http = threading.Thread(target=server.run, name="http", daemon=True)
    http.start()
    try:
        driver.run(keep_going=http.is_alive)
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        driver.shutdown()
        http.join(timeout=10)
    if not server.started and not http.is_alive():
        raise OSError(f"could not serve on {host}:{port} (see the log above)")
