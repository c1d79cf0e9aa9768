"""The run and show tables read well at 80 and 100 columns: no line wider than the terminal, no
header or agent name cut or wrapped, a speedup and its CI on one line, shapes as 128x576."""

import re

import pytest
from cli_support import AGENTS, recorded_run, sf
from rich.console import Console

from swarmfactory.evidence.store import Store
from swarmfactory.swarm.summary import summarize
from swarmfactory.ui import agent_table, llm_table, result_tables

CI = re.compile(r"\d+(\.\d+)?x \[\d+(\.\d+)?, \d+(\.\d+)?\]")


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    db = tmp_path_factory.mktemp("tables") / "e.db"
    run_id = recorded_run(db)
    s = summarize(Store(str(db), create=False), run_id)
    s["llm"] = [{"agent": "llm:openai:gpt-4o-mini", "model": "gpt-4o-mini", "calls": 12, "ok": 10,
                 "parse_error": 2, "prompt_tokens": 48213, "completion_tokens": 9120, "cost_usd": 0.0123,
                 "seconds": 95.2, "candidates": 2, "correct": 2, "faster": 2, "champions": 0}]
    return s


def _render(tables, width):
    console = Console(width=width, record=True, color_system=None)
    for t in tables:
        console.print(t)
    return console.export_text()


def _headers(table):
    return [c.header for c in table.columns]


@pytest.mark.parametrize("width", [80, 100])
def test_run_table_fits_without_cutting_names_or_headers(summary, width):
    tables = [*result_tables(summary), agent_table(summary), llm_table(summary)]
    text = _render(tables, width)
    lines = text.splitlines()
    assert max(len(ln.rstrip()) for ln in lines) <= width
    assert "…" not in text
    for t in tables:
        for h in _headers(t):
            assert any(h in ln for ln in lines), (h, text)  # whole, on one line
    for agent in AGENTS:
        assert any(re.search(rf"(^|\s){re.escape(agent)}(\s|$)", ln) for ln in lines), (agent, text)
    for p in summary["problems"]:
        assert any(ln.lstrip().startswith(p["problem"] + " ") for ln in lines), p["problem"]
        for s in p["champion"]["shapes"]:
            assert "x".join(map(str, s["shape"].values())) in text
    assert "{" not in text and "'" not in text  # no Python dicts
    assert len(CI.findall(text)) == 2 + 7  # each champion and each shape: speedup and CI on one line


def test_wide_view_has_every_column(summary):
    wide = [*result_tables(summary, wide=True), agent_table(summary, wide=True), llm_table(summary, wide=True)]
    headers = [h for t in wide for h in _headers(t)]
    for h in ("vs eager", "roofline", "gen", "candidate", "ref us", "build failed", "timed out",
              "parse error", "prompt tokens"):
        assert h in headers, h
    text = _render(wide, 300)
    assert "build_failed 1" in text and "wrong 1" in text  # rejected verdicts by kind


@pytest.mark.parametrize("columns", ["80", "100"])
def test_show_through_the_entry_point_fits_the_terminal(tmp_path, columns):
    db = tmp_path / "e.db"
    run_id = recorded_run(db)
    proc = sf("show", run_id, "--store", db, env={"COLUMNS": columns})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(ln.rstrip()) for ln in lines) <= int(columns), proc.stdout
    for agent in AGENTS:
        assert any(agent in ln.split() for ln in lines), (agent, proc.stdout)
    wide = sf("show", run_id, "--store", db, "--wide", env={"COLUMNS": columns})
    assert wide.returncode == 0 and "vs eager" in wide.stdout and "…" not in wide.stdout


def test_off_a_terminal_output_does_not_assume_200_columns(tmp_path):
    db = tmp_path / "e.db"
    run_id = recorded_run(db)
    proc = sf("show", run_id, "--store", db)  # a pipe, no $COLUMNS: 80 columns
    assert proc.returncode == 0 and max(len(ln) for ln in proc.stdout.splitlines()) <= 80
