"""``--llm local``: our own engine serving the bundled SmolLM2 on a free loopback port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from swarmfactory import lifecycle


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalEngine:
    """Starts ``swarmfactory engine serve`` in the background; ``stop`` (or the context) ends it."""

    def __init__(self, cpus: list[int] | None = None, threads: int | None = None, timeout_s: float = 300,
                 max_batch: int = 2, max_seq_len: int = 8192):
        """``max_seq_len``: a coder prompt (problem, parent source, evidence) is ~2,000 tokens and
        the answer up to ``--llm-max-tokens`` more, so the engine's 2,048 default would leave the
        model 64 tokens to answer in; 8,192 is SmolLM2's trained context (the engine clamps it to
        the model's). ``max_batch``: the requests the agents keep in flight; the KV cache holds
        ``max_batch`` x ``max_seq_len`` positions (fp32 KV: about 380 MB per sequence at 8,192 for SmolLM2)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = tempfile.NamedTemporaryFile(prefix="sf-engine-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "swarmfactory.cli", "engine", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--max-batch", str(max_batch), "--max-seq-len", str(max_seq_len)]
        if threads:
            cmd += ["--threads", str(threads)]
        if cpus and shutil.which("taskset"):
            cmd = ["taskset", "-c", ",".join(map(str, cpus))] + cmd
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        lifecycle.adopt(self.proc.pid, "local LLM engine")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the local engine exited ({self.proc.returncode}); see {self.log.name}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the local engine did not become healthy in {timeout_s:.0f}s; see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        lifecycle.release(self.proc.pid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
