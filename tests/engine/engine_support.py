"""Helpers shared by the engine tests (imported by conftest.py and test modules)."""

from __future__ import annotations

import gc
import os
import socket
from collections import OrderedDict
import subprocess
import sys
import time

import httpx

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "List three colours: red,",
]

# One thread: tests assert behaviour, not speed, and on a shared or loaded CI machine two
# OpenMP threads per process slow down by an order of magnitude while one degrades gently.
THREADS = 1

_engines: "OrderedDict[tuple, object]" = OrderedDict()
KEEP_ENGINES = 2  # an engine with its KV cache is 0.5-1 GB: keep the two most recently used


def get_engine(weights: str, **kw):
    """Engines are expensive to build; share one per (format, options), the two most recently
    used kept (the test process stays within a few GB over the whole suite). Mapping options
    (kernels, dense_above) are passed as tuples of (key, value) pairs."""
    from swarmfactory.engine import Engine, EngineConfig

    key = (weights, tuple(sorted(kw.items())))
    if key not in _engines:
        while len(_engines) >= KEEP_ENGINES:
            _engines.popitem(last=False)
        gc.collect()
        kw = {k: dict(v) if isinstance(v, tuple) else v for k, v in kw.items()}
        opts = {"max_batch": 8, "max_seq_len": 1024, "threads": THREADS, **kw}
        _engines[key] = Engine(EngineConfig(weights=weights, **opts))
    _engines.move_to_end(key)
    return _engines[key]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str, api_key: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        env.pop("SWARMFACTORY_API_KEY", None)
        if api_key:
            env["SWARMFACTORY_API_KEY"] = api_key
        cmd = [sys.executable, "-m", "swarmfactory.engine_cli", "serve", "--port", str(self.port),
               "--threads", str(THREADS), *args]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("server did not start in time")

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


