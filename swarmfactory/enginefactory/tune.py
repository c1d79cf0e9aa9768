"""`engine tune`: search engine designs on this machine, keep the best verified one as a profile.

The loop is the kernel factory's (``swarm/contract.py``: the Tuner is a ``Factory`` that
proposes, keys and evaluates designs; ``drive`` owns dedupe, budget and deadline): agents
propose designs (design.py), duplicates are dropped by content hash, each new design is built,
verified end to end (verify.py) and only then measured over HTTP the way users measure a
server (bench/serving.py: closed-loop streaming clients at each requested concurrency, for each
workload, the same seeded prompts for every design). Every design gets a verdict in the
evidence store: ``wrong`` (with the prompt and token where it diverged), ``crashed``,
``timed_out``, ``not_faster``, ``faster``, or ``inconclusive``: measured on a busy machine (at
some level other processes kept more than ``contention.BUSY`` of the CPUs through the level's
repeats, bench/serving.py), so no verdict on its speed: never the champion or the profile, not
learnt from, measured again by a later tune; its ``evidence["contention"]`` says what it ran under.

Fitness is the user's target: the geometric mean of output tok/s over every (workload,
concurrency) pair, with an optional TTFT p99 ceiling a design must respect at every pair. The
default design (what ``engine serve`` runs without a profile) is measured first and is the
baseline. A design that beats the champion on its first measurement is confirmed in a second
round, champion and challenger measured again back to back; it takes over only if it wins both
rounds by more than ``min_effect``, and the range of its two ratios is its CI. A serving
measurement costs tens of seconds, so proposals are ranked by a cost model (a nearest-neighbour
estimate of the fitness ratio from the designs measured so far, plus a bonus for unexplored
regions) and only the most promising one is measured.

At the end the champion is stored as this machine's profile for the model (the evidence store's
champion row for the problem ``engine:<model>``); ``engine serve`` picks it up (profiles.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import yaml
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swarmfactory import lifecycle
from swarmfactory.agents.base import candidate_record
from swarmfactory.contention import BUSY
from swarmfactory.engine.config import EngineConfig
from swarmfactory.harness.outcome import Outcome, Verdict
from swarmfactory.swarm.contract import Factory, done_future, drive

from . import design as D

VALIDATION_VERSION = "engine-verify-v1"
LOAD_TIMEOUT_S = 600.0      # load + verification of one design
LEVEL_TIMEOUT_S = 900.0     # one serving level
SCREEN_CAP = 3.0           # a screening level taking this many times the default design's is cut short
SCREEN_SLACK_S = 10.0      # ... plus this
GRACE_S = 60.0              # a design measured past the run's deadline by more than this is stopped


class OutOfTime(Exception):
    """A measurement the run's time limit cut short (not the design's fault)."""


class TooSlow(Exception):
    """A screening level that ran past its cap: the design is far slower than the bar."""


class TuneError(ValueError):
    """A tune run that cannot start or resume; the message says why."""


@dataclass(frozen=True)
class TuneConfig:
    model: str | None = None
    weights: str = "q4_1"
    concurrency: tuple[int, ...] = (1, 16)
    workloads: tuple[tuple[int, int], ...] = ((128, 128), (1024, 128))
    prompts_per_stream: int = 2          # prompts per level = max(4, this x concurrency)
    time_s: float = 1200.0
    budget: int | None = None            # most designs to evaluate (None: time decides)
    ttft_p99_s: float | None = None      # ceiling at every level; None: none
    min_effect: float = 0.03
    seed: int = 0
    fixed: tuple[tuple[str, object], ...] = ()   # knobs the deployment fixes (e.g. threads)
    screen: float | None = 0.10          # screening: a design whose short first measurement is more than
                                         # this fraction below the champion's is not measured in full

    def __post_init__(self):
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise TuneError(f"concurrency levels must be >= 1, got {list(self.concurrency)}")
        for i, o in self.workloads:
            if i < 1 or o < 2:
                raise TuneError(f"a workload needs >= 1 input and >= 2 output tokens, got {i}x{o}")
        if self.weights not in ("fp32", "bf16", "q4_1"):
            raise TuneError(f"weights must be fp32, bf16 or q4_1, got {self.weights!r}")
        if self.time_s <= 0:
            raise TuneError("time must be positive")
        for name, val in self.fixed:
            if name not in D.KNOBS:
                raise TuneError(f"unknown design knob {name!r} (known: {', '.join(D.KNOBS)})")
            if val not in D.KNOBS[name]:
                raise TuneError(f"design knob {name}={val!r} is not one of {list(D.KNOBS[name])}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["concurrency"], d["workloads"] = list(self.concurrency), [list(w) for w in self.workloads]
        d["fixed"] = [list(f) for f in self.fixed]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TuneConfig":
        d = dict(d)
        d.pop("kind", None)
        d["concurrency"] = tuple(d["concurrency"])
        d["workloads"] = tuple(tuple(w) for w in d["workloads"])
        d["fixed"] = tuple(tuple(f) for f in d.get("fixed", ()))
        d.setdefault("screen", None)  # runs recorded before screening existed measured everything in full
        return cls(**d)

    def max_seq_len(self) -> int:
        return max(2048, max(i + o for i, o in self.workloads) + 16)

    def prompts(self, c: int) -> int:
        return max(4, self.prompts_per_stream * c)

    def screen_workloads(self) -> tuple[tuple[int, int], ...]:
        return self.workloads[:1]


def parse_workloads(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for item in text.split(","):
        a, sep, b = item.strip().lower().partition("x")
        if not sep or not a.isdigit() or not b.isdigit():
            raise TuneError(f"a workload is INPUTxOUTPUT tokens, e.g. 128x128; got {item.strip()!r}")
        out.append((int(a), int(b)))
    return tuple(out)


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise TuneError(f"concurrency is a comma list of integers, e.g. 1,16,64; got {text!r}") from None
    if not levels:
        raise TuneError("no concurrency level given")
    return levels


class EngineProblem:
    """The engine factory's problem: one model file, one serving target. Quacks like a kernel
    Problem where the evidence store needs one (name, version, spec_hash, signature)."""

    version = 1
    c_signature = "engine design: an EngineConfig (YAML)"

    def __init__(self, model_path: Path, model_sha256: str, cfg: TuneConfig):
        self.model_path, self.model_sha256, self.cfg = model_path, model_sha256, cfg
        self.name = f"engine:{model_path.stem}"
        self.description = (f"serving {model_path.name} ({cfg.weights}): output tok/s at concurrency "
                            f"{','.join(map(str, cfg.concurrency))}, workloads "
                            + ",".join(f"{i}x{o}" for i, o in cfg.workloads))

    def spec_hash(self) -> str:
        blob = json.dumps({"model": self.model_sha256, "weights": self.cfg.weights,
                           "concurrency": list(self.cfg.concurrency),
                           "workloads": [list(w) for w in self.cfg.workloads],
                           "ttft_p99_s": self.cfg.ttft_p99_s, "fixed": [list(f) for f in self.cfg.fixed]},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def fitness(serving: dict, ceiling: float | None) -> tuple[float, str | None]:
    """Geometric mean output tok/s over every measured pair; the reason a ceiling was broken."""
    rates, over = [], None
    for wl, levels in serving.items():
        for lv in levels:
            if lv["errors"] or lv["completed"] == 0:
                return 0.0, f"{wl} c={lv['concurrency']}: {lv['errors']} failed requests"
            rates.append(max(lv["output_tok_s"], 1e-9))
            if ceiling is not None and lv["ttft_ms_p99"] > ceiling * 1000 and over is None:
                over = f"{wl} c={lv['concurrency']}: TTFT p99 {lv['ttft_ms_p99'] / 1000:.2f} s > {ceiling:g} s"
    return math.exp(sum(map(math.log, rates)) / len(rates)), over


def serving_contention(serving: dict | None) -> dict | None:
    """What a measurement's levels (``{workload: [level, ...]}``) were measured under, for the
    verdict's ``evidence["contention"]`` (bench/serving.py ``worst_contention``: ``suffered`` is the
    worst level's share of the CPUs other processes took, ``busy`` that a level stayed busy after
    its repeats); None where nothing was recorded."""
    from swarmfactory.bench.serving import worst_contention

    levels = [dict(lv, concurrency=f"{wl} c={lv.get('concurrency')}" if wl else lv.get("concurrency"))
              for wl, lvs in (serving or {}).items() for lv in lvs]
    return worst_contention(levels)


def busy_detail(cont: dict | None) -> str:
    """``inconclusive: measured on a busy machine (...)`` for a verdict's detail."""
    c = cont or {}
    share = c.get("suffered")
    where = ", ".join(str(x) for x in c.get("busy_levels") or []) or "a level"
    return (f"measured on a busy machine: other processes took "
            f"{'an unknown share' if share is None else f'{share:.0%}'} of the CPUs at {where} "
            f"(over {BUSY:.0%}, after repeats); not confirmed either way")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: a tune killed with -9 takes its design servers with it."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# -- one design in its own process --------------------------------------------------------------
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
        if store_url:  # champion:...@ID kernels are looked up in the tune's store
            env["SWARMFACTORY_STORE"] = store_url
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "swarmfactory.enginefactory.worker", "--config", str(path),
             "--reference", str(reference), "--port", str(self.port)] + (["--serve-anyway"] if serve_anyway else []),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
            preexec_fn=_die_with_parent)
        lifecycle.adopt(self.proc.pid, "engine design server")
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

        from swarmfactory.bench.serving import REPEAT_SEED, ServingMeter, make_prompts, measure_level_async, run_level

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
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.returncode is not None:
            lifecycle.release(self.proc.pid)


@dataclass
class Start:
    """What a design's worker said before measuring: a verdict if it failed, else the server."""

    server: DesignServer | None
    verdict: Verdict | None
    loaded: dict = field(default_factory=dict)
    verified: dict = field(default_factory=dict)


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


# -- the cost model -------------------------------------------------------------------------------
def predict(knobs: dict, seen: list[tuple[dict, float]], k: int = 3) -> tuple[float, float]:
    """(estimated log fitness ratio, distance to the nearest measured design)."""
    if not seen:
        return 0.0, 1.0
    x = D.features(knobs)
    dist = sorted((math.dist(x, D.features(kn)), r) for kn, r in seen)
    near = dist[:k]
    w = [1.0 / (d + 1e-3) for d, _ in near]
    return sum(wi * math.log(max(r, 1e-6)) for wi, (_, r) in zip(w, near)) / sum(w), dist[0][0]


# -- the loop -------------------------------------------------------------------------------------
@dataclass
class Entry:
    design: D.Design
    ratio: float            # fitness / default fitness (0 when wrong or failed)
    fitness: float
    evaluation_id: int | None = None
    screen: float | None = None  # fitness on the screening measurement (tok/s geomean)
    screen_levels: dict | None = None  # its levels (the default design's: the screening caps)


class NullProgress:
    def start(self, run_id: str, time_s: float, budget: int | None): ...
    def update(self, done: int, best: float, note: str): ...
    def stop(self): ...


class Tuner(Factory):
    def __init__(self, cfg: TuneConfig | None, store, resume: str | None = None, progress=None, log=None,
                 llm=None):
        """``llm``: a DesignLLM (llm_designs.py) that proposes designs too, or None."""
        from swarmfactory.engine.gguf_loader import resolve_model_path

        from .verify import model_digest

        self.store, self.progress = store, progress or NullProgress()
        self.llm = llm
        self._log = log or (lambda msg: None)
        self.t0 = time.monotonic()
        if resume:
            row = store.run(resume)
            if row is None:
                raise TuneError(f"no run {resume!r} in {store.shown}")
            if row["config"].get("kind") != "engine-tune":
                raise TuneError(f"run {resume} is a kernel run; resume it with swarmfactory run --resume")
            if row["status"] == "finished":
                raise TuneError(f"run {resume} already finished; start a new one (its designs are not re-measured)")
            cfg = TuneConfig.from_dict(row["config"])
        self.cfg, self.run_id = cfg, resume
        try:
            self.model_path = resolve_model_path(cfg.model)
        except Exception as e:  # ModelNotFound and friends
            raise TuneError(str(e)) from None
        self.problem = EngineProblem(self.model_path, model_digest(self.model_path), cfg)
        self.base = EngineConfig(model=cfg.model, weights=cfg.weights, max_seq_len=cfg.max_seq_len())
        # the kernel factory's champions here: designs with kernels=champion / matvec=champion pin them
        from swarmfactory.engine.native_seam import current_champion

        self.champions = {p: c for p in D.CHAMPION_KNOBS.values()
                          if cfg.weights == "q4_1" and (c := current_champion(p, store))}
        self.fixed = dict(cfg.fixed)
        for knob, problem in D.CHAMPION_KNOBS.items():
            if problem in self.champions:
                continue
            if self.fixed.get(knob) == "champion":
                raise TuneError(f"{knob}=champion: no {problem} champion on this hardware in {store.shown} "
                                f"(swarmfactory run --problems {problem} makes one)")
            self.fixed[knob] = "builtin"
        self.queue: list[tuple[D.Design, str, list[str]]] = []  # designs to evaluate before any new proposal
        self.outcomes: dict[str, tuple[str, str]] = {}  # design key -> (outcome, detail): what the LLM is shown
        self.rationale: dict[str, str] = {}  # design key -> the LLM's reason for proposing it
        self.rng = random.Random(f"{cfg.seed}:{resume or ''}")
        self.entries: list[Entry] = []
        self.seen: set[str] = set()
        self.default: Entry | None = None
        self.champion: Entry | None = None
        self.evaluated = 0
        self.inconclusive = 0  # designs measured on a busy machine this session (no verdict on their speed)
        self.default_busy = False  # the default design's figures were measured on a busy machine

    def log(self, msg: str) -> None:
        m, sec = divmod(int(time.monotonic() - self.t0), 60)
        self._log(f"[{m:02d}:{sec:02d}] {msg}")

    def _build(self, knobs: dict) -> D.Design:
        return D.build({**knobs, **self.fixed}, self.base, self.champions)

    # -- records ----------------------------------------------------------------------------------
    def _record(self, design: D.Design, verdict: Verdict, agent: str, operator: str, parents: list[str],
                purpose: str = "search") -> int:
        cand = candidate_record(self.problem, design.config.to_yaml(), agent, operator, backend="engine",
                                knobs=design.knobs, parents=parents, run_id=self.run_id)
        cand["id"] = design.key
        self.outcomes[design.key] = (verdict.outcome.value, verdict.detail)
        if design.key in self.rationale:
            verdict.evidence.setdefault("rationale", self.rationale[design.key])
        verdict.evidence.setdefault("model_sha256", self.problem.model_sha256)
        verdict.evidence.setdefault("design", design.describe())
        return self.store.record_verdict(self.problem, cand, verdict, self.run_id, VALIDATION_VERSION, purpose)

    def _prior(self) -> None:
        """Designs this store already evaluated for this problem on this hardware: never again."""
        for ev in self.store.evaluations(problem=self.problem.name, this_hardware=True):
            if ev["problem_spec"] != self.problem.spec_hash():
                continue
            cand = self.store.candidate(ev["candidate_id"])
            if not cand or not cand.get("knobs"):
                continue
            if ev["outcome"] == "inconclusive":
                # measured on a busy machine: no verdict on its speed; an earlier run's is measured
                # again (this run's, on resume, is not: it is this run's answer)
                if ev["run_id"] == self.run_id:
                    self.seen.add(ev["candidate_id"])
                continue
            self.seen.add(ev["candidate_id"])
            if ev["purpose"] != "search":
                continue
            try:  # the design as it was evaluated (a pinned kernel champion included)
                design = D.Design({**D.DEFAULT_KNOBS, **cand["knobs"]},
                                  EngineConfig.from_dict(yaml.safe_load(cand["source"])))
            except Exception:
                continue
            ratio = ev["speedup"] if ev["outcome"] in ("faster", "not_faster") and ev["speedup"] else 0.0
            evidence = ev["evidence"] or {}
            self.entries.append(Entry(design, ratio, evidence.get("fitness", 0.0), ev["id"],
                                      evidence.get("screen_fitness")))
        champ = self.store.champion(self.problem)  # the profile so far: what a newcomer must beat
        self.prior_champion = next((e for e in self.entries if champ and e.design.key == champ["candidate_id"]
                                    and e.fitness > 0), None)
        self._requalify()

    def _requalify(self) -> None:
        """Designs that ran an earlier kernel champion: the same design on today's champion is
        verified and measured first (the profile's first, then the best others), so a new kernel
        reaches the engine only through the end-to-end checks, and an engine never serves a
        kernel it was not verified with."""
        stale = [e for e in self.entries if e.ratio > 0
                 and any(self.champions.get(p) != cid for p, cid in e.design.pins.items())]
        stale.sort(key=lambda e: (e is not self.prior_champion, -e.ratio))
        for e in stale[:3]:
            try:  # the same knobs on today's champions (a knob whose champion is gone falls back to builtin)
                design = self._build(e.design.knobs)
            except Exception:
                design = None
            if design is not None and self._is_new(design):
                self.queue.append((design, "requalify", [e.design.key]))
        if stale:
            now = ", ".join(f"{p} {c[:12]}" for p, c in self.champions.items()) or "none"
            self.log(f"{len(stale)} design(s) ran kernel-factory candidates that are no longer the champions here "
                     f"(now: {now}): {len(self.queue)} queued for re-verification")

    # -- evaluation ---------------------------------------------------------------------------------
    def _evaluate(self, design: D.Design, workdir: Path, note: str,
                  baseline: bool = False) -> tuple[Verdict, DesignServer | None]:
        t0 = time.perf_counter()
        start = start_design(design.config, self.reference, workdir, serve_anyway=baseline, store_url=self.store.url)
        if start.server is None:
            start.verdict.seconds = time.perf_counter() - t0
            start.verdict.evidence.setdefault("paths", start.loaded.get("paths"))
            return start.verdict, None
        srv = start.server
        on_level = lambda wl, lv: self.progress.update(  # noqa: E731
            self.evaluated, self._best_ratio(), f"{note}: {wl} c={lv['concurrency']} {lv['output_tok_s']:.1f} tok/s")
        screen, screen_fit = None, None

        def screened_out(detail: str, cont: dict | None, **evidence) -> tuple[Verdict, None]:
            srv.close()
            ev = {**evidence, "screened_out": True, "fitness": 0.0, "paths": start.loaded.get("paths"),
                  "verify": start.verified.get("evidence", {})}
            if cont is not None:
                ev["contention"] = cont
            if cont is not None and cont["busy"]:  # slow while other work held the CPUs: not a verdict
                ev["screened_out"] = False
                return Verdict(Outcome.INCONCLUSIVE, f"{busy_detail(cont)}; the short measurement would have "
                               f"screened it out: {detail}", "measure", seconds=time.perf_counter() - t0,
                               cases_checked=3, evidence=ev), None
            return Verdict(Outcome.NOT_FASTER, f"screened out: {detail}", "measure", seconds=time.perf_counter() - t0,
                           cases_checked=3, evidence=ev), None

        # repeats of a disturbed level stay inside the run's time (the baseline's included)
        repeat_until = self.deadline if baseline else self.deadline + GRACE_S
        try:
            if self.cfg.screen is not None:
                try:
                    screen = srv.measure(self.cfg, on_level=on_level, screen=True, caps=None if baseline else
                                         self._screen_caps(), deadline=None if baseline else self.deadline + GRACE_S,
                                         repeat_deadline=repeat_until)
                except TooSlow as e:
                    cut = getattr(e, "contention", None)  # what the level it cut short ran under
                    return screened_out(f"{e} on the short measurement (the cap: {SCREEN_CAP:g}x the default "
                                        "design's time for that level)",
                                        None if cut is None else serving_contention({"": [{
                                            "concurrency": str(e).split(" took", 1)[0], "contention": cut}]}),
                                        too_slow=str(e))
                screen_fit, _ = fitness(screen, None)
                bar = self._screen_bar()
                if not baseline and bar and screen_fit < bar * (1 - self.cfg.screen):
                    ratio = screen_fit / self.default.screen if self.default and self.default.screen else 0.0
                    return screened_out(f"{screen_fit:.1f} tok/s on the short measurement, more than "
                                        f"{self.cfg.screen:.0%} under the champion's {bar:.1f} (~{ratio:.2f}x the "
                                        "default)", serving_contention(screen), screen=screen,
                                        screen_fitness=screen_fit)
            serving = srv.measure(self.cfg, on_level=on_level, deadline=None if baseline else self.deadline + GRACE_S,
                                  repeat_deadline=repeat_until)
            if baseline and screen is not None:
                # the bar every design's short figure is held to: measured a second time, after the
                # full measurement, and the faster of the two kept (a bar measured while other work
                # held the CPU would let slow designs through: seen on the first screened run)
                again = srv.measure(self.cfg, on_level=on_level, screen=True, repeat_deadline=repeat_until)
                again_fit, _ = fitness(again, None)
                if again_fit > screen_fit:
                    screen, screen_fit = again, again_fit
        except OutOfTime as e:
            srv.close()
            return Verdict(Outcome.NOT_FASTER, f"not measured to the end: {e}", "measure",
                           seconds=time.perf_counter() - t0, evidence={"out_of_time": True}), None
        except Exception as e:  # noqa: BLE001 - a server that dies or hangs while measured
            srv.close()
            outcome = Outcome.TIMED_OUT if isinstance(e, TimeoutError) else Outcome.CRASHED
            return Verdict(outcome, f"measure: {type(e).__name__}: {e}", "measure",
                           seconds=time.perf_counter() - t0), None
        caught = srv.audit_failure()
        if caught:  # its figures are not the design's: the rest ran on the engine's own kernels
            srv.close()
            return Verdict(Outcome.WRONG, f"a kernel of the design failed the engine's audit while serving: {caught}",
                           "measure", seconds=time.perf_counter() - t0,
                           evidence={"kernel_audit": caught, "paths": start.loaded.get("paths")}), None
        fit, over = fitness(serving, self.cfg.ttft_p99_s)
        cont = serving_contention(serving)  # the figures the verdict rests on: the full measurement
        if start.verdict is not None:  # the baseline, measured although it failed verification
            start.verdict.evidence.update(serving=serving, fitness=fit, paths=start.loaded.get("paths"),
                                          screen=screen, screen_fitness=screen_fit)
            if cont is not None:
                start.verdict.evidence["contention"] = cont
            start.verdict.seconds = time.perf_counter() - t0
            return start.verdict, srv
        ev = {"serving": serving, "fitness": fit, "screen": screen, "screen_fitness": screen_fit,
              "paths": start.loaded.get("paths"),
              "load_seconds": start.loaded.get("seconds"), "verify": start.verified.get("evidence", {}),
              "verify_detail": start.verified.get("detail", ""), "over_ceiling": over}
        if cont is not None:
            ev["contention"] = cont
        busy = cont is not None and cont["busy"]  # not confirmed: no verdict on its speed (_judge)
        return Verdict(Outcome.INCONCLUSIVE if busy else Outcome.NOT_FASTER,
                       busy_detail(cont) if busy else (over or ""), "measure", evidence=ev, cases_checked=3,
                       seconds=time.perf_counter() - t0, baseline="default design"), srv

    def _best_ratio(self) -> float:
        return self.champion.ratio if self.champion else 0.0

    def _screen_caps(self) -> dict:
        """(workload, concurrency) -> seconds a screening level may take: SCREEN_CAP times the
        default design's (a level that slow cannot come within the screen's margin of it)."""
        screen = (self.default.screen_levels if self.default else None) or {}
        return {(wl, lv["concurrency"]): SCREEN_CAP * lv["duration_s"] + SCREEN_SLACK_S
                for wl, levels in screen.items() for lv in levels}

    def _screen_bar(self) -> float | None:
        """The screening figure a design must come near: the champion's (or, while none is
        verified, the default design's); a champion from an earlier session is rescaled by its
        ratio to today's default."""
        against = self.champion or self.default
        if against is None or not self.default or not self.default.screen:
            return None
        return against.screen or against.ratio * self.default.screen

    def _is_new(self, design: D.Design) -> bool:
        """Neither evaluated (this run or an earlier one here) nor already queued."""
        return design.key not in self.seen and all(design.key != q[0].key for q in self.queue)

    def _measured(self) -> list[dict]:
        """The designs measured so far, as the design LLM is shown them."""
        rows = []
        for e in self.entries + ([self.default] if self.default and self.default not in self.entries else []):
            outcome, detail = self.outcomes.get(e.design.key, ("not_faster" if e.ratio else "wrong", ""))
            rows.append({"knobs": e.design.knobs, "verdict": outcome, "ratio": e.ratio, "detail": detail})
        return rows

    def _ask_llm(self) -> None:
        """Queue the design LLM's finished proposals (valid, new, and for q4_1 batch invariant)
        and start its next call; it never waits for the model."""
        if self.llm is None:
            return
        for prop in self.llm.ready():
            try:
                design = self._build(prop.knobs)
            except Exception as e:  # noqa: BLE001 - a refused combination is dropped, with the reason
                self.log(f"{self.llm.name}: proposal dropped: {e}")
                continue
            if not self._is_new(design):
                continue
            if self.cfg.weights == "q4_1" and not D.batch_invariant(design.knobs):
                self.log(f"{self.llm.name}: proposal dropped: not batch invariant ({design.describe()})")
                continue
            self.rationale[design.key] = prop.rationale
            self.queue.append((design, self.llm.name, []))
        self.llm.submit(D.KNOBS, self._measured(), self.fixed, 3)

    def _champion_swap(self) -> tuple[D.Design, str, list[str]] | None:
        """The best verified design with a kernel-factory champion plugged in, for each champion
        knob no design of this problem has tried yet: what a new kernel does for the engine is
        measured early instead of waiting for a random draw."""
        best = max((e for e in self.entries if e.ratio > 0), key=lambda e: e.ratio, default=None)
        if best is None:
            return None
        for knob in D.CHAMPION_KNOBS:
            if self.fixed.get(knob) or any(e.design.knobs.get(knob) == "champion" for e in self.entries):
                continue
            knobs = {**best.design.knobs, knob: "champion"}
            if self.cfg.weights == "q4_1":
                knobs = D.make_invariant(knobs, self.rng)
            try:
                design = self._build(knobs)
            except Exception:  # noqa: BLE001 - a combination the engine refuses
                continue
            if design.knobs.get(knob) == "champion" and design.key not in self.seen:
                return design, "champion", [best.design.key]
        return None

    def _propose(self) -> tuple[D.Design, str, list[str]] | None:
        self._ask_llm()
        while self.queue:
            item = self.queue.pop(0)
            if item[0].key not in self.seen:
                return item
        swap = self._champion_swap()
        if swap is not None:
            return swap
        ok = sorted((e for e in self.entries if e.ratio > 0), key=lambda e: -e.ratio)
        seen_knobs = [(e.design.knobs, e.ratio) for e in self.entries]
        if self.default is not None and self.default not in self.entries:  # measured, though not verified
            seen_knobs.append((self.default.design.knobs, 1.0))
        pool: list[tuple[D.Design, str, list[str]]] = []
        for _ in range(60):
            r = self.rng.random()
            if ok and r < 0.55:
                parent = ok[0] if self.rng.random() < 0.7 else self.rng.choice(ok[:4])
                knobs, agent, parents = D.mutate(parent.design.knobs, self.rng, 1 + (self.rng.random() < 0.3)), \
                    "knobs", [parent.design.key]
                if D.batch_invariant(parent.design.knobs) and self.rng.random() < 0.7:
                    knobs = D.make_invariant(knobs, self.rng)  # stay in the region that verifies
            elif len(ok) >= 2 and r < 0.75:
                a, b = self.rng.sample(ok[:4], 2)
                knobs, agent, parents = D.crossover(a.design.knobs, b.design.knobs, self.rng), "crossover", \
                    [a.design.key, b.design.key]
            elif r < 0.9:
                knobs, agent, parents = D.make_invariant(D.random_knobs(self.rng), self.rng), "invariant", []
            else:
                knobs, agent, parents = D.random_knobs(self.rng), "explore", []
            try:
                design = self._build(knobs)
            except Exception:
                continue  # a combination the engine refuses: not a design
            if design.key in self.seen or any(design.key == p[0].key for p in pool):
                continue
            if self.cfg.weights == "q4_1" and not D.batch_invariant(design.knobs):
                # mixes kernels by batch size: it gives some prompt other tokens under load even
                # where the verifier's prompts show no flip; not worth a measurement
                continue
            pool.append((design, agent, parents))
            if len(pool) >= 16:
                break
        if not pool:
            return None
        def score(item):
            est, dist = predict(item[0].knobs, seen_knobs)
            return est + 0.15 * dist  # optimism where nothing was measured yet
        return max(pool, key=score)

    def _confirm(self, challenger: Entry, ch_srv: DesignServer, workdir: Path,
                 against: Entry) -> tuple[bool, float, float, dict | None]:
        """``against`` (the champion, or the default design) and the challenger measured again
        back to back; both rounds must favour the challenger by min_effect. Returns (won, low
        ratio, high ratio) of challenger over ``against``, and the contention of the second round
        (``serving_contention`` of both measurements; busy: no verdict, the caller's to say)."""
        first = challenger.fitness / against.fitness
        deadline = self.deadline + GRACE_S  # like any measurement: OutOfTime past it (not confirmed)
        start = start_design(against.design.config, self.reference, workdir, serve_anyway=against is self.default,
                             store_url=self.store.url)
        if start.server is None:  # it no longer starts: the challenger wins by default
            return True, first, first, None
        try:
            base = start.server.measure(self.cfg, deadline=deadline)
        finally:
            start.server.close()
        base_fit, _ = fitness(base, self.cfg.ttft_p99_s)
        again = ch_srv.measure(self.cfg, deadline=deadline)
        ch_fit, over = fitness(again, self.cfg.ttft_p99_s)
        second = ch_fit / base_fit if base_fit else float("inf")
        lo, hi = min(first, second), max(first, second)
        cont = serving_contention({**{f"{k} (against)": v for k, v in base.items()},
                                   **{f"{k} (again)": v for k, v in again.items()}})
        return (over is None and lo > 1 + self.cfg.min_effect), lo, hi, cont

    def run(self) -> str:
        from swarmfactory.engine.calibrate import cache_root

        from .verify import reference_path

        if self.run_id is None:
            self.run_id = self.store.create_run({"kind": "engine-tune", **self.cfg.to_dict()})
        else:
            self.store.set_run_status(self.run_id, "running")
        self.store.record_problem(self.problem)
        if self.llm is not None:
            self.llm.bind(self.store, self.run_id, self.problem.name)
        spent = 0.0
        for ev in self.store.evaluations(problem=self.problem.name, run_id=self.run_id):
            spent += ev["seconds"] or 0.0  # a resumed run keeps the budget it had left
            self.evaluated += ev["purpose"] == "search"
            self.inconclusive += ev["purpose"] == "search" and ev["outcome"] == "inconclusive"
        # the deadline runs from here: the reference (below, once per model file) and the default
        # design's measurement (the baseline) are spent from --time like every design
        deadline = time.monotonic() + max(0.0, self.cfg.time_s - spent)
        self.deadline = deadline
        cache = cache_root().parent / "engine-reference"
        self.reference = reference_path(self.model_path, cache)
        if not self.reference.exists() and deadline > time.monotonic():  # a run with no time left only closes
            self.log(f"reference: HF transformers fp32 on {self.model_path.name} (once per model file, ~30 s)")
            # in a child: HF's memory and progress bars stay out of this process
            env = dict(os.environ, TQDM_DISABLE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       TRANSFORMERS_VERBOSITY="error")
            out = subprocess.run([sys.executable, "-m", "swarmfactory.enginefactory.worker", "--make-reference",
                                  str(self.model_path), str(cache)], env=env, capture_output=True, text=True)
            if out.returncode != 0 or not self.reference.exists():
                raise TuneError(f"the HF fp32 reference could not be computed: {out.stderr.strip()[-800:]}")
        self._prior()
        self.progress.start(self.run_id, self.cfg.time_s, self.cfg.budget)
        status = "interrupted"
        try:
            if deadline <= time.monotonic():
                self.log(f"run {self.run_id} has no time left ({spent:.0f} s of {self.cfg.time_s:.0f} s spent): "
                         "closing it")
            else:
                with tempfile.TemporaryDirectory(prefix="sf-tune-") as tmp:
                    self._loop(Path(tmp), deadline)
            status = "finished"
        finally:
            self.progress.stop()
            if self.llm is not None:
                self.llm.close()
            self.store.set_run_status(self.run_id, status)
        return self.run_id

    def _loop(self, workdir: Path, deadline: float) -> None:
        default = self._build({})
        verdict, srv = self._evaluate(default, workdir, "default design", baseline=True)
        if srv:
            srv.close()
        fit = verdict.evidence.get("fitness", 0.0)
        from swarmfactory.evidence.quality import busy

        self.default_busy = bool(fit) and busy(verdict.evidence)
        if fit and verdict.outcome.correct:
            verdict.speedup = verdict.ci_low = verdict.ci_high = 1.0
            verdict.detail = verdict.detail or f"the default design: {fit:.1f} tok/s (geomean)"
            if self.default_busy:  # still the baseline (the figure there is), never the profile
                verdict.detail += " (the baseline all the same)"
        elif fit:  # failed verification, measured as the baseline users run today
            verdict.detail += f" (measured anyway as the baseline: {fit:.1f} tok/s geomean)"
        eid = self._record(default, verdict, "default", "baseline", [], purpose="baseline")
        self.seen.add(default.key)
        if not fit:
            raise TuneError(f"the default design could not be measured on this machine: {verdict.outcome.value}: "
                            f"{verdict.detail}")
        self.default = Entry(default, 1.0, fit, eid, verdict.evidence.get("screen_fitness"),
                             verdict.evidence.get("screen"))
        self.default_ok = verdict.outcome.correct
        # the champion is the best *verified* design; the default counts only if it passed
        self.champion = self.default if self.default_ok else None
        prior = getattr(self, "prior_champion", None)
        if prior is not None and (self.champion is None or prior.ratio > 1.0):
            # measured in an earlier session: its ratio carries over, its fitness is rescaled to today's default
            prior.fitness = prior.ratio * fit
            prior.screen = None  # likewise its screening bar (_screen_bar)
            self.champion = prior
        if self.default_ok:
            self.entries.append(self.default)
        self.log(f"default design: {verdict.outcome.value}, {fit:.1f} tok/s (geomean over {self._pairs()} pairs)"
                 + ("" if self.default_ok and not self.default_busy else f"; {verdict.detail}"))
        self._workdir, self._costs, self._stop, self._pending = workdir, [], False, {}
        drive(self, budget=self.cfg.budget, deadline=deadline, done=self.evaluated)
        if self.champion is None:
            self.log("no design passed verification: no profile stored")
        elif self.champion is self.default and self.default_busy:
            self.log("the default design was measured on a busy machine: not stored as the profile")
        elif self.champion is self.default:
            self.store.set_champion(self.problem, self.default.design.key, self.default.evaluation_id, 1.0,
                                    self.run_id, "no design beat the default design on this machine")
        self.log(self.busy_summary())

    def busy_summary(self) -> str:
        """The run's last word on contention: how many designs were inconclusive (busy machine)."""
        return (f"{self.inconclusive} design(s) inconclusive because the machine was busy (other processes took "
                f"over {BUSY:.0%} of the CPUs at a level after its repeats; a later tune measures them again)"
                + ("; the default design's figures were measured on a busy machine too" if self.default_busy else ""))

    # -- the contract the loop drives (swarm/contract.py): a proposal is (design, agent, parents) --
    def key(self, prop) -> str:
        return prop[0].key

    def propose(self):
        costs = self._costs  # seconds per design so far: one that cannot finish in time is not started
        if costs and self.deadline - time.monotonic() < 0.75 * statistics.median(costs):
            self.log(f"{self.deadline - time.monotonic():.0f} s left, a design takes ~{statistics.median(costs):.0f} s: "
                     "stopping here")
            self._stop = True
            return None
        prop = self._propose()
        if prop is None:
            self.log("no new design left to try")
            self._stop = True
        return prop

    def finished(self) -> bool:
        return self._stop

    def submit(self, prop):
        """Verify and measure a design (and confirm it against the champion where it won its first
        round), in place: one design at a time owns the machine's CPUs."""
        design, agent, parents = prop
        t_design = time.monotonic()
        self.evaluated += 1
        note = f"design {self.evaluated}"
        self.progress.update(self.evaluated, self._best_ratio(), f"{note}: {design.describe()}")
        verdict, srv = self._evaluate(design, self._workdir, note)
        entry = Entry(design, 0.0, 0.0)
        if verdict.evidence.get("screened_out") and self.default.screen and verdict.outcome is Outcome.NOT_FASTER:
            # verified, measured briefly: the cost model learns its estimated ratio, not a failure
            if "screen_fitness" in verdict.evidence:
                entry.screen = verdict.evidence["screen_fitness"]
                entry.ratio = verdict.speedup = entry.screen / self.default.screen
            else:  # cut short: a level took SCREEN_CAP times the default's, so at most about 1/SCREEN_CAP
                entry.ratio = verdict.speedup = 1.0 / SCREEN_CAP
        new_champion = False
        try:
            if srv is not None:
                entry, new_champion = self._judge(design, verdict, srv, note)
        finally:
            if srv is not None:
                srv.close()
        self._pending[design.key] = (entry, new_champion, note)
        self._costs.append(time.monotonic() - t_design)
        return done_future(verdict)

    def _judge(self, design: D.Design, verdict: Verdict, srv, note: str) -> tuple[Entry, bool]:
        """A measured design against the champion (or the default): confirmed by a second round
        where it won the first. Sets the verdict's speedup, outcome and detail. A design measured
        on a busy machine (``inconclusive``, _evaluate) or confirmed on one is no verdict on its
        speed: never a champion, not learnt from (``complete``)."""
        fit = verdict.evidence["fitness"]
        entry = Entry(design, fit / self.default.fitness, fit, screen=verdict.evidence.get("screen_fitness"))
        verdict.speedup = entry.ratio
        verdict.ci_low = verdict.ci_high = entry.ratio
        if verdict.outcome is Outcome.INCONCLUSIVE:
            verdict.detail += f" (one round: {entry.ratio:.2f}x the default design)"
            return entry, False
        against = self.champion or self.default
        within = verdict.evidence.get("over_ceiling") is None
        new_champion = False
        if within and fit > against.fitness * (1 + self.cfg.min_effect):
            try:
                if self.deadline - time.monotonic() < 1.5 * verdict.seconds:
                    raise OutOfTime("two more measurements do not fit in the time left")
                won, lo, hi, cont = self._confirm(entry, srv, self._workdir, against)
                if cont is not None and cont["busy"]:  # the second round is no evidence either way
                    verdict.evidence["vs_champion"] = [lo, hi]
                    verdict.evidence["confirmation_contention"] = cont
                    verdict.evidence["contention"] = cont
                    verdict.outcome = Outcome.INCONCLUSIVE
                    verdict.detail = (f"{entry.ratio:.2f}x the default design, {lo:.2f}-{hi:.2f}x the "
                                      f"{'champion' if self.champion else 'default design'}; the confirmation was "
                                      + busy_detail(cont))
                    return entry, False
            except OutOfTime as e:
                won, lo = False, entry.fitness / against.fitness
                hi = lo
                verdict.evidence["unconfirmed"] = str(e)
                self.log(f"{note}: {lo:.2f}x the {'champion' if self.champion else 'default'} in one "
                         f"round, not confirmed ({e}); a longer --time would confirm it")
            verdict.evidence["vs_champion"] = [lo, hi]
            if won:
                verdict.outcome = Outcome.FASTER
                verdict.ci_low, verdict.ci_high = lo * against.ratio, hi * against.ratio
                verdict.detail = (f"{entry.ratio:.2f}x the default design; beat the "
                                  f"{'champion' if self.champion else 'default design'} "
                                  f"twice ({lo:.2f}x, {hi:.2f}x)")
                new_champion = True
            else:
                verdict.detail = f"first round {lo:.2f}-{hi:.2f}x the champion; not confirmed"
        if not verdict.detail:
            verdict.detail = f"{entry.ratio:.2f}x the default design"
        if within and self.champion is None and not new_champion:  # the first verified design
            new_champion = True
            verdict.detail += " (the first verified design: the default failed verification)"
        return entry, new_champion

    def complete(self, prop, verdict: Verdict) -> None:
        design, agent, parents = prop
        entry, new_champion, note = self._pending.pop(design.key)
        entry.evaluation_id = self._record(design, verdict, agent, "mutate" if parents else "sample", parents)
        if verdict.evidence.get("out_of_time"):  # unknown, not bad: the cost model does not learn from it
            self.log(f"{note}: {verdict.detail}")
            self._stop = True
            return
        if verdict.outcome is Outcome.INCONCLUSIVE:  # likewise: measured on a busy machine
            self.inconclusive += 1
            self.log(f"{note} inconclusive: {verdict.detail} [{design.describe()}]")
            return
        self.entries.append(entry)
        self.log(f"{note} {verdict.outcome.value}: {verdict.detail} [{design.describe()}]")
        if new_champion:
            self.champion = entry
            self.store.set_champion(self.problem, design.key, entry.evaluation_id, entry.ratio, self.run_id,
                                    verdict.detail)

    def _pairs(self) -> int:
        return len(self.cfg.workloads) * len(self.cfg.concurrency)
