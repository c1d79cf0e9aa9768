"""`swarmfactory engine serve | generate | calibrate | bench` (and `tune`, `profiles`: tune_cli.py).

A config that names kernel-factory kernels (``champion:...``) gets them through the corridor
(``champions.Corridor``) from the store named by ``--store``: the engine itself never opens it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from swarmfactory.commandline import STORE_DEFAULT, STORE_HELP, dflt, fail, run, store_option

app = typer.Typer(help="Serve, run and benchmark the inference engine.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
err = Console(stderr=True, soft_wrap=True)
ENGINE_STORE_HELP = STORE_HELP + " holding the profiles and the champion: kernels a config names" + dflt(STORE_DEFAULT)


def _config(config_file: Optional[Path], model: Optional[str], weights: Optional[str], threads: Optional[int],
            max_batch: Optional[int], max_seq_len: Optional[int], kernel: list[str]):
    from swarmfactory.engine.config import ConfigError, EngineConfig

    data: dict = {}
    try:
        if config_file is not None:
            data = EngineConfig.from_yaml(config_file).model_dump()
        overrides = {"model": model, "weights": weights, "threads": threads, "max_batch": max_batch,
                     "max_seq_len": max_seq_len}
        data.update({k: v for k, v in overrides.items() if v is not None})
        if kernel:
            ks = dict(data.get("kernels") or {})
            for item in kernel:
                op, sep, name = item.partition("=")
                if not sep:
                    raise ConfigError(f"--kernel expects OP=NAME, got {item!r}")
                ks[op] = name
            data["kernels"] = ks
        return EngineConfig.from_dict(data)
    except (ConfigError, OSError) as e:
        fail(str(e))


def _engine(cfg, debug: bool = False, store: Optional[str] = None):
    from swarmfactory.engine.engine import Engine
    from swarmfactory.engine.gguf_loader import ModelNotFound
    from swarmfactory.engine.kernels import KernelError

    from swarmfactory.champions import Corridor

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        with err.status(f"loading model ({cfg.weights})"):
            eng = Engine(cfg, supply=Corridor(store))
    except (ModelNotFound, KernelError, ValueError) as e:
        if debug:
            raise
        fail(str(e))
    err.print(f"loaded {eng.model_path.name} as {cfg.weights} in {eng.load_seconds:.1f}s "
              f"({cfg.resolved_threads()} threads, max batch {cfg.max_batch})", highlight=False)
    err.print(f"paths: {eng.paths.summary()}", highlight=False)
    return eng


def _default(field: str):
    from swarmfactory.engine.config import EngineConfig

    return EngineConfig.model_fields[field].default


WEIGHTS_HELP = f"weight format: fp32, bf16 or q4_1 (default {_default('weights')})"


@app.command()
def serve(
    model: Optional[str] = typer.Option(None, help="GGUF file (default: bundled SmolLM2-135M-Instruct)"),
    weights: Optional[str] = typer.Option(None, help=WEIGHTS_HELP),
    host: str = typer.Option("127.0.0.1", help="bind address (loopback by default)"),
    port: int = typer.Option(8000, min=0, max=65535),
    max_batch: Optional[int] = typer.Option(None, help=f"sequences decoded together (default {_default('max_batch')})"),
    max_seq_len: Optional[int] = typer.Option(None, help=f"context length per sequence (default {_default('max_seq_len')})"),
    threads: Optional[int] = typer.Option(None, help="torch threads (0: one per core)"),
    kernel: list[str] = typer.Option([], help="OP=KERNEL, e.g. lm_head=dense (repeatable)"),
    config: Optional[Path] = typer.Option(None, "--config", help="EngineConfig YAML file"),
    profile: str = typer.Option("auto", help="tuned profile: auto (the best one that passed on this machine "
                                "for this model, used when no other option sets the design), none, or a "
                                "profile id from engine profiles"),
    store: Optional[str] = store_option(ENGINE_STORE_HELP),
    api_key: Optional[str] = typer.Option(None, envvar="SWARMFACTORY_API_KEY",
                                          help="require 'Authorization: Bearer KEY' on /v1/*"),
    debug: bool = typer.Option(False, help="show tracebacks"),
):
    """Serve the OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models, /health)."""
    _check_port(host, port)  # before the model loads (tens of seconds): a busy port is one line now
    cfg = None
    chosen = any(v is not None for v in (config, weights, threads, max_batch, max_seq_len)) or bool(kernel)
    if profile != "none" and not (profile == "auto" and chosen):
        if profile != "auto" and chosen:
            fail("--profile ID sets the whole design; drop --config, --weights, --threads, --max-batch, "
                  "--max-seq-len and --kernel, or use --profile none")
        from swarmfactory.tune_cli import profile_config

        cfg, line = profile_config(profile, model, store)
        if line:
            err.print(line, highlight=False, markup=False)
    if cfg is None:
        cfg = _config(config, model, weights, threads, max_batch, max_seq_len, kernel)
    eng = _engine(cfg, debug, store)
    from swarmfactory.engine.memory import describe
    from swarmfactory.engine.server import serve as run_server

    for line in describe(eng.memory_estimate()):
        err.print(line, highlight=False)

    err.print(f"serving on http://{host}:{port}" + (" (API key required)" if api_key else ""), highlight=False)
    try:
        run_server(eng, host=host, port=port, api_key=api_key)
    except OSError as e:
        fail(str(e), 1)


def _check_port(host: str, port: int) -> None:
    """Bind and release ``host:port`` as the server will (SO_REUSEADDR, as uvicorn): taken or not
    ours to take is a usage error, exit 2."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        fail(f"cannot listen on {host}:{port}: {e.strerror or e}: choose another --host")
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            fail(f"cannot listen on {host}:{port}: {e.strerror or e}: choose another --port or --host")


def _register_factory():
    from swarmfactory.tune_cli import profiles_cmd, tune_cmd

    app.command("tune")(tune_cmd)
    app.command("profiles")(profiles_cmd)


_register_factory()


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="prompt text"),
    max_tokens: int = typer.Option(64, min=1),
    temperature: float = typer.Option(0.0, min=0.0, help="0 = greedy"),
    top_p: float = typer.Option(1.0, min=0.0, max=1.0),
    seed: Optional[int] = typer.Option(None),
    chat: bool = typer.Option(True, help="wrap the prompt in the model's chat template"),
    model: Optional[str] = typer.Option(None, help="GGUF file (default: bundled SmolLM2-135M-Instruct)"),
    weights: Optional[str] = typer.Option(None, help=WEIGHTS_HELP),
    threads: Optional[int] = typer.Option(None),
    config: Optional[Path] = typer.Option(None, "--config", help="EngineConfig YAML file"),
    store: Optional[str] = store_option(ENGINE_STORE_HELP),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    debug: bool = typer.Option(False, help="show tracebacks"),
):
    """Generate one completion (greedy by default) and print it."""
    import time

    from swarmfactory.engine.engine import RequestError

    cfg = _config(config, model, weights, threads, 1, None, [])
    eng = _engine(cfg, debug, store)
    text = prompt
    if chat and eng.tokenizer.has_chat_template:
        text = eng.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    t0 = time.perf_counter()
    try:
        out = eng.generate(text, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)[0]
    except (RequestError, ValueError) as e:
        fail(str(e))
    dt = time.perf_counter() - t0
    if json_out:
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "prompt_tokens": out.prompt_tokens,
                          "completion_tokens": len(out.token_ids), "finish_reason": out.finish_reason,
                          "seconds": dt, "config": cfg.model_dump()}))
    else:
        print(out.text)
        err.print(f"{len(out.token_ids)} tokens in {dt:.2f}s ({len(out.token_ids) / dt:.1f} tok/s, "
                  f"prompt {out.prompt_tokens} tokens, finish: {out.finish_reason})", highlight=False)


@app.command()
def calibrate(
    model: Optional[str] = typer.Option(None, help="GGUF file (default: bundled SmolLM2-135M-Instruct)"),
    threads: Optional[int] = typer.Option(None, help="threads to measure with (0: one per core)"),
    budget_s: float = typer.Option(25.0, min=1.0, help="time limit; points left unmeasured keep their defaults"),
    json_out: bool = typer.Option(False, "--json", help="print the calibration as one JSON object on stdout"),
    debug: bool = typer.Option(False, help="show tracebacks"),
):
    """Re-measure this machine's q4_1 thresholds (dense_above, native_decode, native_prefill) and
    replace the cached ones; engine loads that leave those keys unset use them."""
    from dataclasses import asdict

    from swarmfactory.engine import calibrate as cal_mod

    cfg = _config(None, model, "q4_1", threads, 1, None, [])
    try:
        with err.status(f"measuring (at most {budget_s:.0f} s)"):
            cal = cal_mod.run(cfg, budget_s)
    except (OSError, ValueError) as e:
        if debug:
            raise
        fail(str(e))
    if json_out:
        print(json.dumps({k: v for k, v in asdict(cal).items() if k != "cached"}))
        return
    err.print(f"calibrated in {cal.seconds:.1f} s (load average {cal.loadavg[0]} -> {cal.loadavg[1]}): "
              f"dense_above {cal.dense_above}, native_decode {cal.native_decode}, "
              f"native_prefill {cal.native_prefill}"
              + (f"; defaults kept for {', '.join(cal.incomplete)} (out of time)" if cal.incomplete else ""),
              highlight=False)


@app.command()
def bench(
    url: str = typer.Option("http://127.0.0.1:8000", help="base URL of an OpenAI-compatible server"),
    concurrency: str = typer.Option("1,4,16", help="comma-separated concurrency levels"),
    input_len: int = typer.Option(128, min=1),
    output_len: int = typer.Option(128, min=2),
    num_prompts: int = typer.Option(64, min=1),
    seed: int = typer.Option(0),
    warmup: int = typer.Option(2, min=0, help="warmup requests before measuring"),
    model: Optional[str] = typer.Option(None, help="model to ask for: a name, or the GGUF file the server serves "
                                               "(default: first of /v1/models)"),
    api_key: Optional[str] = typer.Option(None, envvar="SWARMFACTORY_API_KEY"),
    request_rate: Optional[float] = typer.Option(None, "--request-rate", min=0.001,
                                                 help="requests/s arriving as a Poisson process (each level's "
                                                      "concurrency is then the most in flight); default: all at once"),
    dataset: str = typer.Option("random", help="random (token ids) or text (windows of the bundled English text)"),
    goodput: list[str] = typer.Option([], "--goodput", help="an SLO for goodput, repeatable: ttft:MS, tpot:MS, "
                                                             "e2el:MS (as vllm bench serve)"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    debug: bool = typer.Option(False, help="show tracebacks"),
):
    """Measure a server: output tok/s, request/s, TTFT, TPOT, ITL, E2E latency (p50/p90/p99) and
    goodput at fixed concurrency levels, all at once or at a Poisson request rate."""
    import httpx

    from swarmfactory.bench.serving import bench_sync, parse_slo

    try:
        levels = [int(x) for x in concurrency.split(",") if x.strip()]
        if not levels or min(levels) < 1:
            raise ValueError
    except ValueError:
        fail(f"--concurrency expects positive integers like 1,4,16, got {concurrency!r}")
    if dataset not in ("random", "text"):
        fail(f"--dataset must be random or text, got {dataset!r}")
    try:
        slo = parse_slo(goodput) or None
    except ValueError as e:
        fail(f"--goodput: {e}")
    try:
        listed = httpx.get(url.rstrip("/") + "/v1/models", timeout=5,
                           headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    except httpx.HTTPError as e:
        fail(f"cannot reach {url}: {e}")
    if model is not None and Path(model).expanduser().is_file():
        model = _served_id(Path(model).expanduser(), url, listed)

    def progress(res):
        err.print(f"concurrency {res.concurrency}: {res.output_tok_s:.1f} tok/s, "
                  f"TTFT {res.ttft_ms_median:.0f} ms, TPOT {res.tpot_ms_median:.1f} ms, errors {res.errors}"
                  + _contention_note(res.contention), highlight=False)

    try:
        result = bench_sync(url, levels, input_len=input_len, output_len=output_len, num_prompts=num_prompts,
                            seed=seed, warmup=warmup, model=model, api_key=api_key, on_level=progress,
                            request_rate=request_rate, dataset=dataset, slo=slo)
    except Exception as e:  # a server that fails mid-benchmark: one line (tracebacks with --debug)
        if debug:
            raise
        fail(f"benchmark against {url} failed: {type(e).__name__}: {e}")
    if json_out:
        print(json.dumps(result))
    else:
        print_table(result)
    for line in result.get("warnings") or []:  # a level that stayed busy, contention not measurable
        err.print(f"[yellow]warning:[/yellow] {line}", highlight=False)


def _served_id(path: Path, url: str, listed) -> str:
    """The id under which the server at ``url`` serves the GGUF file ``path`` (``engine serve
    --model PATH`` serves it as its file name's stem); a server that lists other models is a
    usage error."""
    from swarmfactory.engine.model_file import model_id

    want = model_id(path)
    try:
        served = [m["id"] for m in listed.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return want  # a server that does not list its models: ask for it by that id
    if want not in served:
        fail(f"{url} serves {', '.join(served) or 'no model'}, not {path.name}: start engine serve --model "
             f"{path} or give --model NAME")
    return want


def _contention_note(c: dict | None) -> str:
    """``, others 3%`` / ``, others 35% after 3 attempts: busy`` for a level's progress line."""
    if not c or c.get("others") is None:
        return ""
    note = f", others {c['others']:.0%}"
    if c.get("attempts", 1) > 1:
        note += f" after {c['attempts']} attempts"
    return note + (": busy" if c.get("busy") else "")


def _others_cell(lv: dict) -> str:
    c = lv.get("contention") or {}
    if c.get("others") is None:
        return "n/a"
    return f"{c['others']:.0%}" + (" busy" if c.get("busy") else "")


def print_table(result: dict, title: str | None = None):
    """Two tables: throughput per level, then latency percentiles per level and metric."""
    from swarmfactory.contention import BUSY

    rate = result.get("request_rate")
    t = Table(title=title or f"{result['url']}  in={result['input_len']} tokens ({result.get('dataset', 'random')}) "
                              f"out={result['output_len']} tokens  prompts={result['num_prompts']}  "
                              + (f"Poisson {rate:g} req/s" if rate else "all at once"))
    slo = result.get("slo")
    cols = ["conc", "out (tok/s)", "requests (req/s)"] + (["goodput (req/s)"] if slo else []) + [
        "TTFT p50 (ms)", "TPOT p50 (ms)", "errors", "others (%)"]
    for col in cols:
        t.add_column(col, justify="right")
    lat = Table(title="latency (ms)")
    for col in ("conc", "metric", "p50 (ms)", "p90 (ms)", "p99 (ms)"):
        lat.add_column(col, justify="right")
    names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2el_ms": "E2E"}
    for lv in result["levels"]:
        pc = lv.get("percentiles") or {}
        row = [str(lv["concurrency"]), f"{lv['output_tok_s']:.1f}", f"{lv['request_s']:.2f}"]
        if slo:
            g = lv.get("goodput") or {}
            row.append(f"{g.get('request_s', 0):.2f} ({g.get('share', 0):.0%})")
        row += [f"{lv['ttft_ms_median']:.0f}", f"{lv['tpot_ms_median']:.1f}", str(lv["errors"]), _others_cell(lv)]
        t.add_row(*row)
        for key, name in names.items():
            q = pc.get(key) or {}
            lat.add_row(str(lv["concurrency"]), name, *(f"{q.get(k, float('nan')):.1f}" for k in ("p50", "p90", "p99")))
    con = Console(width=max(120, Console().width))
    con.print(t)
    if any(lv.get("percentiles") for lv in result["levels"]):
        con.print(lat)
    con.print(f"others %: the CPUs' share used by other processes than the server and this client; a level "
              f"over {BUSY:.0%} is measured again, busy if it stays so", highlight=False)
    if slo:
        con.print("goodput: requests/s that met every SLO (" + ", ".join(f"{k[:-3].upper()} <= {v:g} ms"
                                                                         for k, v in slo.items())
                  + "), and their share of all requests", highlight=False)


def main(argv: list[str] | None = None) -> None:
    run(typer.main.get_command(app), "swarmfactory engine", argv)


if __name__ == "__main__":
    main()
