"""One self-contained HTML report per run: inline CSS and SVG, no network needed to view it.
The charts come from ``report/charts.py``, which the live dashboard draws with too."""

from __future__ import annotations

import html
from pathlib import Path

from swarmfactory.evidence.rows import CandidateRow
from swarmfactory.evidence.store import Store
from swarmfactory.report.charts import curve_svg, stacked_bars_svg
from swarmfactory.swarm.summary import confirmation_text, summarize

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}pre{background:#f7f7f7;padding:1em;
overflow:auto;font-size:12px}h2{border-bottom:2px solid #444;margin-top:2em}.muted{color:#777}
.warning{color:#9a6700;font-weight:600}"""


def _e(x) -> str:
    return html.escape(str(x))


def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def _shape(shape) -> str:
    return "x".join(str(v) for v in shape.values()) if isinstance(shape, dict) else str(shape)


def _chart_title(p: dict, final: dict | None) -> str:
    """What the chart shows, in the same figures as the champion sentence below it."""
    peak = max((v for _, v in p["best_curve"] if v is not None), default=None)
    search = (f"peak {peak:.2f}x as measured during the search" if peak is not None
              else "no faster candidate found in this run")
    start = p["started_from"]
    origin = (f"from the earlier champion's {start['speedup']:.2f}x" if start and start.get("speedup")
              else "from the baseline (1x)")
    text = f"<b>best speedup over the baseline by evaluation</b>: starts {origin}; {search} (blue line)"
    if final:
        what = "re-measured at the end of the run" if final["remeasured"] else "as announced"
        text += (f"; champion {final['speedup']:.2f}x [{_f(final['ci_low'])}, {_f(final['ci_high'])}], "
                 f"{what} (red, with its 95% CI)")
    return f'<p class="chart">{text}</p>'


def lineage(store: Store, candidate_id: str, limit: int = 30) -> list[tuple[CandidateRow, float | None]]:
    """The champion and its ancestors, breadth-first through ``parents``, each with its best
    speedup in any evaluation."""
    out, queue, seen = [], [candidate_id], set()
    while queue and len(out) < limit:
        cid = queue.pop(0)
        if cid in seen:
            continue
        seen.add(cid)
        cand = store.candidate(cid)
        if cand is None:
            continue
        evs = store.evaluations(candidate_id=cid)
        out.append((cand, max((e.speedup for e in evs if e.speedup is not None), default=None)))
        queue.extend(cand.parents or [])
    return out


def render(store: Store, run_id: str | None = None) -> str:
    s = summarize(store, run_id)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>swarmfactory run {_e(s['run_id'])}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>swarmfactory run {_e(s['run_id'])}</h1>",
             f"<p>status {_e(s['status'])}; started {_e(s['created_at'])}; {s['evaluations']} evaluations; "
             f"hardware {_e(s['hardware_id'])}; store {_e(store.shown)}</p>",
             "<h2>Agents</h2><table><tr><th>agent</th><th>proposals</th><th>correct</th><th>faster</th>"
             "<th>champions</th><th>build_failed</th><th>wrong</th><th>cheated</th><th>crashed</th><th>timed_out</th></tr>"]
    for a in s["agents"]:
        parts.append("<tr>" + "".join(f"<td>{_e(a.get(k, 0))}</td>" for k in (
            "agent", "proposals", "correct", "faster", "champions", "build_failed", "wrong", "cheated",
            "crashed", "timed_out")) + "</tr>")
    parts.append("</table>")
    if s["llm"]:
        cols = ("agent", "model", "calls", "ok", "parse_error", "apply_error", "empty", "timeout", "candidates",
                "correct", "faster", "champions", "prompt_tokens", "completion_tokens", "cost_usd", "seconds")
        parts.append("<h2>LLM endpoints</h2><table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>")
        for r in s["llm"]:
            parts.append("<tr>" + "".join(f"<td>{_e(r.get(c, 0))}</td>" for c in cols) + "</tr>")
        parts.append("</table>")
    for line in s.get("warnings") or []:
        parts.append(f"<p class='warning'>{_e(line)}</p>")
    if any(p["outcomes"] for p in s["problems"]):
        parts.append("<h2>Verdicts</h2>")
        parts.append(stacked_bars_svg([(p["problem"], p["outcomes"]) for p in s["problems"]]))
    for p in s["problems"]:
        parts.append(f"<h2>{_e(p['problem'])}</h2>")
        parts.append(f"<p>{p['evaluations']} evaluations; outcomes: "
                     + (", ".join(f"{_e(k)} {v}" for k, v in sorted(p["outcomes"].items())) or "none") + "</p>")
        if p["started_from"]:
            parts.append(f"<p>started from the champion of an earlier run: {_e(p['started_from']['candidate_id'])} "
                         f"({_f(p['started_from']['speedup'])}x)</p>")
        c = p["champion"]
        final = None
        if c and c["speedup"] is not None:
            conf = c.get("confirmed") or {}
            remeasured = (conf.get("purpose") == "remeasure" and conf.get("run_id") == s["run_id"]
                          if conf else str(c["reason"]).startswith("re-measured"))
            final = {"speedup": c["speedup"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
                     "remeasured": remeasured, "label": "champion, re-measured" if remeasured else "champion"}
        parts.append(_chart_title(p, final))
        parts.append(curve_svg(p["best_curve"], (p["started_from"] or {}).get("speedup"), final))
        if not c:
            parts.append("<p>no champion</p>")
            continue
        when = ""
        if final and final["remeasured"]:
            searched = [e.speedup for e in store.evaluations(candidate_id=c["candidate_id"], run_id=s["run_id"])
                        if e.purpose == "search" and e.speedup is not None]
            when = " (re-measured at the end of the run" + (
                f"; {searched[-1]:.2f}x when the search measured it)" if searched else ")")
        parts.append(f"<p><b>champion</b> {_e(c['candidate_id'])} by {_e(c['agent'])}/{_e(c['operator'])}: "
                     f"{_f(c['speedup'])}x [{_f(c['ci_low'])}, {_f(c['ci_high'])}]{when} over {_e(c['baseline'])}; "
                     f"{_f(c['vs_reference'])}x the eager reference; roofline {_f(c['roofline_fraction'], '.0%')}</p>")
        parts.append(f"<p class='confirmed'>{_e(confirmation_text(c, _f))}</p>")
        parts.append("<table><tr><th>shape</th><th>baseline us</th><th>reference us</th><th>champion us</th>"
                     "<th>speedup [95% CI]</th><th>roofline</th></tr>")
        for sh in c["shapes"]:
            parts.append(f"<tr><td>{_e(_shape(sh['shape']))}</td><td>{_f(sh['baseline_us'])}</td>"
                         f"<td>{_f(sh['reference_us'])}</td><td>{_f(sh['candidate_us'])}</td>"
                         f"<td>{_f(sh['speedup'])}x [{_f(sh['ci_low'])}, {_f(sh['ci_high'])}]</td>"
                         f"<td>{_f(sh['roofline_fraction'], '.0%')}</td></tr>")
        parts.append("</table><h3>lineage</h3><table><tr><th>candidate</th><th>agent</th><th>operator</th>"
                     "<th>gen</th><th>best speedup</th><th>knobs</th><th>parents</th></tr>")
        for anc, best in lineage(store, c["candidate_id"]):
            parts.append(f"<tr><td>{_e(anc.id)}</td><td>{_e(anc.agent)}</td><td>{_e(anc.operator)}</td>"
                         f"<td>{anc.generation}</td><td>{_f(best)}</td><td>{_e(anc.knobs)}</td>"
                         f"<td>{_e(', '.join(anc.parents or []))}</td></tr>")
        parts.append("</table><h3>champion source</h3>")
        parts.append(f"<pre>{_e(store.candidate(c['candidate_id']).source)}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


class ReportWriteError(OSError):
    """The report could not be written (a folder that takes no file, a full disk); the message is
    one line and no partial file is left behind."""


def write_report(store: Store, run_id: str | None, path: str | Path) -> Path:
    path = Path(path)
    html = render(store, run_id)
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(html)
            f.flush()  # a full disk shows here or at close, not later
    except OSError as exc:
        if not existed and path.is_file():
            path.unlink(missing_ok=True)
        raise ReportWriteError(f"cannot write the report to {path}: {exc.strerror or exc}") from exc
    return path
