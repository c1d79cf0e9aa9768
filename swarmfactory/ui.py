"""Terminal rendering: live run progress and the result tables (Rich, on stderr/stdout)."""

from __future__ import annotations

import time

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from swarmfactory.outcome import MEASURED


def _f(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def num(x, none: str = "-") -> str:
    """Three significant figures, fixed point: 0.92, 15.6, 162, 1235 (timings and ratios)."""
    if x is None:
        return none
    a = abs(x)
    return format(x, ".2f" if a < 10 else ".1f" if a < 100 else ".0f")


def speedup_ci(s, lo, hi) -> str:
    """``15.6x [10.4, 19.2]``: the median speedup and its 95% CI, on one line."""
    if s is None:
        return "-"
    return f"{num(s)}x [{num(lo)}, {num(hi)}]"


def shape_text(shape) -> str:
    """A shape as ``128x576`` (its dimensions in the problem's order), not a dict."""
    return "x".join(str(v) for v in shape.values()) if isinstance(shape, dict) else str(shape)


def compact_table(title: str | None = None) -> Table:
    """A table with a rule under the header and two spaces between columns, no borders: what
    keeps the result tables within 80 columns."""
    return Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1),
                 title_justify="left")


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
            if not self.console.is_terminal:
                self.console.line()  # off a terminal Live leaves its last line open


REJECTED = ("build_failed", "wrong", "cheated", "crashed", "timed_out")


def design_table(summary: dict, wide: bool = False) -> Table | None:
    """Engine tune runs: every design with its verdict and fitness (output tok/s, geometric mean)."""
    rows = [(p["problem"], d) for p in summary["problems"] for d in p.get("designs", [])]
    if not rows:
        return None
    t = compact_table("engine designs (tok/s: geometric mean of output tok/s over the serving target)")
    for col, just in (("design", "left"), ("agent", "left"), ("outcome", "left"), ("tok/s", "right"),
                      ("vs default", "right"), ("knobs / why", "left")):
        t.add_column(col, justify=just, overflow="fold", no_wrap=col in ("design", "tok/s"))
    for _, d in rows:
        why = d["design"] if d["outcome"] in MEASURED else d["detail"]
        if wide and d["outcome"] in MEASURED:
            why = f"{d['design']}; {d['detail']}"
        t.add_row(d["candidate_id"][:12], d["agent"] or "-", d["outcome"] + (" (baseline)" if d["purpose"] == "baseline" else ""),
                  num(d["fitness"]) if d["fitness"] else "-", _x(d["speedup"]), why)
    return t


def result_tables(summary: dict, wide: bool = False) -> list[Table]:
    """The champion of each problem (geometric mean over its workload), then its timings per shape.

    The default columns fit 80 columns with the longest bundled names; ``wide`` adds the eager
    reference ratio, the roofline fraction, rejected verdicts by kind and the generation."""
    champs = compact_table(f"run {summary['run_id']} ({summary['status']}): {summary['evaluations']} evaluations")
    champs.add_column("problem", no_wrap=True)
    champs.add_column("speedup [95% CI]", justify="right", no_wrap=True)
    if wide:
        champs.add_column("vs eager", justify="right")
        champs.add_column("roofline", justify="right")
    champs.add_column("evals", justify="right")
    champs.add_column("rejected", justify="left" if wide else "right")
    champs.add_column("champion by", overflow="fold")
    if wide:
        champs.add_column("gen", justify="right")
        champs.add_column("candidate", no_wrap=True)
    shapes = compact_table("champion per shape (us: microseconds per call)")
    shapes.add_column("problem", no_wrap=True)
    shapes.add_column("shape", no_wrap=True)
    shapes.add_column("base us", justify="right")
    if wide:
        shapes.add_column("ref us", justify="right")
    shapes.add_column("best us", justify="right")
    shapes.add_column("speedup [95% CI]", justify="right", no_wrap=True)
    if wide:
        shapes.add_column("vs eager", justify="right")
    shapes.add_column("roofline", justify="right")
    for p in summary["problems"]:
        c = p["champion"]
        rej = (", ".join(f"{k} {v}" for k, v in sorted(p["rejected"].items())) or "-") if wide \
            else str(sum(p["rejected"].values()))
        row = [p["problem"], speedup_ci(c["speedup"], c["ci_low"], c["ci_high"]) if c else "no champion"]
        if wide:
            row += [_x(c and c["vs_reference"]), _f(c and c["roofline_fraction"], ".0%")]
        row += [str(p["evaluations"]), rej, c["agent"] if c else "-"]
        if wide:
            row += [str(c["generation"]) if c else "", c["candidate_id"] if c else ""]
        champs.add_row(*row)
        for k, s in enumerate(c["shapes"] if c else []):
            row = [p["problem"] if k == 0 else "", shape_text(s["shape"]), num(s["baseline_us"])]
            if wide:
                row.append(num(s["reference_us"]))
            row += [num(s["candidate_us"]), speedup_ci(s["speedup"], s["ci_low"], s["ci_high"])]
            if wide:
                row.append(_x(s["vs_reference"]))
            row.append(_f(s["roofline_fraction"], ".0%"))
            shapes.add_row(*row)
    notes = notes_table(summary)
    return [champs] + ([notes] if notes is not None else []) + ([shapes] if shapes.row_count else [])


def champion_notes(summary: dict) -> list[str]:
    """When and under what contention each champion was last confirmed (one line each), then a
    warning line per problem whose figures were measured on a busy machine."""
    from swarmfactory.swarm.summary import confirmation_text

    lines = []
    for p in summary["problems"]:
        c = p.get("champion")
        if not c or "confirmed" not in c:
            continue
        lines.append(f"{p['problem']}: champion {c['candidate_id'][:12]} {confirmation_text(c, num)}")
    return lines + list(summary.get("warnings") or [])


def notes_table(summary: dict) -> Table | None:
    """``champion_notes`` as a borderless one-column table (printed like the others)."""
    lines = champion_notes(summary)
    if not lines:
        return None
    t = Table(box=None, show_header=False, show_edge=False, pad_edge=False, padding=0)
    t.add_column(overflow="fold")
    for line in lines:
        t.add_row(Text(line, style="yellow" if line.startswith("warning:") else ""))
    return t


def _x(ratio) -> str:
    return f"{num(ratio)}x" if ratio else "-"


def agent_table(summary: dict, wide: bool = False) -> Table:
    """Proposals and verdicts per agent; ``wide`` splits the rejected ones by kind."""
    t = compact_table("agents")
    t.add_column("agent", overflow="fold")
    cols = ["proposals", "correct", "faster", "champions"] + (list(REJECTED) if wide else ["rejected"])
    for col in cols:
        t.add_column(col.replace("_", " "), justify="right")
    for a in summary["agents"]:
        vals = [a.get(k, 0) for k in cols[:4]]
        vals += [a.get(k, 0) for k in REJECTED] if wide else [sum(a.get(k, 0) for k in REJECTED)]
        t.add_row(a["agent"], *(str(v) for v in vals))
    return t


LLM_COLS = ("agent", "model", "calls", "ok", "parse_error", "apply_error", "empty", "timeout", "candidates",
            "correct", "faster", "champions", "prompt_tokens", "completion_tokens", "cost_usd", "seconds")


def llm_table(summary: dict, wide: bool = False) -> Table | None:
    """What each LLM endpoint was asked, answered and cost; ``wide`` shows every counter."""
    if not summary.get("llm"):
        return None
    t = compact_table("LLM endpoints")
    if wide:
        for col in LLM_COLS:
            t.add_column(col.replace("_", " "), justify="left" if col in ("agent", "model") else "right",
                         overflow="fold")
        for r in summary["llm"]:
            t.add_row(*(str(r.get(k, 0)) for k in LLM_COLS))
        return t
    t.add_column("agent", overflow="fold")
    for col in ("calls", "ok", "failed", "in tok", "out tok", "cost $", "time s"):
        t.add_column(col, justify="right")
    for r in summary["llm"]:
        failed = r.get("calls", 0) - r.get("ok", 0)
        t.add_row(r["agent"], str(r.get("calls", 0)), str(r.get("ok", 0)), str(failed),
                  str(r.get("prompt_tokens", 0)), str(r.get("completion_tokens", 0)),
                  f"{r.get('cost_usd', 0):.2f}", f"{r.get('seconds', 0):.0f}")
    return t
