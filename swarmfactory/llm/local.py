"""``--llm local``: our own engine serving the bundled SmolLM2 on a free loopback port."""

from __future__ import annotations

import os
import socket
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
        fd, self.log_path = tempfile.mkstemp(prefix="sf-engine-", suffix=".log")
        os.close(fd)
        cmd = [sys.executable, "-m", "swarmfactory.cli", "engine", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--max-batch", str(max_batch), "--max-seq-len", str(max_seq_len)]
        if threads:
            cmd += ["--threads", str(threads)]
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        self.proc = lifecycle.Child(cmd, "local LLM engine", env=env,
                                    limits=lifecycle.Limits(cpus=tuple(cpus) if cpus else None), log=self.log_path)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc.close()
                raise RuntimeError(f"the local engine exited ({self.proc.returncode}); see {self.log_path}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the local engine did not become healthy in {timeout_s:.0f}s; see {self.log_path}")

    def stop(self) -> None:
        """SIGTERM (it shuts down cleanly), SIGKILL to its process group past 10 s."""
        self.proc.stop(grace=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
