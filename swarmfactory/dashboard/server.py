"""The dashboard's HTTP server: the standard library's threading server, GET and HEAD only.

Routes (HTML for people, ``/api/...`` JSON for scripts and the page's poller):

    /                      live overview (the latest run, or ?run=ID)
    /runs/ID               live overview of one run
    /candidates/ID         a candidate: lineage, diff against its parent, evidence
    /api/version           a token that changes when the store does (the page polls it)
    /api/runs              runs with progress (?limit, ?offset)
    /api/runs/ID           one run: progress, verdicts, agent scoreboard
    /api/evaluations       newest first (?run, ?problem, ?outcome, ?candidate, ?before, ?limit)
    /api/verdicts          verdict counts by problem (?run)
    /api/scoreboard        the agent scoreboard (?run)
    /api/champions         champion changes over time (?problem)
    /api/candidates/ID     a candidate as JSON
    /api/cases             found validation cases (?problem, ?limit, ?offset)
    /api/lessons           lessons as they stand
    /api/engine            engine tuning runs with their serving figures

An unknown id is a 404, a malformed or unknown query parameter a 400, any other method a 405;
each with a one-line message (JSON under ``/api``). The store is opened read-only: SQLite
connections run with ``query_only``, PostgreSQL sessions with read-only transactions. A rendered
answer is kept until the store changes (the store is append-only), so polling costs a few
``max(id)`` lookups.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from sqlalchemy import event

from swarmfactory.dashboard import pages, queries as Q
from swarmfactory.redact import redact
from swarmfactory.report.charts import OUTCOME_ORDER

MAX_LIMIT = 200


class BadRequest(ValueError):
    """A malformed request (the server answers 400)."""


def _int(raw: str, name: str, lo: int, hi: int | None = None) -> int:
    try:
        v = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name}={raw!r} is not an integer") from None
    if v < lo or (hi is not None and v > hi):
        raise BadRequest(f"query parameter {name}={v} is out of range ({lo}..{hi if hi is not None else 'any'})")
    return v


def _outcome(raw: str, name: str) -> str:
    if raw not in OUTCOME_ORDER:
        raise BadRequest(f"query parameter {name}={raw!r} is not a verdict (one of {', '.join(OUTCOME_ORDER)})")
    return raw


def _text(raw: str, name: str) -> str:
    if not raw or len(raw) > 200:
        raise BadRequest(f"query parameter {name} must be 1-200 characters")
    return raw


def _flag(raw: str, name: str) -> bool:
    if raw not in ("0", "1"):
        raise BadRequest(f"query parameter {name}={raw!r} must be 0 or 1")
    return raw == "1"


# name -> (parser, default); a route accepts the names it lists and no others.
PARAMS = {"limit": (lambda r, n: _int(r, n, 1, MAX_LIMIT), 25), "offset": (lambda r, n: _int(r, n, 0), 0),
          "before": (lambda r, n: _int(r, n, 1), None), "run": (_text, None), "problem": (_text, None),
          "candidate": (_text, None), "outcome": (_outcome, None), "fragment": (_flag, False),
          "runs_offset": (lambda r, n: _int(r, n, 0), 0), "runs_limit": (lambda r, n: _int(r, n, 1, MAX_LIMIT), 20),
          "cases_offset": (lambda r, n: _int(r, n, 0), 0)}
PAGE_PARAMS = ("before", "limit", "runs_offset", "runs_limit", "cases_offset", "fragment")


def parse_params(query: str, allowed: tuple[str, ...]) -> dict:
    try:
        raw = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=32)
    except ValueError as exc:
        raise BadRequest(f"malformed query string: {exc}") from None
    out = {k: PARAMS[k][1] for k in allowed}
    for name, values in raw.items():
        if name not in allowed:
            raise BadRequest(f"unknown query parameter {name!r} here (known: {', '.join(allowed) or 'none'})")
        if len(values) != 1:
            raise BadRequest(f"query parameter {name} given {len(values)} times")
        out[name] = PARAMS[name][0](values[0], name)
    return out


class Dashboard:
    """Routes a path and query to a (status, content type, body) answer over one store."""

    def __init__(self, store):
        self.store = store
        self.engine = store.engine
        self.label = safe_url(store.url)
        self._cache: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        dialect = self.engine.dialect.name
        # Read-only sessions: the server never writes, and cannot by mistake.
        event.listen(self.engine, "connect", _read_only_sqlite if dialect == "sqlite" else _read_only_pg)
        self.engine.dispose()  # connections opened while the store was checked lack the setting

    def answer(self, path: str, query: str) -> tuple[int, str, bytes]:
        api = path.startswith("/api/")
        try:
            with self.engine.connect() as c:
                token = Q.version(c)
                if path == "/api/version":
                    return self._json({"version": token})
                key = (path, query)
                with self._lock:
                    hit = self._cache.get(key)
                if hit and hit[0] == token:
                    return hit[1]
                res = self._route(c, path, query, token)
                with self._lock:
                    self._cache[key] = (token, res)
                    self._cache.move_to_end(key)
                    while len(self._cache) > 256:
                        self._cache.popitem(last=False)
                return res
        except BadRequest as exc:
            return self._error(400, str(exc), api)
        except Q.NotFound as exc:
            return self._error(404, str(exc), api)
        except Exception as exc:  # the store went away, a driver error: one line, no traceback
            inner = getattr(exc, "orig", None) or exc  # the driver's words, first line, no password
            first = (str(inner).strip().splitlines() or [""])[0]
            print(redact(f"dashboard: {path}: {type(inner).__name__}: {first}"), file=sys.stderr)
            return self._error(500, f"the store could not be read: {type(exc).__name__}", api)

    def _route(self, c, path: str, query: str, token: str):
        parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
        if parts[:1] == ["api"]:
            return self._api(c, parts[1:], query)
        if not parts or parts[0] == "runs" and len(parts) == 2:
            p = parse_params(query, PAGE_PARAMS + (("run",) if not parts else ()))
            run_id = parts[1] if parts else p.get("run")
            if run_id:
                Q.run(c, run_id)  # 404 for an unknown run before anything is drawn
            body = pages.overview(c, run_id, p)
            if p["fragment"]:
                return 200, "text/html; charset=utf-8", body.encode()
            title = f"swarmfactory run {run_id}" if run_id else "swarmfactory dashboard"
            return self._html(pages.page(title, f"<div id='live'>{body}</div>", self.label, token, live=True))
        if parts[0] == "candidates" and len(parts) == 2:
            parse_params(query, ())
            info = Q.candidate(c, parts[1])
            return self._html(pages.page(f"candidate {parts[1]}", pages.candidate(info), self.label))
        raise Q.NotFound(f"no page at {path}: see / for the overview")

    def _api(self, c, parts: list[str], query: str):
        name, rest = (parts[0] if parts else ""), parts[1:]
        if name == "runs" and not rest:
            p = parse_params(query, ("limit", "offset"))
            return self._json(Q.runs(c, p["limit"], p["offset"]))
        if name == "runs" and len(rest) == 1:
            parse_params(query, ())
            return self._json(Q.run(c, rest[0]))
        if name == "candidates" and len(rest) == 1:
            parse_params(query, ())
            return self._json(Q.candidate(c, rest[0]))
        if rest:
            raise Q.NotFound(f"no endpoint /api/{'/'.join(parts)}")
        if name == "evaluations":
            p = parse_params(query, ("run", "problem", "outcome", "candidate", "before", "limit"))
            if p["run"]:
                Q.run(c, p["run"])
            return self._json(Q.evaluations(c, p["run"], p["problem"], p["outcome"], p["candidate"], p["before"],
                                            p["limit"]))
        if name in ("verdicts", "scoreboard"):
            p = parse_params(query, ("run",))
            if p["run"]:
                Q.run(c, p["run"])
            fn = Q.verdicts if name == "verdicts" else Q.scoreboard
            return self._json({"run": p["run"], name: fn(c, p["run"])})
        if name == "champions":
            p = parse_params(query, ("problem",))
            return self._json({"champions": Q.champion_history(c, p["problem"])})
        if name == "cases":
            p = parse_params(query, ("problem", "limit", "offset"))
            return self._json(Q.cases(c, p["problem"], p["limit"], p["offset"]))
        if name == "lessons":
            parse_params(query, ())
            return self._json({"lessons": Q.lessons(c)})
        if name == "engine":
            parse_params(query, ())
            return self._json({"runs": Q.engine_runs(c)})
        raise Q.NotFound(f"no endpoint /api/{'/'.join(parts)}")

    @staticmethod
    def _json(obj, status: int = 200):
        return status, "application/json", json.dumps(Q.jsonable(obj), default=str).encode()

    @staticmethod
    def _html(text: str, status: int = 200):
        return status, "text/html; charset=utf-8", text.encode()

    def _error(self, status: int, message: str, api: bool):
        if api:
            return self._json({"error": message, "status": status}, status)
        page = pages.not_found(message, self.label) if status == 404 else pages.page(
            "error", f"<section><h2>Error {status}</h2><p id='error'>{pages._e(message)}</p></section>", self.label)
        return self._html(page, status)


def safe_url(url: str) -> str:
    """The store's URL as it may be shown: no password."""
    return redact(url)


def _read_only_sqlite(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA query_only = ON")
    cur.close()


def _read_only_pg(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    cur.close()
    dbapi_conn.commit()


class Handler(BaseHTTPRequestHandler):
    server_version = "swarmfactory-dashboard"
    dashboard: Dashboard

    def _serve(self, body: bool) -> None:
        url = urlsplit(self.path)
        status, ctype, data = self.server.dashboard.answer(url.path or "/", url.query)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'none'; connect-src 'self'; img-src 'self' data:; "
                                                    "style-src 'unsafe-inline'; script-src 'unsafe-inline'")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_GET(self):
        self._serve(True)

    def do_HEAD(self):
        self._serve(False)

    def _not_allowed(self):
        data = json.dumps({"error": f"method {self.command} not allowed: the dashboard is read-only (GET, HEAD)",
                           "status": 405}).encode()
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)


class DashboardServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, store, host: str = "127.0.0.1", port: int = 8050, verbose: bool = False):
        self.dashboard = Dashboard(store)
        self.verbose = verbose
        super().__init__((host, port), Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
