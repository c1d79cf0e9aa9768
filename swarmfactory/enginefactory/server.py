"""The real runner: each design in its own process (worker.py: load, verify end to end, then
serve over HTTP as ``engine serve`` does), measured over HTTP the way users measure a server
(bench/serving.py: closed-loop streaming clients at each concurrency, for each workload, the same
seeded prompts for every design). A crash or a hang costs that design only, and a design's
process dies with the tune if that is killed.

``ServingRunner`` is this module behind the runner seam (runner.py); ``open`` computes the HF fp32
reference the designs are verified against, once per model file (in a child process: HF's memory
and progress bars stay out of the tuner).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from swarmfactory import lifecycle
from swarmfactory.engine.config import EngineConfig
from swarmfactory.outcome import Outcome, Verdict

from . import design as D
from .runner import OutOfTime, RunnerError, Start, TooSlow

if TYPE_CHECKING:
    from .tune import TuneConfig

LOAD_TIMEOUT_S = 600.0      # load + verification of one design
LEVEL_TIMEOUT_S = 900.0     # one serving level


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- one design in its own process --------------------------------------------------------------
def _store_file(workdir: Path, store_url: str) -> Path:
    """The tune's store URL in a file only we can read, for the design's worker: its champion:...@ID
    kernels come from that store (a URL may carry a password: never on a command line)."""
    path = workdir / "store.url"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(store_url)
    return path


class DesignServer:
    """Spawn the worker for one design; wait for its verification; measure it over HTTP."""

    def __init__(self, cfg: EngineConfig, reference: Path, workdir: Path, serve_anyway: bool = False,
                 store_url: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        path = workdir / f"design-{D.design_key(cfg)}.yaml"
        path.write_text(cfg.to_yaml())
        self.log = deque(maxlen=200)
        self.events: deque = deque()
        self._cv = threading.Condition()
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # a tune killed with -9 takes its design servers with it (the guard, and PR_SET_PDEATHSIG)
        self.proc = lifecycle.Child(
            [sys.executable, "-m", "swarmfactory.enginefactory.worker", "--config", str(path),
             "--reference", str(reference), "--port", str(self.port)] + (["--serve-anyway"] if serve_anyway else [])
            + (["--store-file", str(_store_file(workdir, store_url))] if store_url else []),
            "engine design server", env=env, limits=lifecycle.Limits(die_with_parent=True), log=subprocess.PIPE)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            ev = None
            if line.startswith("{"):
                try:
                    ev = json.loads(line)
                except ValueError:
                    ev = None
            with self._cv:
                if isinstance(ev, dict) and "event" in ev:
                    self.events.append(ev)
                else:
                    self.log.append(line)
                self._cv.notify_all()
        with self._cv:
            self.events.append({"event": "exit"})
            self._cv.notify_all()

    def next_event(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self.events:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)
            return self.events.popleft()

    def tail(self, n: int = 8) -> str:
        return " | ".join(list(self.log)[-n:])

    def exit_detail(self) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "did not exit"
        if rc < 0:
            return f"killed by signal {signal.Signals(-rc).name}"
        return f"exit status {rc}"

    def wait_healthy(self, timeout: float = 60.0) -> bool:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        return False

    def audit_failure(self) -> str | None:
        """What the engine's audit of its kernel-factory kernels caught while it served
        (``/health`` ``kernel_audit``), or None."""
        import httpx

        from swarmfactory.engine.audit import caught

        return caught(httpx.get(self.url + "/health", timeout=10).json().get("kernel_audit") or {})

    def measure(self, cfg: TuneConfig, on_level=None, deadline: float | None = None, screen: bool = False,
                caps: dict | None = None, repeat_deadline: float | None = None) -> dict:
        """Every (workload, level): the serving figures, keyed by workload ``INxOUT``. Past
        ``deadline`` (time.monotonic) it stops with ``OutOfTime``. ``screen``: the short first
        look (the first workload only, one wave of ``max(2, c)`` requests per level, its own
        prompts, the same for every design). ``caps``: (workload, concurrency) -> seconds; a level
        that runs longer raises ``TooSlow``. Each level records the contention it was measured
        under (``contention``: bench/serving.py); one that other processes disturbed is measured
        again (fresh prompts) while the repeats fit before ``repeat_deadline`` (default
        ``deadline``), and stays marked ``busy`` if every attempt was disturbed."""
        import asyncio

        from swarmfactory.bench.serving import (REPEAT_SEED, ServingMeter, measure_level_async, random_prompts,
                                                run_level, served_vocab)

        make_prompts = random_prompts(served_vocab(self.url))  # ids the model has
        meter = ServingMeter([self.proc.pid])  # ours: the design's server (and its children) and the tuner
        out: dict = {}
        for w, (n_in, n_out) in enumerate(cfg.screen_workloads() if screen else cfg.workloads):
            key = f"{n_in}x{n_out}"
            asyncio.run(run_level(self.url, make_prompts(2, n_in, cfg.seed + 10_000 + w), n_out, 2))  # warm-up
            levels = []
            for i, c in enumerate(cfg.concurrency):
                n_prompts, seed = (max(2, c), cfg.seed + 50_000 + i) if screen else \
                    (cfg.prompts(c), cfg.seed + 1 + 100 * w + i)
                cap = (caps or {}).get((key, c))

                async def one(attempt: int, key=key, c=c, n_prompts=n_prompts, seed=seed, n_out=n_out, n_in=n_in,
                              cap=cap):
                    prompts = make_prompts(n_prompts, n_in, seed + REPEAT_SEED * attempt)
                    limit = LEVEL_TIMEOUT_S
                    if deadline is not None:
                        limit = min(limit, deadline - time.monotonic())
                        if limit <= 0:
                            raise OutOfTime(f"the run's time ran out before {key} c={c}")
                    try:
                        return await asyncio.wait_for(run_level(self.url, prompts, n_out, c),
                                                      limit if cap is None else min(limit, cap))
                    except (TimeoutError, asyncio.TimeoutError):
                        if deadline is not None and time.monotonic() >= deadline - 1:
                            raise OutOfTime(f"the run's time ran out during {key} c={c}") from None
                        if cap is not None and cap < limit:
                            raise TooSlow(f"{key} c={c} took over {cap:.0f} s") from None
                        raise

                # a repeat that runs out of time or past its cap keeps the attempt measured before it
                res, _ = asyncio.run(measure_level_async(
                    one, meter, deadline=repeat_deadline if repeat_deadline is not None else deadline,
                    keep_on=(OutOfTime, TooSlow, TimeoutError, asyncio.TimeoutError)))
                lv = asdict(res)
                lv["loadavg"] = list(os.getloadavg())
                levels.append(lv)
                if on_level:
                    on_level(key, lv)
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server died while measured ({self.exit_detail()}): {self.tail()}")
            out[key] = levels
        return out

    def close(self) -> None:
        self.proc.close(timeout=10)


def start_design(cfg: EngineConfig, reference: Path, workdir: Path, timeout_s: float = LOAD_TIMEOUT_S,
                 serve_anyway: bool = False, store_url: str | None = None) -> Start:
    """Load and verify ``cfg`` in its own process. A failure ends it with a verdict; a pass leaves
    it serving. ``serve_anyway`` (the baseline only) serves after a failed verification too,
    returning both the server and the ``wrong`` verdict."""
    srv = DesignServer(cfg, reference, workdir, serve_anyway, store_url)
    wrong = None
    t0 = time.monotonic()
    loaded: dict = {}
    stage = "load"
    while True:
        ev = srv.next_event(max(0.0, timeout_s - (time.monotonic() - t0)))
        if ev is None:
            srv.close()
            return Start(None, Verdict(Outcome.TIMED_OUT, f"no verdict within {timeout_s:.0f} s ({stage})", stage))
        kind = ev["event"]
        if kind == "loaded":
            loaded, stage = ev, "verify"
        elif kind == "failed":
            srv.close()
            outcome = Outcome.BUILD_FAILED if ev["stage"] == "load" else Outcome.CRASHED
            return Start(None, Verdict(outcome, f"{ev['stage']}: {ev['error']}", ev["stage"],
                                       evidence={"trace": ev.get("trace", "")}), loaded)
        elif kind == "verified":
            verified = ev
            if not ev["ok"]:
                wrong = Verdict(Outcome.WRONG, ev["detail"], "verify", evidence={"verify": ev["evidence"]},
                                seconds=ev["seconds"])
                if not serve_anyway:
                    srv.close()
                    return Start(None, wrong, loaded, ev)
        elif kind == "serving":
            if not srv.wait_healthy():
                detail = srv.exit_detail() if srv.proc.poll() is not None else "no /health answer in 60 s"
                srv.close()
                return Start(None, Verdict(Outcome.CRASHED, f"serve: {detail}: {srv.tail()}", "serve"), loaded)
            return Start(srv, wrong, loaded, verified)
        elif kind == "exit":
            detail = srv.exit_detail()
            srv.close()
            return Start(None, Verdict(Outcome.CRASHED, f"{stage}: the engine process died ({detail}): {srv.tail()}",
                                       stage), loaded)


class ServingRunner:
    """Designs served for real (the runner seam's ``Runner``): ``store_url`` is the tune's store,
    where a design's ``champion:...@ID`` kernels come from."""

    def __init__(self, store_url: str | None):
        self.store_url = store_url
        self.reference: Path | None = None
        self.workdir: Path | None = None

    def open(self, model_path: Path, deadline: float, log: Callable[[str], None]) -> None:
        """The HF fp32 reference for ``model_path`` (computed here once per model file, a run with
        no time left only closes) and a work directory for the designs' configs."""
        from swarmfactory.hardware import cache_dir

        from .verify import reference_path

        cache = cache_dir() / "engine-reference"
        self.reference = reference_path(model_path, cache)
        if not self.reference.exists() and deadline > time.monotonic():
            log(f"reference: HF transformers fp32 on {model_path.name} (once per model file, ~30 s)")
            env = dict(os.environ, TQDM_DISABLE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       TRANSFORMERS_VERBOSITY="error")
            out = subprocess.run([sys.executable, "-m", "swarmfactory.enginefactory.worker", "--make-reference",
                                  str(model_path), str(cache)], env=env, capture_output=True, text=True)
            if out.returncode != 0 or not self.reference.exists():
                raise RunnerError(f"the HF fp32 reference could not be computed: {out.stderr.strip()[-800:]}")
        self.workdir = Path(lifecycle.temp_dir("sf-tune-"))

    def start(self, config: EngineConfig, serve_anyway: bool = False) -> Start:
        return start_design(config, self.reference, self.workdir, serve_anyway=serve_anyway, store_url=self.store_url)

    def close(self) -> None:
        if self.workdir is not None:
            lifecycle.remove_dir(str(self.workdir))
            self.workdir = None
