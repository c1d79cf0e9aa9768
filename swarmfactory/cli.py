"""The one command line: problems, eval, run, show, report, dashboard, cases, verify, lessons, engine.

Start-up stays light: only typer and rich load here; torch, numpy, the harness and the engine
load inside the commands that use them (``engine`` itself is imported only when invoked).
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from swarmfactory.commandline import (DEBUG_HELP, READ_STORE_HELP, STORE_DEFAULT, STORE_HELP, WRITE_STORE_HELP,
                                      UsageError, dflt, err, fail, open_store, run, store_option)

# Rich sizes output to the terminal; off a terminal (pipes, CI logs) it uses $COLUMNS or 80.
# The tables are laid out for 80 columns; --wide prints every column at its natural width.
out = Console()


# RunConfig's defaults, shown in --help without importing pydantic (a test keeps them equal).
RUN_DEFAULTS = {"agents": "default", "parallel": 2, "rounds": 20, "objective": "weighted", "seed": 0, "llm_cost_cap": 5.0,
                "llm_concurrency": 1, "llm_timeout_s": 180.0, "llm_max_tokens": 1500, "executor": "local",
                "lease_s": 120.0}


def _d(key: str) -> str:
    value = RUN_DEFAULTS[key]
    return dflt(format(value, "g") if isinstance(value, float) else str(value))


JSON_HELP = "print one JSON object on stdout instead of tables"
OBJECTIVES = ("weighted", "geomean", "worst")  # harness/verdicts.py (kept here: --help imports no harness)
OBJECTIVE_HELP = ("what `faster` means across the workload shapes: weighted (the problem's call mix, and no "
                  "shape significantly slower), geomean (flags slower shapes), worst (the slowest shape)")
WIDE_HELP = "every column (eager ratio, roofline, rejected verdicts by kind, ...), at full width"
ENGINE_HELP = "serve, generate with and benchmark the inference engine"


def _tidy(params: list, ctx) -> list:
    """No ``<bool>`` for flags and ``<str>``, not ``<list[str]>``, for repeatable options in --help."""
    for p in params:
        if p.metavar is None and (getattr(p, "is_flag", False) or getattr(p, "count", False)):
            p.metavar = ""
        elif p.metavar is None and getattr(p, "multiple", False) and hasattr(p, "display_type"):
            p.metavar = p.display_type(ctx).replace("list[", "").replace("]", "")
    return params


class _Group(TyperGroup):
    def get_params(self, ctx):
        return _tidy(super().get_params(ctx), ctx)

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is not None:
            _tidy(cmd.get_params(ctx), ctx)
        return cmd


class _LazyGroup(_Group):
    """A sub-app imported only when it is used: ``engine`` pulls in torch, --help must not."""

    def __init__(self, name: str, target: str, help: str):
        super().__init__(name=name, help=help, no_args_is_help=True)
        self._target, self._real = target, None

    def _load(self) -> TyperGroup:
        if self._real is None:
            module, attr = self._target.split(":")
            try:
                self._real = typer.main.get_command(getattr(importlib.import_module(module), attr))
            except ImportError as exc:
                raise UsageError(f"`{self.name}` is unavailable: {exc} (reinstall swarmfactory with its "
                                 "dependencies)") from exc
        return self._real

    def list_commands(self, ctx):
        return self._load().list_commands(ctx)

    def get_command(self, ctx, name):
        cmd = self._load().get_command(ctx, name)
        if cmd is not None:
            _tidy(cmd.get_params(ctx), ctx)
        return cmd


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="swarmfactory: agent swarms that build, verify and measure inference kernels.")


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP)):
    # --debug is read from the whole command line by main(); declaring it here (and on each
    # command) lets it parse in either place and shows it in --help.
    pass


def _debug_option():
    return typer.Option(False, "--debug", help=DEBUG_HELP)


def _fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def _announce(st) -> None:
    if st.created:
        err.print(f"new evidence store: {st.shown}", markup=False, highlight=False, soft_wrap=True)
    written, skipped = st.replayed
    if written or skipped:
        err.print(f"wrote {written} record(s) kept from an earlier failed write into {st.shown}"
                  + (f" ({skipped} already there)" if skipped else ""), markup=False, highlight=False, soft_wrap=True)


def _print_table(t, wide: bool = False) -> None:
    if not wide:
        out.print(t)
        return
    from rich.measure import Measurement

    need = Measurement.get(out, out.options.update(width=10_000), t).maximum
    Console(width=max(out.width, need)).print(t)  # Console.print(width=) cannot exceed the console's


@app.command("problems")
def problems_cmd(
    from_model: Optional[Path] = typer.Option(None, "--from-model", metavar="FILE.gguf",
                                              help="Derive the problems this model's engine runs, with its shapes and "
                                                   "call mix, and register them by name (FAMILY.MODEL) for run"),
    prompt: int = typer.Option(128, "--prompt", min=1, help="With --from-model: prompt tokens a request"),
    output: int = typer.Option(128, "--output", min=1, help="With --from-model: output tokens a request"),
    concurrency: str = typer.Option("1,16", "--concurrency", help="With --from-model: the concurrencies served"),
    name: Optional[str] = typer.Option(None, "--name", help="With --from-model: the model's name in the problems' "
                                                           "names (default: the file's name)"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP), debug: bool = _debug_option(),
):
    """List the bundled problems with their ABI, workload, tolerance and design space; or, with
    --from-model, derive and register the problems a model's engine runs."""
    import itertools

    from swarmfactory.problems import list_problems, load_problem
    from swarmfactory.problems.suites.cpu import BLOCK_NAMES, ENGINE_NAMES

    if from_model is not None:
        _derived_problems(from_model, prompt, output, concurrency, name, as_json)
        return
    rows = []
    for name in list_problems(gpu=True) + list(BLOCK_NAMES) + list(ENGINE_NAMES):
        p = load_problem(name)
        combos = [dict(zip(p.knobs, c)) for c in itertools.product(*p.knobs.values())] if p.knobs else []
        rows.append({"name": p.name, "version": p.version,
                     "abi": p.c_signature if p.backend == "c" else f"{p.backend}: {p.py_signature}",
                     "workload": [dict(s) for s in p.workload], "tolerance": vars(p.tolerance),
                     "knobs": {k: list(v) for k, v in p.knobs.items()},
                     "design_space": sum(1 for k in combos if p.valid_knobs(k)),
                     "design_space_total": len(combos)})
    from swarmfactory.problems.derive import registered_models

    derived = registered_models()
    if as_json:
        print(json.dumps({"problems": rows, "derived": derived}))
        return
    t = Table(title="Bundled problems")
    for col in ("problem", "C ABI", "workload", "tolerance", "knobs"):
        t.add_column(col, overflow="fold")
    for r in rows:
        wl = "; ".join("x".join(str(v) for v in s.values()) for s in r["workload"])
        space = (f"{r['design_space']} configs" if r["design_space"] == r["design_space_total"]
                 else f"{r['design_space']} valid of {r['design_space_total']} configs")
        t.add_row(r["name"], r["abi"], wl, f"rtol {r['tolerance']['rtol']:g} atol {r['tolerance']['atol']:g}",
                  f"{len(r['knobs'])} knobs, {space}")
    out.print(t)
    for model, names in derived.items():
        out.print(f"Derived from {model} (problems --from-model): {', '.join(names)}", soft_wrap=True)


def _levels(concurrency: str) -> tuple[int, ...]:
    """--concurrency read (problems --from-model, optimize); one line and exit 2 if it is not a
    comma list of positive integers."""
    try:
        levels = tuple(int(c) for c in concurrency.split(",") if c.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1:
        fail(f"--concurrency takes positive integers separated by commas, got {concurrency!r}")
    return levels


def _derived_problems(path: Path, prompt: int, output: int, concurrency: str, name: Optional[str],
                      as_json: bool) -> None:
    from swarmfactory.problems.derive import DeriveError, Scenario, derive, register

    conc = _levels(concurrency)
    scenario = Scenario(prompt=prompt, output=output, concurrency=conc)
    try:
        d = derive(path, scenario, model=name)
    except DeriveError as e:
        fail(str(e))
    where = register(d)
    if as_json:
        print(json.dumps({**d.to_json(), "registry": str(where)}))
        return
    t = Table(title=f"Problems of {path.name} ({d.architecture}; {prompt} in, {output} out, concurrency "
                    f"{', '.join(map(str, conc))})")
    for col in ("problem", "engine ops", "shapes", "est. share"):
        t.add_column(col, overflow="fold")
    for p in d.problems:
        shapes = "; ".join("x".join(str(v) for v in s.values()) for s in p.shapes)
        t.add_row(p.name, ", ".join(p.ops), shapes, f"{100 * p.share:.1f}%")
    for u in d.uncovered:
        t.add_row("[dim]- (none)[/dim]", f"{u['op']}: {u['why']}", "", f"{100 * u['share']:.1f}%")
    _print_table(t)
    out.print("Shares are the engine's estimated time per request (exact call counts, roofline time per call). "
              f"Registered in {where}; run them with:")
    out.print(f"  swarmfactory run --problems {','.join(p.name for p in d.problems)}", soft_wrap=True)


@app.command("eval")
def eval_cmd(
    source: Path = typer.Argument(..., metavar="KERNEL", help="the kernel's source file: C (.c), or for a GPU problem "
                                                               "Triton (.py), CUDA C++ (.cu) or PTX (.ptx)"),
    problem: str = typer.Option(..., "--problem", "-p", metavar="NAME|PATH",
                                help="problem name or path to a problem .py"),
    backend: Optional[str] = typer.Option(None, "--backend", metavar="NAME",
                                          help="what KERNEL is written in: c, triton, cuda or ptx"
                                               + dflt("by its extension")),
    store: Optional[str] = store_option(WRITE_STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    rounds: int = typer.Option(20, metavar="N", help="interleaved timing rounds per shape (>= 3)"),
    objective: str = typer.Option("weighted", "--objective", metavar="|".join(OBJECTIVES), help=OBJECTIVE_HELP),
    compile_baselines: bool = typer.Option(True, help="also time torch.compile'd baselines"),
    debug: bool = _debug_option(),
):
    """Verify and measure one kernel against the problem's baseline; record the verdict.

    A GPU problem takes any of three languages, the backend chosen by the file's
    extension or --backend; each gets the problem's args in order:
      .py   Triton: a module with a launcher `def <problem>(<args>)`
      .cu   CUDA C++: `extern "C" __global__ void <problem>(...)`
      .ptx  PTX: `.visible .entry <problem>(...)`
    CUDA and PTX take device pointers, int64 ints and fp32 floats, and declare
    their launch in a comment line (int args, + - * // %, cdiv, min, max):
      // launch: grid=(cdiv(rows * cols, 256), 1, 1) block=(256, 1, 1) shared=0
    Without a GPU: CUDA, PTX are needs_device; Triton runs in its interpreter."""
    if not source.is_file():
        fail(f"kernel file not found: {source}")
    if rounds < 3:
        fail("--rounds must be at least 3")
    if objective not in OBJECTIVES:
        fail(f"--objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    from swarmfactory.api import evaluate
    from swarmfactory.harness.evaluate import HarnessConfig
    from swarmfactory.problems import load_problem

    prob = load_problem(problem)
    lang, text = _kernel_source(source, prob, backend)
    st = open_store(store, create=True)
    _announce(st)
    from swarmfactory.evidence.store import StoreWriteError

    try:
        with err.status(f"evaluating {source.name} on {prob.name} (build, verify, measure)..."):
            res = evaluate(prob, text, st, HarnessConfig(rounds=rounds, compile_baselines=compile_baselines,
                                                              objective=objective), backend=lang)
    except StoreWriteError as exc:  # the verdict is in the store's journal: show it, then say so
        if exc.result is not None:
            _show_verdict(exc.result, as_json)
        raise
    _show_verdict(res, as_json)


def _show_verdict(res: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(res, default=str))
        return
    _print_verdict(res)


def _kernel_source(path: Path, prob, backend: Optional[str]) -> tuple[str, str]:
    """(backend, text) of a kernel file for ``prob``, or a usage error before anything is
    recorded: a file none of the problem's backends takes, or an empty one."""
    from swarmfactory.backends import source_backend

    try:
        lang = source_backend(prob, str(path), backend)
    except ValueError as exc:
        fail(str(exc))
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")
    if not text.strip():
        fail(f"{path}: empty source" + (" (whitespace only)" if text else ""))
    return lang, text


# run's options that a resumed run takes from its record (only its limits may change)
_RECORDED = {"problems": "--problems", "agents": "--agents", "parallel": "--parallel", "rounds": "--rounds",
             "objective": "--objective", "compile_baselines": "--compile-baselines", "seed": "--seed",
             "llm": "--llm", "llm_model": "--llm-model", "llm_cost_cap": "--llm-cost-cap",
             "llm_concurrency": "--llm-concurrency", "llm_timeout_s": "--llm-timeout",
             "llm_max_tokens": "--llm-max-tokens", "executor": "--executor", "ray_address": "--ray-address",
             "ray_hardware": "--ray-hardware", "lease_s": "--lease"}


def _only_limits_with_resume(resume: str, overrides: dict, config: Optional[Path]) -> None:
    """--resume continues a run as it was recorded; --budget and --time may replace its limits, any
    other option would be ignored: say so rather than ignore it."""
    given = [flag for key, flag in _RECORDED.items() if overrides.get(key) is not None]
    if config:
        given.insert(0, "--config")
    if given:
        fail(f"--resume {resume} continues the run with its recorded configuration; only --budget and --time may "
             f"change: drop {', '.join(given)}")


def _print_verdict(res: dict) -> None:
    from swarmfactory.ui import compact_table, num, shape_text, speedup_ci

    color = {"faster": "green", "not_faster": "yellow", "verified": "yellow",
             "needs_device": "yellow", "inconclusive": "yellow"}.get(res["outcome"], "red")
    out.print(f"[bold {color}]{res['outcome']}[/]  {res['problem']}  candidate {res['candidate_id']}  "
              + (f"evaluation {res['evaluation_id']}" if res["evaluation_id"] is not None else "not recorded yet"))
    out.print(res["detail"], markup=False)
    if res.get("shapes"):
        t = compact_table()
        for col in ("shape", "base us", "ref us", "kernel us", "speedup [95% CI]", "vs ref", "roofline"):
            t.add_column(col, justify="left" if col == "shape" else "right",
                         no_wrap=col in ("shape", "speedup [95% CI]"))
        for s in res["shapes"]:
            t.add_row(shape_text(s["shape"]), num(s["baseline_us"]), num(s["reference_us"]),
                      num(s["candidate_us"]), speedup_ci(s["speedup"], s["ci_low"], s["ci_high"]),
                      f"{num(s['vs_reference'])}x", _fmt(s["roofline_fraction"], ".0%"))
        out.print(t)
        out.print(f"base: the fastest baseline, {res['baseline']}; ref: the eager reference; "
                  f"{res['cases_checked']} validation cases passed", markup=False)
    for flag in res.get("flags", []):
        out.print(f"[yellow]flag:[/] {flag}")
    ev = res.get("evidence") or {}
    c = ev.get("contention")
    if c:
        line = (f"contention: the timed code waited for a CPU {c['suffered']:.0%} of its time "
                f"(worst round {c['worst']:.0%}; {c['disturbed_rounds']} of {c['rounds']} rounds disturbed and "
                f"replaced; waited {c['waited_s']:.0f} s for a quieter machine)")
        out.print(line, markup=False)
        if c.get("busy"):
            out.print("[yellow]warning:[/] measured on a busy machine: this figure is not evidence; "
                      "measure again when the machine is quieter")
    if ev.get("basis"):
        b = ev["basis"]
        disp = f"; a Python call's dispatch here: {b['dispatch_us']} us" if b.get("dispatch_us") else ""
        out.print(f"basis: the kernel {b['candidate']}; the baseline {b['baseline']}{disp}", markup=False)
    if res.get("champion_change"):
        out.print(f"title: {res['champion_change']}", markup=False)


def _run_config(overrides: dict, config: Optional[Path], resume: Optional[str]):
    """The RunConfig of ``run``'s flags over its ``--config`` file; bad input (a bad value, no
    budget, an unknown problem, a flag ``--resume`` cannot take) is one line before any work."""
    from swarmfactory.config import ConfigError, RunConfig, parse_duration

    try:
        overrides = {**overrides, "time_s": parse_duration(overrides["time_s"])}
        if config:
            cfg = RunConfig.from_yaml(config, **overrides)
        else:
            cfg = RunConfig.build(**{k: v for k, v in overrides.items() if v is not None})
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    if resume:
        _only_limits_with_resume(resume, overrides, config)
    elif cfg.budget is None and cfg.time_s is None:
        fail("give a budget: --budget N evaluations and/or --time 10m")
    else:
        from swarmfactory.problems import resolve_problems

        resolve_problems(",".join(cfg.problems))  # an unknown problem: one line before the store is touched
    return cfg


@app.command("run")
def run_cmd(
    problems: Optional[str] = typer.Option(None, "--problems", metavar="NAMES",
                                           help="'all' or a comma-separated list of names/paths" + dflt("all")),
    budget: Optional[int] = typer.Option(None, "--budget", metavar="N",
                                         help="evaluations (new measurements) in this run"
                                              + dflt("none: give --budget and/or --time")),
    time_budget: Optional[str] = typer.Option(None, "--time", metavar="DURATION",
                                              help="wall-clock budget: 90s, 10m, 1h"),
    agents: Optional[str] = typer.Option(None, "--agents", metavar="NAMES",
                                         help="comma-separated: 'default' (seed, knob-*, crossover, model-guided, "
                                              "random-restart), agent names, adversary, llm" + _d("agents")),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="RUN_ID",
                                         help="continue an interrupted run by its id"),
    store: Optional[str] = store_option(WRITE_STORE_HELP),
    config: Optional[Path] = typer.Option(None, "--config", metavar="FILE.yaml",
                                          help="YAML run config (flags override it)"),
    parallel: Optional[int] = typer.Option(None, "--parallel", metavar="N",
                                           help="evaluations in flight (one measures at a time)" + _d("parallel")),
    rounds: Optional[int] = typer.Option(None, "--rounds", metavar="N",
                                         help="interleaved timing rounds per shape (>= 3)" + _d("rounds")),
    objective: Optional[str] = typer.Option(None, "--objective", metavar="|".join(OBJECTIVES),
                                            help=OBJECTIVE_HELP + _d("objective")),
    compile_baselines: Optional[bool] = typer.Option(None, "--compile-baselines/--no-compile-baselines",
                                                     help="also time torch.compile'd baselines" + dflt("on")),
    seed: Optional[int] = typer.Option(None, "--seed", metavar="N",
                                       help="seed of the agents' random choices and of the budget bandit"
                                            + _d("seed")),
    llm: list[str] = typer.Option([], "--llm", metavar="ENDPOINT", show_default=False,
                                  help="LLM endpoint: local | openai:MODEL | http://HOST:PORT/v1 "
                                       "(repeatable: an ensemble)"),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", metavar="NAME",
                                            help="model name for a URL endpoint"),
    llm_cost_cap: Optional[float] = typer.Option(None, "--llm-cost-cap", metavar="USD",
                                                 help="USD per paid endpoint per run (a hard cap)"
                                                      + _d("llm_cost_cap")),
    llm_concurrency: Optional[int] = typer.Option(None, "--llm-concurrency", metavar="N",
                                                  help="requests in flight per endpoint" + _d("llm_concurrency")),
    llm_timeout: Optional[float] = typer.Option(None, "--llm-timeout", metavar="SECONDS",
                                                help="seconds per request" + _d("llm_timeout_s")),
    llm_max_tokens: Optional[int] = typer.Option(None, "--llm-max-tokens", metavar="N",
                                                 help="completion tokens per request" + _d("llm_max_tokens")),
    executor: Optional[str] = typer.Option(None, "--executor", metavar="local|ray",
                                           help="where evaluations run: this machine's processes, or a Ray "
                                                "cluster (one measurement per node at a time)" + _d("executor")),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", metavar="ADDRESS",
                                              help="Ray cluster to join: auto or HOST:PORT"
                                                   + dflt("a local Ray cluster on this machine")),
    ray_hardware: Optional[str] = typer.Option(None, "--ray-hardware", metavar="ID",
                                               help="measure on the Ray nodes of this hardware id"
                                                    + dflt("the class of most nodes")),
    lease: Optional[float] = typer.Option(None, "--lease", metavar="SECONDS",
                                          help="life of an evaluation's lease in the store (renewed while "
                                               "it runs; a dead run's leases expire after it)" + _d("lease_s")),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
    debug: bool = _debug_option(),
):
    """Run the swarm on a set of problems until the budget (evaluations or time) is spent.

    Ctrl-C stops it (exit code 130); the run stays resumable with --resume RUN_ID."""
    overrides = {"problems": problems, "budget": budget, "time_s": time_budget,
                 "agents": agents, "parallel": parallel, "rounds": rounds, "objective": objective,
                 "compile_baselines": compile_baselines, "seed": seed, "llm": llm or None,
                 "llm_model": llm_model, "llm_cost_cap": llm_cost_cap,
                 "llm_concurrency": llm_concurrency, "llm_timeout_s": llm_timeout,
                 "llm_max_tokens": llm_max_tokens, "executor": executor or ("ray" if ray_address else None),
                 "ray_address": ray_address, "ray_hardware": ray_hardware, "lease_s": lease}
    cfg = _run_config(overrides, config, resume)
    _execute_run(cfg, resume, store, as_json, wide)


def _execute_run(cfg, resume: Optional[str], store: Optional[str], as_json: bool, wide: bool) -> None:
    """Open the store, run (or resume) the swarm and print what it produced; a run that cannot
    start leaves no store behind, one that stops says how to resume it."""
    from swarmfactory.api import prepare_run
    from swarmfactory.config import ConfigError
    from swarmfactory.evidence.store import StoreWriteError
    from swarmfactory.redact import redact
    from swarmfactory.swarm.coordinator import RunError
    from swarmfactory.swarm.summary import summarize
    from swarmfactory.ui import RichProgress

    st = open_store(store, create=not resume, write=True)
    try:
        coord = prepare_run(store=st, config=cfg, resume=resume, progress=None if as_json else RichProgress(err))
    except BaseException as exc:
        st.discard_if_created()  # a run that cannot start leaves no empty store behind
        if isinstance(exc, (ConfigError, RunError, ValueError)):
            fail(str(exc))
        raise
    _announce(st)
    store_flag = f" --store {shlex.quote(redact(store))}" if store else ""
    try:
        run_id = coord.run()
    except (RunError, StoreWriteError) as exc:  # every agent stopped; a store that took no more writes
        why = st.write_failure() if isinstance(exc, StoreWriteError) else str(exc)
        fail(f"{why}; run {coord.run_id} is saved: resume it with: swarmfactory run --resume {coord.run_id}{store_flag}"
             if coord.run_id else why)
    except KeyboardInterrupt:
        if coord.run_id is None:
            err.print("interrupted before the run started", highlight=False)
        else:
            err.print(f"interrupted: run {coord.run_id} is saved; resume it with: "
                      f"swarmfactory run --resume {coord.run_id}{store_flag}", markup=False, highlight=False,
                      soft_wrap=True)
        raise typer.Exit(130)
    summary = summarize(st, run_id)
    if as_json:
        print(json.dumps(summary, default=str))
        return
    _print_summary(summary, wide)
    if any(p["outcomes"].get("verified") for p in summary["problems"]):
        out.print("verified, not measured: GPU problems verified under Triton's interpreter (small shapes); timing, "
                  "and so champions, need an NVIDIA GPU (docs/gpu.md)", markup=False, soft_wrap=True)
    out.print(f"store: {st.shown}   show again: swarmfactory show {run_id}{store_flag}", markup=False,
              soft_wrap=True)


@app.command("show")
def show_cmd(
    run_id: Optional[str] = typer.Argument(None, metavar="RUN_ID", help="a run id (default: the latest run)"),
    store: Optional[str] = store_option(READ_STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
    debug: bool = _debug_option(),
):
    """Champions, speedups with CI, outcome counts and the agent scoreboard of a run."""
    from swarmfactory.swarm.summary import summarize

    st = open_store(store, create=False)
    with st.consistent():  # one snapshot while runs write
        summary = summarize(st, run_id)
    if as_json:
        print(json.dumps(summary, default=str))
        return
    _print_summary(summary, wide)
    if summary["status"] == "interrupted":
        from swarmfactory.redact import redact

        out.print(f"resume it with: swarmfactory run --resume {summary['run_id']}"
                  + (f" --store {shlex.quote(redact(store))}" if store else ""), markup=False, soft_wrap=True)


def _print_summary(summary: dict, wide: bool = False) -> None:
    from swarmfactory.ui import agent_table, design_table, llm_table, result_tables

    tables = [*result_tables(summary, wide), design_table(summary, wide), agent_table(summary, wide),
              llm_table(summary, wide)]
    for k, t in enumerate(t for t in tables if t is not None):
        if k:
            out.line()
        _print_table(t, wide)


@app.command("report")
def report_cmd(
    run_id: Optional[str] = typer.Argument(None, metavar="RUN_ID", help="a run id (default: the latest run)"),
    output: Path = typer.Option(Path("report.html"), "-o", "--output", metavar="FILE.html",
                                help="where to write the report"),
    store: Optional[str] = store_option(READ_STORE_HELP),
    debug: bool = _debug_option(),
):
    """Write one self-contained HTML report of a run."""
    if output.is_dir():
        fail(f"--output {output} is a folder: give a file name, e.g. {output / 'report.html'}")
    if not output.parent.is_dir():
        fail(f"--output folder {output.parent} does not exist: create it or choose another path")
    if not os.access(output if output.exists() else output.parent, os.W_OK):
        fail(f"cannot write the report to {output}: {'it' if output.exists() else 'its folder'} is not writable: "
             "choose another -o")
    from swarmfactory.report.html import ReportWriteError, write_report

    st = open_store(store, create=False)
    try:
        with st.consistent():  # one snapshot while runs write
            path = write_report(st, run_id, output)
    except ReportWriteError as exc:
        fail(str(exc))
    out.print(f"wrote {path}", markup=False)


@app.command("optimize")
def optimize_cmd(
    model: Optional[Path] = typer.Argument(None, metavar="MODEL.gguf", help="the model to optimise the stack for"),
    time_budget: str = typer.Option("2h", "--time", metavar="DURATION", help="wall-clock budget of the whole run "
                                                                             "(90s, 10m, 1.5h)"),
    kernel_share: float = typer.Option(0.6, "--kernel-share", help="share of the time for the kernel stage (the rest "
                                                                   "tunes the engine)"),
    prompt: int = typer.Option(128, "--prompt", min=1, help="prompt tokens a request, for the call mix and the tune"),
    output: int = typer.Option(128, "--output", min=2, help="output tokens a request"),
    concurrency: str = typer.Option("1,16", "--concurrency", help="concurrencies served, comma-separated"),
    agents: str = typer.Option("default", "--agents", help="the kernel runs' agents (as run --agents)"),
    min_kernel_run: str = typer.Option("60s", "--min-kernel-run", metavar="DURATION",
                                       help="the shortest kernel run (a problem whose slice is shorter gets none)"),
    seed: int = typer.Option(0, "--seed", help="seed of the kernel runs and the tune"),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="RUN_ID", help="continue an interrupted optimize run"),
    store: Optional[str] = store_option(WRITE_STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    debug: bool = _debug_option(),
):
    """Re-optimise the whole stack for MODEL: derive its kernel problems, run the kernel swarm on
    them (time split by each one's share of the engine's time), then tune the engine with the new
    champions, verified end to end against the model's fp32 reference. The profile found is what
    `engine serve --model MODEL` runs. Ctrl-C stops it (exit code 130); --resume RUN_ID continues."""
    from swarmfactory.config import parse_duration
    from swarmfactory.optimize import OptimizeConfig, OptimizeError, Optimizer
    from swarmfactory.problems.derive import DeriveError
    from swarmfactory.redact import redact
    from swarmfactory.tune_cli import _Progress
    from swarmfactory.ui import RichProgress

    if (model is None) == (resume is None):
        fail("give a MODEL.gguf, or --resume RUN_ID (not both)")
    cfg = None
    if model is not None:
        conc = _levels(concurrency)
        try:
            secs = parse_duration(time_budget)
            cfg = OptimizeConfig(model=str(model.resolve()), time_s=secs or 0, kernel_share=kernel_share,
                                 prompt=prompt, output=output, concurrency=conc, agents=agents, seed=seed,
                                 min_run_s=parse_duration(min_kernel_run) or 0)
        except (OptimizeError, ValueError) as e:
            fail(str(e))
    st = open_store(store, create=resume is None, write=True)
    from swarmfactory import lifecycle
    from swarmfactory.evidence.processes import ProcessLedger

    lifecycle.watch(ProcessLedger(st))
    progress = {"kernels": (lambda: None if as_json else RichProgress(err)), "engine": _Progress}
    try:
        opt = Optimizer(cfg, st, resume=resume, progress=lambda stage: progress[stage](),
                        log=lambda m: err.print(m, highlight=False, markup=False))
    except (OptimizeError, DeriveError) as e:
        fail(str(e))
    store_flag = f" --store {shlex.quote(redact(store))}" if store else ""
    try:
        opt.run()
    except KeyboardInterrupt:
        err.print(f"interrupted; continue with: swarmfactory optimize --resume {opt.run_id}{store_flag}",
                  highlight=False, markup=False)
        raise typer.Exit(130)
    except (OptimizeError, DeriveError) as e:
        fail(str(e), 1)
    summary = opt.summary()
    if as_json:
        print(json.dumps(summary))
        return
    t = Table(title=f"optimize run {opt.run_id}: {Path(opt.cfg.model).name}")
    for col in ("problem", "est. share", "champion vs baseline", "kernel time (budget)"):
        t.add_column(col, overflow="fold")
    for p in summary["problems"]:
        t.add_row(p["name"], f"{100 * p['share']:.1f}%", _fmt(p["speedup"], ".2f") + ("x" if p["speedup"] else ""),
                  f"{p['seconds']:.0f} s ({p['budget_s']:.0f} s)")
    _print_table(t)
    out.print("stages: " + ", ".join(f"{k} {v:.0f} s" for k, v in summary["seconds"].items()))
    eng = summary.get("engine")
    if eng:
        best = eng["best"]
        out.print(f"engine: default design {eng['default_tok_s']:.1f} tok/s; "
                  + ("no design passed verification" if best is None else
                     f"profile {best['ratio']:.2f}x the default: {best['design']}"))
    out.print(f"serve it: swarmfactory engine serve --model {shlex.quote(opt.cfg.model)}{store_flag}", soft_wrap=True)


@app.command("dashboard")
def dashboard_cmd(
    store: Optional[str] = store_option(READ_STORE_HELP),
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDR",
                             help="address to listen on (anything but loopback is reachable by others)"),
    port: int = typer.Option(8050, "--port", metavar="N", help="TCP port (0: any free one)"),
    debug: bool = _debug_option(),
):
    """Serve a live, read-only dashboard of the store: runs, champions, verdicts, agents, lineage,
    cases, lessons, engine tuning. Ctrl-C stops it."""
    if not 0 <= port <= 65535:
        fail(f"--port {port} is not a TCP port (0-65535)")
    from swarmfactory.dashboard import serve

    st = open_store(store, create=False)
    if host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"warning: listening on {host}: anyone who can reach it can read this store (no login)",
                  markup=False, highlight=False)
    try:
        serve(st, host, port, on_ready=lambda url: out.print(f"dashboard on {url} (Ctrl-C stops it)", markup=False,
                                                             highlight=False, soft_wrap=True))
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}: choose another --port or --host")


@app.command("cases")
def cases_cmd(
    problem: str = typer.Argument(..., metavar="PROBLEM", help="problem name or path"),
    store: Optional[str] = store_option(f"{STORE_HELP}; without one, the seed cases only{dflt(STORE_DEFAULT)}"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    debug: bool = _debug_option(),
):
    """The validation set of a problem: seed cases and found cases, with provenance."""
    from swarmfactory.evidence.store import StoreError
    from swarmfactory.problems import load_problem
    from swarmfactory.validation import validation_set

    prob = load_problem(problem)
    try:
        st = open_store(store, create=False)
    except StoreError:
        if store or os.environ.get("SWARMFACTORY_STORE"):
            raise  # a store was named: a typo must not pass for an empty one
        st = None  # no default store yet: the bundled seed cases are the whole validation set
    cases, version = validation_set(prob, st)
    found = {r.case_key: r for r in st.found_cases(prob.name)} if st else {}
    rows = [{"shape": dict(c.shape), "seed": c.seed, "dist": c.dist, "origin": c.origin,
             "broke": f.broke_candidate if f else None, "note": f.note if f else None,
             "found_at": str(f.created_at) if f else None}
            for c in cases for f in [found.get(c.key())]]
    if as_json:
        print(json.dumps({"problem": prob.name, "validation_version": version, "cases": rows}))
        return
    t = Table(title=f"{prob.name}: validation set {version} ({len(rows)} cases, {len(found)} found)")
    for col in ("shape", "seed", "dist", "origin", "broke candidate", "found at"):
        t.add_column(col)
    for r in rows:
        t.add_row(prob.shape_label(r["shape"]), str(r["seed"]), r["dist"], r["origin"], r["broke"] or "",
                  (r["found_at"] or "")[:16])
    out.print(t)


@app.command("verify")
def verify_cmd(
    problem: str = typer.Option(..., "--problem", "-p", metavar="NAME|PATH", help="problem name or path"),
    store: Optional[str] = store_option(READ_STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    debug: bool = _debug_option(),
):
    """Re-verify every retained (once correct) candidate against today's validation set."""
    from swarmfactory.problems import load_problem

    prob = load_problem(problem)
    st = open_store(store, create=False, write=True)  # failures and title changes are recorded
    _announce(st)
    from swarmfactory.api import reverify_retained

    with err.status(f"re-verifying retained {prob.name} candidates..."):
        res = reverify_retained(prob, st)
    if as_json:
        print(json.dumps(res, default=str))
        return
    t = Table(title=f"{prob.name}: {len(res['candidates'])} retained candidates against validation set "
                    f"{res['validation_version']}")
    for col in ("candidate", "agent", "best speedup", "now", "detail"):
        t.add_column(col, overflow="fold")
    for r in res["candidates"]:
        t.add_row(r["candidate_id"], r["agent"], _fmt(r["speedup"]),
                  "[green]passes[/]" if r["passes"] else f"[red]{r['outcome']}[/]", r["detail"] or "")
    out.print(t)
    if res["champion_change"]:
        out.print(res["champion_change"], markup=False)


@app.command("lessons")
def lessons_cmd(
    problem: Optional[str] = typer.Option(None, "--problem", "-p", metavar="NAME", help="only this problem's lessons"),
    show_all: bool = typer.Option(False, "--all", help="retired lessons too, with why"),
    store: Optional[str] = store_option(READ_STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    wide: bool = typer.Option(False, "--wide", help="every column (method, matched pairs, run, since), at full width"),
    debug: bool = _debug_option(),
):
    """What the evidence taught: knob lessons with effect, 95% CI and support (active by default)."""
    st = open_store(store, create=False)
    if problem is not None:
        problem = _known_problem(problem, st)
    rows = st.current_lessons(problem, include_retired=show_all)
    if as_json:
        print(json.dumps({"store": st.shown, "lessons": [_lesson_json(r) for r in rows]}, default=str))
        return
    if not rows:
        others = sorted({r.problem for r in st.current_lessons(include_retired=show_all) if r.problem})
        what = f"{'' if show_all else 'active '}lessons" + (f" for {problem}" if problem else "")
        hint = (f" (there are some for: {', '.join(others)})" if problem and others else
                "; the analyst writes them during `swarmfactory run`")
        out.print(f"no {what} in {st.shown}{hint}", markup=False, highlight=False, soft_wrap=True)
        return
    from swarmfactory.ui import compact_table, speedup_ci

    groups: dict = {}
    for r in rows:
        groups.setdefault((r.problem or "-", r.hardware_id), []).append(r)
    for k, ((name, _hw), group) in enumerate(groups.items()):
        d0 = group[0].data
        active = sum(r.status == "active" for r in group)
        title = (f"{name} on {_hardware_text(d0.get('hardware') or {})}: {active} active"
                 + (f", {len(group) - active} retired" if len(group) > active else ""))
        t = compact_table(title)
        for col, just in (("knob", "left"), ("better", "left"), ("worse", "left"), ("effect [95% CI]", "right"),
                          ("evals", "right"), ("shapes", "left")):
            t.add_column(col, justify=just, no_wrap=col in ("knob", "effect [95% CI]"),
                         overflow="fold")
        if wide:
            for col in ("method", "pairs", "since", "run"):
                t.add_column(col, justify="right" if col == "pairs" else "left", no_wrap=True)
        if show_all:
            t.add_column("status", no_wrap=True)
        for r in group:
            d = r.data
            row = [d.get("knob", "?"), str(d.get("better")), str(d.get("worse")),
                   speedup_ci(d.get("effect"), d.get("ci_low"), d.get("ci_high")), str(d.get("evaluations", "")),
                   _scope_text(d)]
            if wide:
                row += [d.get("method", ""), str(d.get("pairs", "")), str(r.created_at)[:16], r.run_id or ""]
            if show_all:
                row.append("active" if r.status == "active" else "[red]retired[/]")
            t.add_row(*row)
        if k:
            out.line()
        _print_table(t, wide)
        for r in group:
            d = r.data
            if r.status != "active":
                out.print(f"  retired {d.get('knob')}={d.get('better')} > {d.get('worse')} ({_scope_text(d)}): "
                          f"{d.get('why', '')}", markup=False, highlight=False)
            # its standing where it was not learnt: a hypothesis there, confirmed or retired by local evidence
            for where, v in sorted((d.get("local") or {}).items()):
                problem_there, _, hw_there = where.partition("@")
                on = ("this machine" if hw_there == st.hardware["id"] else f"machine {hw_there}")
                out.print(f"  {d.get('knob')}={d.get('better')} > {d.get('worse')} on {problem_there}, {on}: "
                          f"{v.get('status')}: {v.get('why', '')}", markup=False, highlight=False)
    out.print("effect: geometric-mean speedup of better over worse; the rule: docs/agents.md", markup=False,
              highlight=False)


def _known_problem(name: str, st) -> str:
    """The name of a bundled problem (or a problem file's), or of a problem the store holds evidence
    of; anything else is a usage error naming the known ones."""
    from swarmfactory.problems import ProblemError, list_problems, load_problem

    in_store = sorted(set(st.evaluated_problems()) | {r.problem for r in st.current_lessons(include_retired=True)
                                                      if r.problem})
    if name in in_store:
        return name
    try:
        return load_problem(name).name
    except ProblemError as exc:
        if "unknown problem" not in str(exc):
            raise
    known = list_problems(gpu=True) + [n for n in in_store if n not in list_problems(gpu=True)]
    fail(f"unknown problem {name!r}; known: {', '.join(known)} (or pass a .py path)")


def _hardware_text(hw: dict) -> str:
    return f"{hw.get('model', '?')} {hw.get('isa', '')}".strip() + (f" (masked {hw['mask']})" if hw.get("mask") else "")


def _scope_text(d: dict) -> str:
    """The workload shapes a lesson holds for: ``all`` or the shapes (``1x576, 8x576``)."""
    f = d.get("features") or {}
    if d.get("scope") is None:
        return "all"
    return ", ".join("x".join(str(v) for v in s.values()) for s in f.get("shapes", [])) or "some"


def _lesson_json(r) -> dict:
    """A lesson (``Store.current_lessons``) as ``lessons --json`` prints it."""
    d = r.data or {}
    hist = [{"id": h.id, "status": h.status, "why": (h.data or {}).get("why"),
             "text": h.text, "run_id": h.run_id, "created_at": str(h.created_at)} for h in r.history]
    return {"id": r.id, "key": r.key, "problem": r.problem, "hardware_id": r.hardware_id,
            "status": r.status, "text": r.text, "run_id": r.run_id, "created_at": str(r.created_at),
            **{k: v for k, v in d.items() if k not in ("key", "status")}, "history": hist}


def _command() -> TyperGroup:
    cmd = typer.main.get_command(app)
    cmd.add_command(_LazyGroup("engine", "swarmfactory.engine_cli:app", ENGINE_HELP), "engine")
    return cmd


def main(argv: list[str] | None = None) -> None:
    """The ``swarmfactory`` entry point: 0 on success, 2 for bad input, 130 on Ctrl-C."""
    run(_command(), "swarmfactory", argv)


if __name__ == "__main__":
    main()
