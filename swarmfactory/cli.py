"""The one command line: problems, eval, run, show, report, cases, verify, engine."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="swarmfactory: agent swarms that build, verify and measure inference kernels.")
# Off a terminal (CI logs, pipes) Rich would wrap tables at 80 columns; give them room.
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
out = Console(width=None if sys.stdout.isatty() else 200)
STORE_HELP = "evidence store: a SQLite path or a SQLAlchemy URL (postgresql://...)"


class UsageError(Exception):
    """Bad input from the user: one line on stderr, exit code 2."""


def fail(message: str) -> None:
    raise UsageError(message)


def _fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


@app.command("problems")
def problems_cmd(as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout")):
    """List the bundled problems with their ABI and workload."""
    from swarmfactory.problems import list_problems, load_problem

    rows = []
    for name in list_problems():
        p = load_problem(name)
        rows.append({"name": p.name, "version": p.version, "abi": p.c_signature,
                     "workload": [dict(s) for s in p.workload], "tolerance": vars(p.tolerance),
                     "knobs": {k: list(v) for k, v in p.knobs.items()},
                     "design_space": p.knob_space_size() if p.knobs else 0})
    if as_json:
        print(json.dumps({"problems": rows}))
        return
    t = Table(title="Bundled problems")
    for col in ("problem", "C ABI", "workload", "tolerance", "knobs"):
        t.add_column(col, overflow="fold")
    for r in rows:
        wl = "; ".join("x".join(str(v) for v in s.values()) for s in r["workload"])
        t.add_row(r["name"], r["abi"], wl, f"rtol {r['tolerance']['rtol']:g} atol {r['tolerance']['atol']:g}",
                  f"{len(r['knobs'])} knobs, {r['design_space']} configs")
    out.print(t)


@app.command("eval")
def eval_cmd(
    source: Path = typer.Argument(..., help="the kernel's C source file"),
    problem: str = typer.Option(..., "--problem", "-p", help="problem name or path to a problem .py"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
    rounds: int = typer.Option(20, help="interleaved timing rounds per shape (>= 3)"),
    compile_baselines: bool = typer.Option(True, help="also time torch.compile'd baselines"),
):
    """Verify and measure one kernel against the problem's baseline; record the verdict."""
    from swarmfactory.api import evaluate
    from swarmfactory.harness.evaluate import HarnessConfig
    from swarmfactory.problems import load_problem

    if not source.is_file():
        fail(f"kernel file not found: {source}")
    if rounds < 3:
        fail("--rounds must be at least 3")
    prob = load_problem(problem)
    text = source.read_text(errors="replace")
    with err.status(f"evaluating {source.name} on {prob.name} (build, verify, measure)..."):
        res = evaluate(prob, text, store, HarnessConfig(rounds=rounds, compile_baselines=compile_baselines))
    if as_json:
        print(json.dumps(res, default=str))
        return
    _print_verdict(res)


def _print_verdict(res: dict) -> None:
    color = {"faster": "green", "not_faster": "yellow"}.get(res["outcome"], "red")
    out.print(f"[bold {color}]{res['outcome']}[/]  {res['problem']}  candidate {res['candidate_id']}  "
              f"evaluation {res['evaluation_id']}")
    out.print(res["detail"], markup=False)
    if res.get("shapes"):
        t = Table()
        for col in ("shape", "baseline us", "reference us", "kernel us", "vs baseline [95% CI]",
                    "vs reference", "roofline"):
            t.add_column(col, justify="right")
        for s in res["shapes"]:
            t.add_row("x".join(str(v) for v in s["shape"].values()), _fmt(s["baseline_us"]),
                      _fmt(s["reference_us"]), _fmt(s["candidate_us"]),
                      f"{s['speedup']:.2f}x [{s['ci_low']:.2f}, {s['ci_high']:.2f}]",
                      f"{_fmt(s['vs_reference'])}x", _fmt(s["roofline_fraction"], ".0%"))
        out.print(t)
        out.print(f"baseline: {res['baseline']}; {res['cases_checked']} validation cases passed")
    for flag in res.get("flags", []):
        out.print(f"[yellow]flag:[/] {flag}")


@app.command("run")
def run_cmd(
    problems: Optional[str] = typer.Option(None, "--problems", help="'all' or a comma-separated list of names/paths"),
    budget: Optional[int] = typer.Option(None, "--budget", help="evaluations (new measurements) in this run"),
    time_budget: Optional[str] = typer.Option(None, "--time", help="wall-clock budget: 90s, 10m, 1h"),
    agents: Optional[str] = typer.Option(None, "--agents", help="'default' or a comma-separated list of agents"),
    resume: Optional[str] = typer.Option(None, "--resume", help="continue an interrupted run by its id"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML run config (flags override it)"),
    parallel: Optional[int] = typer.Option(None, "--parallel", help="evaluations in flight (default 2)"),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="timing rounds per shape (default 20)"),
    compile_baselines: Optional[bool] = typer.Option(None, "--compile-baselines/--no-compile-baselines",
                                                     help="also time torch.compile'd baselines (default on)"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    llm: list[str] = typer.Option([], "--llm", help="LLM endpoint: local | openai:MODEL | http://HOST:PORT/v1 (repeatable: an ensemble)"),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", help="model name for a URL endpoint"),
    llm_cost_cap: Optional[float] = typer.Option(None, "--llm-cost-cap", help="USD per paid endpoint per run (default 5)"),
    llm_concurrency: Optional[int] = typer.Option(None, "--llm-concurrency", help="requests in flight per endpoint"),
    llm_timeout: Optional[float] = typer.Option(None, "--llm-timeout", help="seconds per request"),
    llm_max_tokens: Optional[int] = typer.Option(None, "--llm-max-tokens", help="completion tokens per request"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object"),
):
    """Run the swarm on a set of problems until the budget (evaluations or time) is spent."""
    from swarmfactory.config import ConfigError, RunConfig, parse_duration
    from swarmfactory.evidence.store import Store
    from swarmfactory.swarm.coordinator import Coordinator, RunError
    from swarmfactory.swarm.summary import summarize
    from swarmfactory.ui import RichProgress

    try:
        overrides = {"problems": problems, "budget": budget, "time_s": parse_duration(time_budget),
                     "agents": agents, "parallel": parallel, "rounds": rounds,
                     "compile_baselines": compile_baselines, "seed": seed, "llm": llm or None,
                     "llm_model": llm_model, "llm_cost_cap": llm_cost_cap,
                     "llm_concurrency": llm_concurrency, "llm_timeout_s": llm_timeout,
                     "llm_max_tokens": llm_max_tokens}
        if config:
            cfg = RunConfig.from_yaml(config, **overrides)
        else:
            cfg = RunConfig.build(**{k: v for k, v in overrides.items() if v is not None})
        if not resume and cfg.budget is None and cfg.time_s is None:
            fail("give a budget: --budget N evaluations and/or --time 10m")
        st = Store(store)
        coord = Coordinator(cfg, st, resume=resume, progress=None if as_json else RichProgress(err))
    except (ConfigError, RunError, ValueError) as exc:
        fail(str(exc))
    run_id = coord.run()
    summary = summarize(st, run_id)
    if as_json:
        print(json.dumps(summary, default=str))
        return
    _print_summary(summary)
    out.print(f"store: {st.url}   show again: swarmfactory show {run_id}"
              + (f" --store {store}" if store else ""), markup=False)


@app.command("show")
def show_cmd(
    run_id: Optional[str] = typer.Argument(None, help="a run id (default: the latest run)"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json"),
):
    """Champions, speedups with CI, outcome counts and the agent scoreboard of a run."""
    from swarmfactory.evidence.store import Store
    from swarmfactory.swarm.summary import summarize

    summary = summarize(Store(store), run_id)
    if as_json:
        print(json.dumps(summary, default=str))
        return
    _print_summary(summary)


def _print_summary(summary: dict) -> None:
    from swarmfactory.ui import agent_table, llm_table, result_table

    out.print(result_table(summary))
    out.print(agent_table(summary))
    if llm_table(summary):
        out.print(llm_table(summary))


@app.command("report")
def report_cmd(
    run_id: Optional[str] = typer.Argument(None, help="a run id (default: the latest run)"),
    output: Path = typer.Option(Path("report.html"), "-o", "--output"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
):
    """Write one self-contained HTML report of a run."""
    from swarmfactory.evidence.store import Store
    from swarmfactory.report.html import write_report

    path = write_report(Store(store), run_id, output)
    out.print(f"wrote {path}")


@app.command("cases")
def cases_cmd(
    problem: str = typer.Argument(..., help="problem name or path"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json"),
):
    """The validation set of a problem: seed cases and found cases, with provenance."""
    from swarmfactory.evidence.store import Store
    from swarmfactory.problems import load_problem
    from swarmfactory.validation import validation_set

    prob = load_problem(problem)
    st = Store(store)
    cases, version = validation_set(prob, st)
    found = {r["case_key"]: r for r in st.found_cases(prob.name)}
    rows = [{"shape": dict(c.shape), "seed": c.seed, "dist": c.dist, "origin": c.origin,
             "broke": found.get(c.key(), {}).get("broke_candidate"),
             "note": found.get(c.key(), {}).get("note"),
             "found_at": str(found[c.key()]["created_at"]) if c.key() in found else None} for c in cases]
    if as_json:
        print(json.dumps({"problem": prob.name, "validation_version": version, "cases": rows}))
        return
    t = Table(title=f"{prob.name}: validation set {version} ({len(rows)} cases, {len(found)} found)")
    for col in ("shape", "seed", "dist", "origin", "broke candidate", "found at"):
        t.add_column(col)
    for r in rows:
        t.add_row(prob.shape_label(r["shape"]), str(r["seed"]), r["dist"], r["origin"], r["broke"] or "",
                  r["found_at"] or "")
    out.print(t)


@app.command("verify")
def verify_cmd(
    problem: str = typer.Option(..., "--problem", "-p", help="problem name or path"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json"),
):
    """Re-verify every retained (once correct) candidate against today's validation set."""
    from swarmfactory.api import reverify_retained
    from swarmfactory.evidence.store import Store
    from swarmfactory.problems import load_problem

    prob = load_problem(problem)
    with err.status(f"re-verifying retained {prob.name} candidates..."):
        res = reverify_retained(prob, Store(store))
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


def _mount_optional() -> None:
    try:
        from swarmfactory.engine.cli import app as engine_app
    except ImportError:
        return
    app.add_typer(engine_app, name="engine", help="serve, generate with and benchmark the inference engine")


def main() -> None:
    from swarmfactory.evidence.store import StoreError
    from swarmfactory.problems import ProblemError

    debug = "--debug" in sys.argv
    if debug:
        sys.argv.remove("--debug")
    _mount_optional()
    try:
        app(standalone_mode=False)
    except (UsageError, ProblemError, StoreError) as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # click usage errors and the unexpected
        if hasattr(exc, "format_message"):  # click's (or typer's vendored click's) usage errors
            err.print(f"error: {exc.format_message()}", markup=False, highlight=False)
            sys.exit(2)
        if debug or os.environ.get("SWARMFACTORY_DEBUG"):
            raise
        err.print(f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", markup=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
