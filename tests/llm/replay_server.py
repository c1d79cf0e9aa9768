"""A deterministic stand-in for a paid LLM API: a real HTTP server on 127.0.0.1 that answers
/v1/chat/completions with recorded responses, in order. Each script item is a dict:
{"content": str} | {"status": int} | {"sleep": seconds, "content": str}."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ReplayServer:
    def __init__(self, script: list[dict], repeat_last: bool = True, route=None):
        """``route(body)`` may answer a request itself (an item) or return None to take the next
        scripted item; e.g. answer repair prompts with a fixed kernel."""
        self.script, self.repeat_last, self.route = list(script), repeat_last, route
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with outer.lock:
                    outer.requests.append({"path": self.path, "body": body,
                                           "auth": self.headers.get("Authorization")})
                    item = outer.route(body) if outer.route else None
                    if item is None:
                        item = outer.script.pop(0) if len(outer.script) > 1 or not outer.repeat_last else outer.script[0]
                if "sleep" in item:
                    time.sleep(item["sleep"])
                status = item.get("status", 200)
                if status != 200:
                    payload = json.dumps({"error": {"message": item.get("error", "scripted failure")}}).encode()
                else:
                    text = item.get("content", "")
                    payload = json.dumps({
                        "id": "replay", "object": "chat.completion", "model": body.get("model"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": len(json.dumps(body["messages"])) // 4,
                                  "completion_tokens": len(text) // 4}}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a scripted timeout)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
