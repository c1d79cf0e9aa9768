"""One self-contained HTML report per run: inline CSS and SVG, no network needed to view it."""

from __future__ import annotations

import html
from pathlib import Path

from swarmfactory.evidence.store import Store
from swarmfactory.swarm.summary import summarize

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}pre{background:#f7f7f7;padding:1em;
overflow:auto;font-size:12px}h2{border-bottom:2px solid #444;margin-top:2em}.muted{color:#777}"""


def _e(x) -> str:
    return html.escape(str(x))


def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def curve_svg(points: list, width: int = 640, height: int = 220) -> str:
    """Best speedup so far against evaluation number, as an inline SVG step line."""
    pts = [(i, s) for i, s in points if s is not None]
    if not pts:
        return '<p class="muted">no faster candidate in this run</p>'
    n = max(i for i, _ in points)
    top = max(max(s for _, s in pts), 1.0) * 1.1
    pad = 40

    def xy(i, s):
        return pad + (width - 2 * pad) * (i - 1) / max(n - 1, 1), height - pad - (height - 2 * pad) * s / top

    path = []
    for k, (i, s) in enumerate(pts):
        x, y = xy(i, s)
        if k:
            path.append(f"L{x:.1f},{path_y:.1f}")
        path.append(f"{'M' if not k else 'L'}{x:.1f},{y:.1f}")
        path_y = y
    x_end, _ = xy(n, pts[-1][1])
    path.append(f"L{x_end:.1f},{path_y:.1f}")
    _, y1 = xy(1, 1.0)
    return (f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
            f'<line x1="{pad}" y1="{y1:.1f}" x2="{width - pad}" y2="{y1:.1f}" stroke="#bbb" stroke-dasharray="4"/>'
            f'<text x="{width - pad + 3}" y="{y1 + 4:.1f}" font-size="11">1x</text>'
            f'<path d="{" ".join(path)}" fill="none" stroke="#1f6feb" stroke-width="2"/>'
            f'<text x="{pad}" y="{height - 8}" font-size="11">evaluation 1</text>'
            f'<text x="{width - pad - 60}" y="{height - 8}" font-size="11">evaluation {n}</text>'
            f'<text x="4" y="{pad - 10}" font-size="11">best speedup over the baseline (max {top / 1.1:.2f}x)</text>'
            "</svg>")


def lineage(store: Store, candidate_id: str, limit: int = 30) -> list[dict]:
    """The champion and its ancestors, breadth-first through ``parents``."""
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
        best = max((e["speedup"] for e in evs if e["speedup"] is not None), default=None)
        out.append({**cand, "speedup": best, "outcomes": sorted({e["outcome"] for e in evs})})
        queue.extend(cand["parents"] or [])
    return out


def render(store: Store, run_id: str | None = None) -> str:
    s = summarize(store, run_id)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>swarmfactory run {_e(s['run_id'])}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>swarmfactory run {_e(s['run_id'])}</h1>",
             f"<p>status {_e(s['status'])}; started {_e(s['created_at'])}; {s['evaluations']} evaluations; "
             f"hardware {_e(s['hardware_id'])}; store {_e(store.url)}</p>",
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
    for p in s["problems"]:
        parts.append(f"<h2>{_e(p['problem'])}</h2>")
        parts.append(f"<p>{p['evaluations']} evaluations; outcomes: "
                     + (", ".join(f"{_e(k)} {v}" for k, v in sorted(p["outcomes"].items())) or "none") + "</p>")
        if p["started_from"]:
            parts.append(f"<p>started from the champion of an earlier run: {_e(p['started_from']['candidate_id'])} "
                         f"({_f(p['started_from']['speedup'])}x)</p>")
        parts.append(curve_svg(p["best_curve"]))
        c = p["champion"]
        if not c:
            parts.append("<p>no champion</p>")
            continue
        parts.append(f"<p><b>champion</b> {_e(c['candidate_id'])} by {_e(c['agent'])}/{_e(c['operator'])}: "
                     f"{_f(c['speedup'])}x [{_f(c['ci_low'])}, {_f(c['ci_high'])}] over {_e(c['baseline'])}; "
                     f"{_f(c['vs_reference'])}x the eager reference; roofline {_f(c['roofline_fraction'], '.0%')}</p>")
        parts.append("<table><tr><th>shape</th><th>baseline us</th><th>reference us</th><th>champion us</th>"
                     "<th>speedup [95% CI]</th><th>roofline</th></tr>")
        for sh in c["shapes"]:
            parts.append(f"<tr><td>{_e(sh['shape'])}</td><td>{_f(sh['baseline_us'])}</td><td>{_f(sh['reference_us'])}</td>"
                         f"<td>{_f(sh['candidate_us'])}</td><td>{_f(sh['speedup'])}x [{_f(sh['ci_low'])}, "
                         f"{_f(sh['ci_high'])}]</td><td>{_f(sh['roofline_fraction'], '.0%')}</td></tr>")
        parts.append("</table><h3>lineage</h3><table><tr><th>candidate</th><th>agent</th><th>operator</th>"
                     "<th>gen</th><th>best speedup</th><th>knobs</th><th>parents</th></tr>")
        for anc in lineage(store, c["candidate_id"]):
            parts.append(f"<tr><td>{_e(anc['id'])}</td><td>{_e(anc['agent'])}</td><td>{_e(anc['operator'])}</td>"
                         f"<td>{anc['generation']}</td><td>{_f(anc['speedup'])}</td><td>{_e(anc['knobs'])}</td>"
                         f"<td>{_e(', '.join(anc['parents'] or []))}</td></tr>")
        parts.append("</table><h3>champion source</h3>")
        parts.append(f"<pre>{_e(store.candidate(c['candidate_id'])['source'])}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(store: Store, run_id: str | None, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(store, run_id))
    return path
