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
KEEP_ENGINES = 1  # an engine with its KV cache is 0.5-1 GB: keep the one most recently used (and the
# cache is emptied at the end of each test file, tests/conftest.py)


def get_engine(weights: str, **kw):
    """Engines are expensive to build; share one per (format, options), the most recently used
    kept until the test file ends (the test process stays within a few GB over the whole suite).
    Mapping options (kernels, dense_above) are passed as tuples of (key, value) pairs."""
    from swarmfactory.engine import Engine, EngineConfig

    key = (weights, tuple(sorted(kw.items())))
    if key not in _engines:
        while len(_engines) >= KEEP_ENGINES:
            _engines.popitem(last=False)
        gc.collect()
        kw = {k: dict(v) if isinstance(v, tuple) else v for k, v in kw.items()}
        opts = {"max_batch": 8, "max_seq_len": 512, "threads": THREADS, **kw}  # the fixed text is 415 tokens
        _engines[key] = Engine(EngineConfig(weights=weights, **opts))
    _engines.move_to_end(key)
    return _engines[key]


def load_hf(model_path):
    """The HF transformers fp32 model read from the same GGUF: the reference."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(THREADS)
    m = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                             dtype=torch.float32)
    m.eval()
    return m


def forget_engines() -> None:
    """Drop the shared engines (at the end of each test file)."""
    _engines.clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``swarmfactory engine serve`` on a free loopback port (``model``: a GGUF file, default the
    bundled one), up once ``/health`` answers: at once, or with ``wait=False`` when ``wait()`` is
    called (its load then overlaps what the test does meanwhile). Its output goes to a file
    (``output()``), so a chatty server never blocks on a full pipe."""

    def __init__(self, *args: str, api_key: str | None = None, model=None, wait: bool = True):
        import tempfile

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        env.pop("SWARMFACTORY_API_KEY", None)
        if api_key:
            env["SWARMFACTORY_API_KEY"] = api_key
        cmd = [sys.executable, "-m", "swarmfactory.engine_cli", "serve", "--port", str(self.port),
               "--threads", str(THREADS), *(("--model", str(model)) if model is not None else ()), *args]
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        if wait:
            self.wait()

    def wait(self, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server did not start in {timeout:.0f} s: {self.output()}")

    def output(self) -> str:
        """What the server printed so far (stdout and stderr; still there once it stopped)."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def memory(self) -> dict:
        """The server process's resident memory in bytes (``/proc``): ``rss`` now, ``anon`` the
        part of it that is no file's (the model file's mapped pages and libraries left out),
        ``peak`` the most it has had."""
        names = {"VmRSS": "rss", "RssAnon": "anon", "VmHWM": "peak"}
        out = {}
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in names:
                    out[names[key]] = int(value.split()[0]) * 1024
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
