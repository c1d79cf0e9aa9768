"""OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models, /health.

Bad requests get a 4xx with an OpenAI-style error body naming the problem; they are rejected
before they reach the engine, so they never disturb running requests. A client that goes away
(streaming or not) has its request aborted and its KV slot freed at the next engine step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import sys
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import tools
from .async_engine import AsyncEngine, Handle
from .engine import Engine, RequestError
from .metrics import ACCESS, CONTENT_TYPE_LATEST, AccessLog, Metrics
from .sequence import SamplingParams

MAX_BODY_BYTES = 4 * 1024 * 1024


class _Common(BaseModel):
    # A field this server does not know is refused with a 400 naming it (``_check``), unless it
    # cannot change the answer (``HARMLESS``): a silently ignored parameter is a wrong answer.
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # vLLM / llama.cpp extensions
    top_k: int = Field(default=0, ge=-1)  # 0 or -1: off
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    ignore_eos: bool = False  # used by fixed-length benchmarks
    return_token_ids: bool = False  # the choice carries prompt_token_ids and token_ids


# Fields a client may send that cannot change the answer: accepted and ignored.
# (``cache_prompt``: llama.cpp's switch for its prompt cache, which never changes an answer.)
HARMLESS = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
                      "cache_prompt"})


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = ""
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


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
    app.exception_handler(StarletteHTTPException)(_http_error)
    app.add_middleware(AccessLog)
    app.get("/health")(api.health)
    app.get("/metrics")(api.metrics_page)
    app.get("/v1/models")(api.models)
    app.post("/v1/chat/completions")(api.chat)
    app.post("/v1/completions")(api.completions)
    return app


async def _api_error(request: Request, e: ApiError):
    return _error(e.status, e.message, e.param, e.code)


async def _http_error(request: Request, e: StarletteHTTPException):
    """An unknown path (404) or method (405) in OpenAI's error shape."""
    message = {404: f"Invalid URL ({request.method} {request.url.path})",
               405: f"Method {request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
    resp = _error(e.status_code, message)
    for k, v in (e.headers or {}).items():
        resp.headers[k] = v
    return resp


class _Api:
    """The routes of one app over one engine: the request checks (key, size, JSON, fields), the
    handlers, and the answer, whole or streamed."""

    def __init__(self, engine: Engine, api_key: str | None, driver: AsyncEngine | None):
        self.engine, self.api_key, self.driver = engine, api_key, driver
        self.ae: AsyncEngine | None = driver  # the step loop; the app's own from startup where no driver
        self.model_id = engine.model_id
        self.created = int(time.time())
        self.metrics = Metrics(engine, self.model_id)

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

    async def metrics_page(self):
        return Response(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def models(self, request: Request):
        self._guard(request)
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "created": self.created,
                                            "owned_by": "swarmfactory", "max_model_len": self.engine.max_seq_len,
                                            "vocab_size": self.engine.hparams.vocab_size}]}

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

    def _check(self, req: _Common) -> None:
        """Refuse what this server would otherwise answer wrongly: another model (404, as OpenAI
        does), a field it does not implement (400 naming it)."""
        if req.model and req.model != self.model_id:
            raise ApiError(404, f"The model `{req.model}` does not exist: this server serves `{self.model_id}`",
                           "model", "model_not_found")
        for name in sorted(req.model_extra or {}):
            if name not in HARMLESS:
                raise ApiError(400, f"unsupported parameter: {name}", name, "unsupported_parameter")
        if req.n != 1:
            raise ApiError(400, "only n=1 is supported", "n")
        if isinstance(req, CompletionRequest):
            if req.echo:
                raise ApiError(400, "echo is not supported", "echo", "unsupported_parameter")
            if req.suffix:
                raise ApiError(400, "suffix is not supported", "suffix", "unsupported_parameter")
            if req.best_of not in (None, 1):
                raise ApiError(400, "only best_of=1 is supported", "best_of", "unsupported_parameter")
        if req.return_token_ids and req.stream:
            raise ApiError(400, "return_token_ids is supported without stream only", "return_token_ids")

    def _grammar(self, req: _Common, forced: dict | None = None) -> str | None:
        """The structured-output spec of ``req`` (response_format, a guided_* extra, or
        ``forced``: a tool call that tool_choice requires), compiled once here so that a bad
        schema is a 400 before the request is queued; its canonical JSON."""
        specs = [forced] if forced is not None else []
        rf = req.response_format
        if rf is not None:
            kind = rf.get("type")
            if kind == "json_object":
                specs.append({"type": "json_object"})
            elif kind == "json_schema":
                js = rf.get("json_schema")
                if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
                    raise ApiError(400, "response_format.json_schema must be an object with a 'schema' object",
                                   "response_format")
                specs.append({"type": "json_schema", "schema": js.get("schema", {}), "strict": bool(js.get("strict"))})
            elif kind != "text":
                raise ApiError(400, f"response_format type {kind!r} is not one of text, json_object, json_schema",
                               "response_format")
        if req.guided_json is not None:
            schema = req.guided_json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as e:
                    raise ApiError(400, f"guided_json is not valid JSON: {e}", "guided_json") from None
            specs.append({"type": "json_schema", "schema": schema, "strict": True})
        if req.guided_regex is not None:
            specs.append({"type": "regex", "pattern": req.guided_regex})
        if req.guided_choice is not None:
            specs.append({"type": "choice", "choices": list(req.guided_choice)})
        if not specs:
            return None
        if len(specs) > 1:
            raise ApiError(400, "give one of response_format, guided_json, guided_regex, guided_choice "
                                "(a required or named tool_choice constrains the output too)", "response_format")
        grammars = getattr(self.engine, "grammars", None)
        if grammars is None:
            raise ApiError(400, "structured output is not available on this server", "response_format",
                           "unsupported_parameter")
        try:
            grammars.compile(specs[0])
        except ValueError as e:
            raise ApiError(400, f"structured output: {e}", "response_format") from None
        except RecursionError:
            raise ApiError(400, "structured output: the schema is nested too deeply", "response_format") from None
        return json.dumps(specs[0], separators=(",", ":"))  # property order kept: it is the order generated

    def _params(self, req: _Common, prompt_ids: list[int], max_tokens: int | None,
                forced: dict | None = None) -> SamplingParams:
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stop) > 8 or any(not s for s in stop):
            raise ApiError(400, "stop must be at most 8 non-empty strings", "stop")
        bias = []
        for k, v in (req.logit_bias or {}).items():
            if not k.lstrip("-").isdigit() or not 0 <= int(k) < self.engine.hparams.vocab_size:
                raise ApiError(400, f"logit_bias key {k!r} is not a token id of this model "
                                    f"(0..{self.engine.hparams.vocab_size - 1})", "logit_bias")
            if not -100.0 <= v <= 100.0:
                raise ApiError(400, f"logit_bias value {v} for token {k} is not in [-100, 100]", "logit_bias")
            bias.append((int(k), float(v)))
        if isinstance(req, ChatRequest):
            if req.top_logprobs is not None and not req.logprobs:
                raise ApiError(400, "top_logprobs needs logprobs=true", "top_logprobs")
            logprobs = (req.top_logprobs or 0) if req.logprobs else None
        else:
            logprobs = req.logprobs
        if max_tokens is None:
            max_tokens = max(1, self.engine.max_seq_len - len(prompt_ids))
        grammar = self._grammar(req, forced)
        if grammar is not None and req.ignore_eos:
            raise ApiError(400, "ignore_eos cannot be combined with structured output (it ends at its stop token)",
                           "ignore_eos")
        try:
            params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                                    stop=tuple(stop), seed=req.seed, ignore_eos=req.ignore_eos,
                                    top_k=max(0, req.top_k), min_p=req.min_p,
                                    presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                                    repetition_penalty=req.repetition_penalty, logit_bias=tuple(bias),
                                    logprobs=logprobs, grammar=grammar)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        try:
            self.engine.check_prompt(prompt_ids, params)
        except RequestError as e:
            raise ApiError(400, str(e), "messages" if isinstance(req, ChatRequest) else "prompt",
                           "context_length_exceeded" if "exceeds" in str(e) else None) from None
        return params

    async def chat(self, request: Request):
        req = await self._parse(request, ChatRequest)
        self._check(req)
        tokenizer = self.engine.tokenizer
        if not tokenizer.has_chat_template:
            raise ApiError(400, "this model has no chat template; use /v1/completions")
        try:
            funcs = tools.functions(req.tools)
            mode = tools.choice(req.tool_choice, funcs)
        except tools.ToolError as e:
            raise ApiError(400, str(e), "tool_choice" if "tool_choice" in str(e) else "tools") from None
        msgs = [{"role": m.role, "content": _content_text(m.content), "name": m.name, "tool_calls": m.tool_calls,
                 "tool_call_id": m.tool_call_id} for m in req.messages]
        shown = [] if mode == "none" else funcs  # tool_choice none: the model is not told of them
        native = tools.template_knows_tools(tokenizer.chat_template_source)
        msgs = tools.messages_for_template(msgs, shown, native)
        try:
            text = tokenizer.apply_chat_template(
                msgs, add_generation_prompt=True,
                tools=[{"type": "function", "function": f} for f in shown] if native and shown else None)
        except Exception as e:  # the template may reject a conversation (raise_exception)
            raise ApiError(400, f"chat template rejected the messages: {e}", "messages") from None
        ids = tokenizer.encode(text)
        params = self._params(req, ids, req.max_completion_tokens or req.max_tokens,
                              tools.grammar(mode, funcs, req.parallel_tool_calls))
        return await self._respond(request, req, ids, params, chat=True,
                                   calls=(mode, funcs) if mode != "none" else None)

    async def completions(self, request: Request):
        req = await self._parse(request, CompletionRequest)
        self._check(req)
        p = req.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise ApiError(400, "only one prompt per request is supported", "prompt")
            p = p[0]
        ids = self.engine.tokenizer.encode(p) if isinstance(p, str) else list(p)
        params = self._params(req, ids, req.max_tokens if req.max_tokens is not None else 16)
        return await self._respond(request, req, ids, params, chat=False)

    async def _respond(self, request: Request, req: _Common, ids: list[int], params: SamplingParams, chat: bool,
                       calls: tuple | None = None):
        ae = self.ae
        if not ae.alive:
            raise ApiError(503, "the engine has stopped; restart the server")
        timer = self.metrics.request()
        h = ae.submit(ids, params)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        obj = "chat.completion" if chat else "text_completion"
        if req.stream:
            usage = bool((req.stream_options or {}).get("include_usage"))
            return StreamingResponse(self._stream(ae, h, rid, obj + (".chunk" if chat else ""), chat, usage, timer,
                                                  calls),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._collect(request, ae, h, rid, obj, chat, req.return_token_ids, timer, calls)

    async def _collect(self, request: Request, ae: AsyncEngine, h: Handle, rid: str, obj: str, chat: bool,
                       token_ids: bool, timer, calls: tuple | None = None):
        parts, tokens, lps, last = [], [], [], None
        watch = asyncio.create_task(_watch_disconnect(request))
        try:
            async for ev in _until_disconnect(h, watch):
                timer.event(ev)
                parts.append(ev.delta)
                if ev.token is not None:
                    tokens.append(ev.token)
                if ev.logprob is not None:
                    lps.append(ev.logprob)
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
        logprobs = self._logprobs(lps, chat, 0) if h.params.logprobs is not None else None
        choice = {"index": 0, "finish_reason": last.finish_reason, "logprobs": logprobs}
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls is not None:
                content, found, finish = _tool_answer(text, calls, last.finish_reason)
                message = {"role": "assistant", "content": content, **({"tool_calls": found} if found else {})}
                choice["finish_reason"] = finish
            choice["message"] = message
        else:
            choice["text"] = text
        if token_ids:
            choice.update(prompt_token_ids=list(h.prompt_ids), token_ids=tokens)
        return {"id": rid, "object": obj, "created": int(time.time()), "model": self.model_id,
                "choices": [choice], "usage": _usage(last)}

    def _logprobs(self, lps: list, chat: bool, offset: int) -> dict:
        """OpenAI's logprobs object for these tokens: chat's ``content`` list, or the completions
        API's parallel lists (``text_offset`` counted from ``offset`` characters of output)."""
        tok = self.engine.tokenizer

        def piece(t: int) -> tuple[str, list[int]]:
            b = tok.token_bytes(t)
            return b.decode("utf-8", errors="replace"), list(b)

        def finite(x: float) -> float:
            return max(x, -9999.0)  # JSON has no -inf (vLLM's floor)

        if chat:
            content = []
            for lp in lps:
                text, b = piece(lp.token)
                top = [dict(zip(("token", "bytes"), piece(t)), logprob=finite(v)) for t, v in lp.top]
                content.append({"token": text, "logprob": finite(lp.logprob), "bytes": b, "top_logprobs": top})
            return {"content": content, "refusal": None}
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for lp in lps:
            text, _ = piece(lp.token)
            out["tokens"].append(text)
            out["token_logprobs"].append(finite(lp.logprob))
            out["top_logprobs"].append({piece(t)[0]: finite(v) for t, v in lp.top})
            out["text_offset"].append(offset)
            offset += len(text)
        return out

    async def _stream(self, ae: AsyncEngine, h: Handle, rid: str, obj: str, chat: bool, usage: bool, timer,
                      calls: tuple | None = None):
        created_at = int(time.time())
        head = {"id": rid, "object": obj, "created": created_at, "model": self.model_id}
        want_lp = h.params.logprobs is not None
        pending: list = []  # logprobs of tokens whose text is not out yet (held for a stop string)
        offset = 0
        # With tools, text that may be a call is held back until the end (all of it when a call
        # is forced; in auto mode until it is clearly plain text), then sent as tool_calls.
        held, holding = "", calls is not None

        def chunk(delta: str | None, finish: str | None, role: bool = False, tool_calls: list | None = None) -> str:
            nonlocal pending, offset
            lp = None
            if want_lp and not role:
                lp = self._logprobs(pending, chat, offset)
                offset += sum(len(t) for t in lp.get("tokens", []))
                pending = []
            if chat:
                d: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                    {} if delta is None else {"content": delta})
                if tool_calls:
                    d["tool_calls"] = [{"index": i, **c} for i, c in enumerate(tool_calls)]
                c = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": lp}
            else:
                c = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": lp}
            return "data: " + json.dumps({**head, "choices": [c]}) + "\n\n"

        try:
            if chat:
                yield chunk(None, None, role=True)
            last = None
            async for ev in h:
                last = ev
                timer.event(ev)
                if ev.finish_reason in ("abort", "error"):
                    break
                if ev.logprob is not None:
                    pending.append(ev.logprob)
                if holding:
                    held += ev.delta
                    if calls[0] == "auto" and not tools.could_start_a_call(held):
                        holding = False  # plain text: send what was held and stream the rest
                        yield chunk(held, None)
                    continue
                if ev.delta:
                    yield chunk(ev.delta, None)
            if last is not None and last.finish_reason == "error":
                yield "data: " + json.dumps({"error": {"message": "the engine failed while generating",
                                                       "type": "server_error"}}) + "\n\n"
            elif last is not None and last.finish_reason != "abort":
                finish = last.finish_reason
                if holding:
                    content, found, finish = _tool_answer(held, calls, finish)
                    if content or found:
                        yield chunk(content, None, tool_calls=found)
                yield chunk(None if chat else "", finish)
                if usage:
                    yield "data: " + json.dumps({**head, "choices": [], "usage": _usage(last)}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:  # runs on normal end and when the client disconnects (generator closed)
            ae.abort(h)


def _tool_answer(text: str, calls: tuple, finish: str) -> tuple[str | None, list[dict], str]:
    """(content, tool_calls, finish_reason) of a chat answer given tools: the calls parsed from
    the text (auto) or the constrained output (required, a named function); a forced call cut
    short by max_tokens stays text, with finish_reason "length"."""
    mode, funcs = calls
    if mode == "auto":
        content, found = tools.parse(text, funcs)
        return content, found, ("tool_calls" if found else finish)
    if finish == "length":
        return text, [], finish
    try:
        found = tools.forced(text, mode)
    except (ValueError, TypeError, KeyError):
        return text, [], finish
    return None, found, ("stop" if isinstance(mode, dict) else "tool_calls")


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
          log_level: str = "warning", access_log: bool = True) -> None:
    """Serve until interrupted: HTTP on a helper thread, the engine's step loop on this one."""
    import threading

    import uvicorn

    # The step loop releases and retakes the GIL around every torch op; when the HTTP thread
    # holds it, the default 5 ms switch interval can stall a step for that long per op.
    sys.setswitchinterval(0.0005)
    if access_log and not ACCESS.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        ACCESS.addHandler(handler)
        ACCESS.setLevel(logging.INFO)
        ACCESS.propagate = False
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
