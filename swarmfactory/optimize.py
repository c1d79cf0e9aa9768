"""``swarmfactory optimize MODEL.gguf``: the whole stack re-optimised for one model.

Three stages, each a normal piece of the system run on the model's behalf:

1. **derive**: the kernel problems the model's engine runs, with its shapes and call mix
   (``problems/derive.py``), registered by name (``FAMILY.MODEL``).
2. **kernels**: the kernel swarm on those problems, one run per problem, in two passes. The
   problems taken are the largest estimated shares of the engine's time, until they hold
   ``cover`` of it (none under ``min_share``). Pass 1 splits two thirds of the stage's time by
   share; pass 2 splits the rest by share re-weighted by what pass 1 achieved (a problem whose
   champion is 2x faster now holds half its share), so the time goes where the engine's time
   still is. A problem whose slice would be under ``MIN_RUN_S`` gets none (its slice goes to the
   others).
3. **engine**: ``engine tune`` on the model with the rest of the time; its designs can plug in
   the new champions (``kernels=champion``: every block type with a champion, derived first;
   ``enginefactory/design.py``), each design verified end to end against the model's fp32
   reference and measured serving; the best is stored as this machine's profile, which
   ``engine serve --model MODEL`` picks.

The optimize run is a run of the store (``kind: optimize``): its configuration holds the plan and
every stage's progress (the run ids of its kernel runs and its tune run, written as each starts),
so ``optimize --resume ID`` after Ctrl-C or a kill -9 continues where it stopped: a finished
kernel run is not run again, an interrupted one is resumed with the time it had left, and so is
the tune run. The dashboard lists it with its children.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from swarmfactory.evidence.store import Store

KIND = "optimize"
STAGES = ("derive", "kernels", "engine")
MIN_RUN_S = 60.0  # a kernel run shorter than this spends its time on baselines
PASS_SHARE = (2 / 3, 1 / 3)  # of the kernel stage's time, per pass


class OptimizeError(ValueError):
    """A configuration or a run that cannot be optimised (the message says why)."""


@dataclass(frozen=True)
class OptimizeConfig:
    model: str
    time_s: float = 7200.0
    kernel_share: float = 0.6  # of the time for the kernel stage; the rest tunes the engine
    prompt: int = 128
    output: int = 128
    concurrency: tuple[int, ...] = (1, 16)
    cover: float = 0.95
    min_share: float = 0.01
    agents: str = "default"
    seed: int = 0
    min_run_s: float = MIN_RUN_S  # the shortest kernel run (shorter slices go to the others)

    def __post_init__(self):
        if self.time_s <= 0:
            raise OptimizeError("--time must be positive")
        if not 0 < self.kernel_share < 1:
            raise OptimizeError(f"--kernel-share must be between 0 and 1, got {self.kernel_share}")
        if not 0 < self.cover <= 1 or not 0 <= self.min_share < 1:
            raise OptimizeError("cover must be in (0, 1] and min_share in [0, 1)")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["concurrency"] = list(self.concurrency)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "OptimizeConfig":
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        d["concurrency"] = tuple(d.get("concurrency", (1, 16)))
        return cls(**d)


def split(budget: float, weights: dict[str, float], floor: float = MIN_RUN_S,
          floors: dict[str, float] | None = None) -> dict[str, float]:
    """``budget`` seconds split in proportion to ``weights``, no slice under its floor (``floors``
    per key, else ``floor``): the smallest slice under its floor is dropped until none is."""
    live = {k: w for k, w in weights.items() if w > 0}
    while live:
        total = sum(live.values())
        out = {k: budget * w / total for k, w in live.items()}
        under = [k for k in out if out[k] < max(floor, (floors or {}).get(k, 0.0))]
        if not under:
            return out
        del live[min(under, key=out.get)]
    return {}


@dataclass
class _State:
    """What the optimize run's configuration holds (written after every change)."""

    config: dict
    stage: str = "derive"
    derivation: dict | None = None
    problems: list[dict] = field(default_factory=list)  # {"name", "share"} in the order taken
    # {"problem", "pass", "budget_s", "run_id", "status" (planned, running, finished, skipped),
    #  "seconds" (what it took)}
    runs: list[dict] = field(default_factory=list)
    tune_run: str | None = None
    tune_status: str | None = None
    seconds: dict = field(default_factory=dict)  # stage -> wall seconds spent (over every session)

    def to_dict(self) -> dict:
        return {"kind": KIND, **asdict(self)}


class _Captured:
    """A progress object passed through, with the run id it is started with recorded at once."""

    def __init__(self, inner, on_start: Callable[[str], None]):
        self.inner, self.on_start = inner, on_start

    def start(self, run_id, *a, **kw):
        self.on_start(run_id)
        if self.inner is not None:
            self.inner.start(run_id, *a, **kw)

    def __getattr__(self, name):
        if self.inner is None:
            return lambda *a, **kw: None
        return getattr(self.inner, name)


class Optimizer:
    """One optimize run: ``run()`` goes through the stages left (see the module docstring).

    ``progress(stage)`` gives the progress object of a stage's child runs (None: none drawn);
    ``log`` receives one line per step."""

    def __init__(self, cfg: OptimizeConfig | None, store: Store, resume: str | None = None,
                 progress: Callable[[str], object] | None = None, log: Callable[[str], None] = print):
        self.store, self.log, self.progress = store, log, progress or (lambda stage: None)
        if resume:
            row = store.run(resume)
            if row is None:
                raise OptimizeError(f"no run {resume!r} in {store.shown}")
            if row.config.get("kind") != KIND:
                raise OptimizeError(f"run {resume} is not an optimize run (resume it with the command that started it)")
            if row.status == "finished":
                raise OptimizeError(f"run {resume} already finished; start a new one (its champions and profile stay)")
            data = {k: v for k, v in row.config.items() if k != "kind"}
            self.state = _State(**data)
            self.cfg = OptimizeConfig.from_dict(self.state.config)
            self.run_id = resume
        else:
            if cfg is None:
                raise OptimizeError("a configuration or a run to resume is needed")
            self.cfg, self.run_id = cfg, None
            self.state = _State(cfg.to_dict())
        if not Path(self.cfg.model).is_file():
            raise OptimizeError(f"model file not found: {self.cfg.model}")

    # -- bookkeeping ---------------------------------------------------------------------------
    def _save(self) -> None:
        self.store.set_run_config(self.run_id, self.state.to_dict())

    def _spent(self, stage: str, since: float) -> None:
        self.state.seconds[stage] = self.state.seconds.get(stage, 0.0) + time.monotonic() - since
        self._save()

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> str:
        if self.run_id is None:
            self.run_id = self.store.create_run(self.state.to_dict())
        else:
            self.store.set_run_status(self.run_id, "running")
        status = "interrupted"
        try:
            for stage in STAGES[STAGES.index(self.state.stage):]:
                self.state.stage = stage
                self._save()
                t0 = time.monotonic()
                self.log(f"stage {STAGES.index(stage) + 1}/{len(STAGES)}: {stage}")
                try:
                    getattr(self, f"_{stage}")()
                finally:
                    self._spent(stage, t0)
            self.state.stage = "done"
            self._save()
            status = "finished"
        finally:
            self.store.set_run_status(self.run_id, status)
        return self.run_id

    def _derive(self) -> None:
        from swarmfactory.problems.derive import Scenario, derive, register

        c = self.cfg
        d = derive(c.model, Scenario(prompt=c.prompt, output=c.output, concurrency=c.concurrency))
        where = register(d)
        taken, held = [], 0.0
        for p in d.problems:
            if held >= c.cover or p.share < c.min_share:
                break
            taken.append({"name": p.name, "share": p.share, "ops": p.ops})
            held += p.share
        self.state.derivation = {"model": d.model, "architecture": d.architecture, "registry": str(where),
                                 "problems": [{"name": p.name, "share": p.share} for p in d.problems],
                                 "uncovered": d.uncovered}
        self.state.problems = taken
        self.log(f"{len(d.problems)} problems derived from {Path(c.model).name} ({d.architecture}); taking "
                 f"{len(taken)} holding {100 * held:.0f}% of the engine's estimated time: "
                 + ", ".join(f"{t['name']} {100 * t['share']:.0f}%" for t in taken))

    def _speedup(self, name: str) -> float | None:
        """The speedup over its baseline of ``name``'s champion here, None without one."""
        from swarmfactory.problems import load_problem

        champ = self.store.champion(load_problem(name))
        return champ.speedup if champ is not None and champ.speedup else None

    def _evaluation_seconds(self, name: str) -> float:
        """The median seconds of ``name``'s last measured evaluations on this machine (0: none), as
        its kernel runs expect one to take (``Coordinator.expected_seconds``)."""
        from swarmfactory.swarm.coordinator import typical_seconds

        return typical_seconds(self.store.evaluations(problem=name, this_hardware=True)) or 0.0

    def _kernels(self) -> None:
        budget = self.cfg.time_s * self.cfg.kernel_share
        for n, frac in enumerate(PASS_SHARE, start=1):
            if not any(r["pass"] == n for r in self.state.runs):
                weights = {p["name"]: p["share"] / (self._speedup(p["name"]) or 1.0) for p in self.state.problems}
                # a slice shorter than one evaluation here would run past its time: the others take it
                took = {k: self._evaluation_seconds(k) for k in weights}
                slices = split(budget * frac, weights, self.cfg.min_run_s, took)
                if not slices:
                    self.log(f"pass {n}: {budget * frac:.0f} s is too little for a kernel run of "
                             f"{self.cfg.min_run_s:.0f} s")
                for k in weights.keys() - slices.keys():
                    if took[k] > self.cfg.min_run_s:
                        self.log(f"pass {n}: {k} left out: one evaluation takes about {took[k]:.0f} s here")
                self.state.runs += [{"problem": k, "pass": n, "budget_s": round(v, 1), "run_id": None,
                                     "status": "planned"} for k, v in slices.items()]
                self._save()
            for r in (r for r in self.state.runs if r["pass"] == n and r["status"] not in ("finished", "skipped")):
                if r["run_id"] is None and not self._fits(r, budget):
                    continue
                self._kernel_run(r)

    def _fits(self, r: dict, budget: float) -> bool:
        """Whether planned run ``r`` still fits in the kernel stage's time, what the runs before it
        took counted (a run may overrun its slice by an evaluation): shrunk to what is left, or
        skipped where that is under ``--min-kernel-run`` or one evaluation of its problem here.
        The engine stage keeps its share."""
        left = budget - sum(x.get("seconds", 0.0) for x in self.state.runs)
        need = max(self.cfg.min_run_s, self._evaluation_seconds(r["problem"]))
        if left < need:
            r["status"] = "skipped"
            self._save()
            self.log(f"pass {r['pass']}: {r['problem']} skipped: {max(left, 0.0):.0f} s of the kernel stage's "
                     f"{budget:.0f} s are left, a run here needs {need:.0f} s")
            return False
        if left < r["budget_s"]:
            r["budget_s"] = round(left, 1)
        return True

    def _kernel_run(self, r: dict) -> None:
        from swarmfactory.api import prepare_run
        from swarmfactory.swarm.coordinator import Coordinator

        def started(run_id: str) -> None:
            r["run_id"], r["status"] = run_id, "running"
            self._save()

        before = self._speedup(r["problem"])
        self.log(f"pass {r['pass']}: {r['problem']} for {r['budget_s']:.0f} s"
                 + (f" (resuming run {r['run_id']})" if r["run_id"] else ""))
        progress = _Captured(self.progress("kernels"), started)
        if r["run_id"]:
            coord = Coordinator(None, self.store, resume=r["run_id"], progress=progress)
        else:
            coord = prepare_run(r["problem"], self.store, progress=progress, time_s=r["budget_s"],
                                agents=self.cfg.agents, seed=self.cfg.seed)
        t0 = time.monotonic()
        try:
            coord.run()
        finally:  # what it took, over every session (a kernel run may overrun its slice by an evaluation)
            r["seconds"] = round(r.get("seconds", 0.0) + time.monotonic() - t0, 1)
        r["status"], r["speedup"] = "finished", self._speedup(r["problem"])
        self._save()
        x = lambda v: "none" if v is None else f"{v:.2f}x its baseline"  # noqa: E731
        self.log(f"{r['problem']}: champion {x(r['speedup'])} (before this run: {x(before)})")

    def _engine(self) -> None:
        from swarmfactory.enginefactory.tune import TuneConfig, TuneError, Tuner

        def started(run_id: str) -> None:
            self.state.tune_run, self.state.tune_status = run_id, "running"
            self._save()

        c = self.cfg
        left = c.time_s - sum(self.state.seconds.get(s, 0.0) for s in ("derive", "kernels"))
        progress = _Captured(self.progress("engine"), started)
        try:
            if self.state.tune_run and self.state.tune_status != "finished":
                tuner = Tuner(None, self.store, resume=self.state.tune_run, progress=progress, log=self.log)
            else:
                tcfg = TuneConfig(model=c.model, weights="q4_1", concurrency=c.concurrency,
                                  workloads=((c.prompt, c.output),), time_s=max(left, 120.0), seed=c.seed)
                tuner = Tuner(tcfg, self.store, progress=progress, log=self.log)
        except TuneError as e:
            raise OptimizeError(f"engine stage: {e}") from None
        self.log("kernel champions the engine may plug in: "
                 + (", ".join(f"{p} {cid[:12]}" for p, cid in tuner.champions.items()) or "none"))
        try:
            tuner.run()
        except TuneError as e:
            raise OptimizeError(f"engine stage (tune run {tuner.run_id}): {e}") from None
        self.state.tune_status = "finished"
        champ = tuner.champion
        self.tuner = tuner
        self._save()
        if champ is None:
            self.log("no engine design passed verification: no profile stored")
        else:
            self.log(f"engine profile: {champ.design.describe()} ({champ.ratio:.2f}x the default design)")

    def summary(self) -> dict:
        """What the run did, per stage (for the command's table and --json)."""
        s = self.state
        out = {"run_id": self.run_id, "model": self.cfg.model, "stage": s.stage, "seconds": dict(s.seconds),
               "problems": [], "tune_run": s.tune_run}
        for p in s.problems:
            runs = [r for r in s.runs if r["problem"] == p["name"]]
            out["problems"].append({"name": p["name"], "share": p["share"], "speedup": self._speedup(p["name"]),
                                    "budget_s": sum(r["budget_s"] for r in runs),
                                    "seconds": sum(r.get("seconds", 0.0) for r in runs),
                                    "runs": [r["run_id"] for r in runs if r["run_id"]]})
        tuner = getattr(self, "tuner", None)
        if tuner is not None and tuner.default is not None:
            champ = tuner.champion
            out["engine"] = {"default_tok_s": tuner.default.fitness,
                             "best": None if champ is None else {"design": champ.design.describe(),
                                                                 "ratio": champ.ratio}}
        return out
