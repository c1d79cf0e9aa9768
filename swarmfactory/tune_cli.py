"""`swarmfactory engine tune | profiles` and the profile choice of `engine serve` (mounted on
`swarmfactory engine` by engine_cli.py)."""

from __future__ import annotations

import shlex
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from swarmfactory.commandline import READ_STORE_HELP, WRITE_STORE_HELP, fail, open_store, store_option
from swarmfactory.enginefactory.design import set_help

err = Console(stderr=True, soft_wrap=True)


class _Progress:
    def __init__(self):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.p = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                          TextColumn("{task.fields[note]}"), console=err, transient=True)
        self.task = None

    def start(self, run_id, time_s, budget):
        import time

        self.t0, self.time_s = time.monotonic(), time_s
        self.p.start()
        self.task = self.p.add_task(f"tune {run_id}", total=time_s, note="")

    def update(self, done, best, note):
        import time

        if self.task is not None:
            self.p.update(self.task, completed=min(self.time_s, time.monotonic() - self.t0),
                          note=f"{done} designs, best {best:.2f}x | {note}"[:100])

    def stop(self):
        self.p.stop()


def _fixed(items: list[str]) -> tuple:
    from swarmfactory.enginefactory.tune import TuneError

    out = []
    for item in items:
        name, sep, val = item.partition("=")
        if not sep:
            raise TuneError(f"--set expects KNOB=VALUE, got {item!r}")
        val = val.strip()
        parsed = None if val.lower() in ("none", "calibrated") and name != "dense" else (
            int(val) if val.lstrip("-").isdigit() else val)
        out.append((name.strip(), parsed))
    return tuple(out)


def _design_llm(spec: str, model: Optional[str]):
    """The DesignLLM for ``--llm``, checked before any store or model work (a bad spec or a paid
    endpoint without its key exits 2); timeout and cost cap are ``swarmfactory run``'s defaults."""
    from swarmfactory.config import RunConfig
    from swarmfactory.llm.client import LLMError

    from swarmfactory.enginefactory.llm_designs import DesignLLM, client_for

    defaults = RunConfig.model_fields
    try:
        return DesignLLM(client_for(spec, model, defaults["llm_timeout_s"].default, defaults["llm_cost_cap"].default))
    except LLMError as e:
        fail(str(e))


def tune_cmd(
    time_: str = typer.Option("20m", "--time", help="time limit: 90s, 20m, 1h"),
    concurrency: str = typer.Option("1,16", help="concurrency levels the design is judged at"),
    workloads: str = typer.Option("128x128,1024x128",
                                  help="INPUTxOUTPUT tokens per request, comma list"),
    prompts_per_stream: int = typer.Option(2, min=1, help="prompts per level = max(4, this x concurrency)"),
    ttft_p99: Optional[float] = typer.Option(None, help="TTFT p99 ceiling in seconds at every level (default none)"),
    budget: Optional[int] = typer.Option(None, min=1, help="most designs to evaluate (default: the time decides)"),
    model: Optional[str] = typer.Option(None, help="GGUF file (default: bundled SmolLM2-135M-Instruct)"),
    weights: str = typer.Option("q4_1", help="weight format of the designs: fp32, bf16 or q4_1"),
    seed: int = typer.Option(0, help="seed of the agents and prompts"),
    set_: list[str] = typer.Option([], "--set", help=set_help()),
    screen: float = typer.Option(0.10, min=0.0, max=0.9, help="screening: a design whose short first measurement "
                                 "(first workload, one wave per level) is more than this fraction under the "
                                 "champion's is not measured in full"),
    no_screen: bool = typer.Option(False, "--no-screen", help="measure every verified design in full"),
    resume: Optional[str] = typer.Option(None, help="continue an interrupted tune run (RUN_ID)"),
    llm: Optional[str] = typer.Option(None, "--llm", metavar="ENDPOINT",
                                      help="LLM endpoint that proposes designs too: openai:MODEL | "
                                           "http://HOST:PORT/v1 --llm-model NAME (a paid one: $5 at most, as swarmfactory run)"),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", metavar="NAME", help="model name for a URL endpoint"),
    store: Optional[str] = store_option(WRITE_STORE_HELP),
    debug: bool = typer.Option(False, help="show tracebacks"),
):
    """Search engine designs on this machine: each is verified end to end, then measured over HTTP;
    the best is kept as this machine's profile for the model (engine serve uses it)."""
    from swarmfactory.config import parse_duration

    from swarmfactory.enginefactory.tune import TuneConfig, TuneError, Tuner, parse_levels, parse_workloads

    try:
        cfg = None if resume else TuneConfig(
            model=model, weights=weights, concurrency=parse_levels(concurrency), workloads=parse_workloads(workloads),
            prompts_per_stream=prompts_per_stream, time_s=parse_duration(time_), budget=budget, ttft_p99_s=ttft_p99,
            seed=seed, fixed=_fixed(set_), screen=None if no_screen else screen)
    except (TuneError, ValueError) as e:
        fail(str(e))
    designer = _design_llm(llm, llm_model) if llm else None
    st = open_store(store, create=not resume, write=True)
    from swarmfactory import lifecycle
    from swarmfactory.evidence.processes import ProcessLedger

    lifecycle.watch(ProcessLedger(st))  # design servers a killed tune left on this store end; ours are recorded
    progress = _Progress()
    try:
        tuner = Tuner(cfg, st, resume=resume, progress=progress, log=lambda m: err.print(m, highlight=False,
                                                                                       markup=False), llm=designer)
    except TuneError as e:
        fail(str(e))
    if designer is not None:
        from swarmfactory.enginefactory.llm_designs import serving_target

        designer.target = serving_target(tuner.cfg)
    from swarmfactory.redact import redact

    store_flag = f" --store {shlex.quote(redact(store))}" if store else ""
    try:
        run_id = tuner.run()
    except KeyboardInterrupt:
        progress.stop()
        err.print(f"interrupted; continue with: swarmfactory engine tune --resume {tuner.run_id}{store_flag}",
                  highlight=False, markup=False)
        raise typer.Exit(130)
    except TuneError as e:
        if debug:
            raise
        fail(str(e), 1)
    _print_result(tuner, run_id, st.shown, store_flag)


def _print_result(tuner, run_id: str, shown: str, store_flag: str) -> None:
    """What a tune run found, and the commands that show and serve it."""
    champ = tuner.champion
    d = tuner.default
    print(f"tune run {run_id}: {tuner.evaluated} designs evaluated on this machine")
    if d is None:
        print(f"nothing measured in this session; details: swarmfactory show {run_id}{store_flag}")
        return
    print(f"default design: {'passed' if tuner.default_ok else 'failed verification'}, {d.fitness:.1f} tok/s (geometric mean over {tuner._pairs()} workload x concurrency pairs)")
    if champ is None:
        print("no design passed verification: no profile stored; engine serve keeps the calibrated defaults")
    elif champ is d:
        print("best: the default design (no design beat it twice)")
    else:
        print(f"best: {champ.design.key[:12]} {champ.ratio:.2f}x the default: {champ.design.describe()}")
    print(f"store: {shown}   details: swarmfactory show {run_id}{store_flag}   serve it: swarmfactory engine serve"
          + store_flag)


def profiles_cmd(
    store: Optional[str] = store_option(READ_STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
):
    """What was tuned, where, when, with what result; which profile engine serve would pick here."""
    import json

    from swarmfactory.enginefactory.profiles import all_profiles, current_tools

    st = open_store(store, create=False)
    profs = all_profiles(st)
    if as_json:
        print(json.dumps([{k: (str(v) if k == "created_at" else v) for k, v in p.as_dict().items()} for p in profs]))
        return
    if not profs:
        print("no engine profiles in this store (make one: swarmfactory engine tune)")
        return
    tools, hw = current_tools(), st.hardware["id"]
    t = Table()
    for col in ("profile", "model", "tuned", "run", "vs default", "CPU", "fits here", "design"):
        t.add_column(col, overflow="fold")
    for p in profs:
        here = p.mismatch(p.model_sha256, hw, tools)  # model checked by serve against the file it loads
        if here is None:
            blocked, note = p.kernel_check(st)
            here = blocked or (f"yes; {note}" if note else None)
        t.add_row(p.id[:12], p.problem.removeprefix("engine:"), str(p.created_at)[:16], p.run_id or "-",
                  f"{p.speedup:.2f}x" if p.speedup else "-", f"{p.hardware.get('model', '?')}",
                  "yes" if here is None else here, p.description)
    Console(width=max(120, Console().width)).print(t)


def profile_config(profile: str, model: Optional[str], store: Optional[str]):
    """The EngineConfig ``engine serve`` should run for ``--profile`` (auto, none or an id), with
    the line to print; (None, line) keeps the calibrated defaults."""
    from swarmfactory.engine.config import EngineConfig
    from swarmfactory.engine.gguf_loader import ModelNotFound, resolve_model_path
    from swarmfactory.evidence.store import Store, StoreError

    from swarmfactory.enginefactory.profiles import choose, current_tools, find

    if profile == "none":
        return None, None
    try:
        model_path = resolve_model_path(model)
    except ModelNotFound as e:
        fail(str(e))
    try:
        st = Store(store, create=False)
    except StoreError as e:
        if profile == "auto":
            return None, f"no evidence store ({e.args[0].split(':')[0]}): calibrated defaults"
        fail(str(e))
    if profile == "auto":
        prof, line = choose(st, model_path)
    else:
        try:
            prof = find(st, profile)
        except LookupError as e:
            fail(str(e))
        from swarmfactory.enginefactory.verify import model_digest

        why = prof.mismatch(model_digest(model_path), st.hardware["id"], current_tools())
        note = None
        if why is None:
            why, note = prof.kernel_check(st)
        if why:
            fail(f"profile {prof.id[:12]} {why}: it has not passed on this machine with this model; "
                  "run swarmfactory engine tune here")
        line = f"profile {prof.id[:12]} (engine tune run {prof.run_id}): {prof.description}" + \
            (f" - note: {note}" if note else "")
    if prof is None:
        return None, line
    import yaml

    data = yaml.safe_load(prof.config_yaml)
    data["model"] = model
    return EngineConfig.from_dict(data), line
