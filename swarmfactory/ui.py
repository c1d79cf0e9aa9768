"""Terminal rendering: live run progress and the result tables (Rich, on stderr/stdout)."""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def _f(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


class RichProgress:
    """Evaluations done/budget (or time), current champion speedup per problem, outcome counts."""

    def __init__(self, console: Console):
        self.console = console
        self.bar = Progress(TextColumn("[bold]run {task.fields[run]}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console)
        self.live = None
        self.champions: dict = {}
        self.counts: dict = {}

    def start(self, run_id, total, time_s, problems):
        self.t0, self.time_s = time.monotonic(), time_s
        self.task = self.bar.add_task("run", total=total, run=run_id, note=self._note())
        self.champions = {p: None for p in problems}
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def _note(self) -> str:
        if not getattr(self, "time_s", None):
            return ""
        left = max(0, self.time_s - (time.monotonic() - self.t0))
        return f"{left:.0f}s left"

    def _render(self):
        t = Table(box=None, pad_edge=False)
        t.add_column("problem")
        t.add_column("champion vs baseline", justify="right")
        for p, s in self.champions.items():
            t.add_row(p, f"{s:.2f}x" if s else "-")
        counts = "  ".join(f"{k}: {v}" for k, v in sorted(self.counts.items())) or "no verdicts yet"
        return Group(self.bar, t, counts)

    def update(self, done, champions, counts):
        self.champions, self.counts = champions, dict(counts)
        self.bar.update(self.task, completed=done, note=self._note())
        if self.live:
            self.live.update(self._render())

    def stop(self):
        if self.live:
            self.live.stop()
            self.live = None


def result_table(summary: dict) -> Table:
    t = Table(title=f"run {summary['run_id']} ({summary['status']}): {summary['evaluations']} evaluations")
    for col in ("problem", "shape", "baseline us", "champion us", "vs baseline [95% CI]", "vs eager ref",
                "roofline", "evals", "rejected", "champion by"):
        t.add_column(col, justify="right" if col not in ("problem", "rejected", "champion by") else "left")
    for p in summary["problems"]:
        c = p["champion"]
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(p["rejected"].items())) or "-"
        if not c:
            t.add_row(p["problem"], "-", "-", "-", "no champion", "-", "-", str(p["evaluations"]), rejected, "-")
            continue
        by = f"{c['agent']} (gen {c['generation']})"
        t.add_row(p["problem"], "all (geomean)", "", "",
                  f"[bold]{_f(c['speedup'])}x[/] [{_f(c['ci_low'])}, {_f(c['ci_high'])}]",
                  f"{_f(c['vs_reference'])}x", _f(c["roofline_fraction"], ".0%"), str(p["evaluations"]),
                  rejected, by)
        for s in c["shapes"]:
            t.add_row("", "x".join(str(v) for v in s["shape"].values()), _f(s["baseline_us"]),
                      _f(s["candidate_us"]), f"{_f(s['speedup'])}x [{_f(s['ci_low'])}, {_f(s['ci_high'])}]",
                      f"{_f(s['vs_reference'])}x", _f(s["roofline_fraction"], ".0%"), "", "", "")
    return t


def agent_table(summary: dict) -> Table:
    t = Table(title="agents")
    for col in ("agent", "proposals", "correct", "faster", "champions", "build_failed", "wrong", "cheated",
                "crashed", "timed_out"):
        t.add_column(col, justify="right" if col != "agent" else "left")
    for a in summary["agents"]:
        t.add_row(a["agent"], *(str(a.get(k, 0)) for k in ("proposals", "correct", "faster", "champions",
                                                           "build_failed", "wrong", "cheated", "crashed",
                                                           "timed_out")))
    return t


def llm_table(summary: dict) -> Table | None:
    if not summary.get("llm"):
        return None
    t = Table(title="LLM endpoints")
    cols = ("agent", "model", "calls", "ok", "parse_error", "apply_error", "empty", "timeout", "candidates",
            "correct", "faster", "champions", "prompt_tokens", "completion_tokens", "cost_usd", "seconds")
    for col in cols:
        t.add_column(col.replace("_", " "), justify="left" if col in ("agent", "model") else "right")
    for r in summary["llm"]:
        t.add_row(*(str(r.get(k, 0)) for k in cols))
    return t
