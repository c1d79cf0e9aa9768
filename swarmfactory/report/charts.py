"""Charts as inline SVG strings, drawn on the server: no script, no network, no plotting library.

One module for the HTML report (``report/html.py``) and the live dashboard (``dashboard/``), so
the same figure looks the same in both. Every function takes plain numbers and returns markup;
labels are escaped here.
"""

from __future__ import annotations

import html
import math
from datetime import datetime, timezone

# One colour per verdict, the same everywhere (green: faster, amber: correct but not faster; teal
# and light grey: correct with no speed claim, not timed or too busy to time).
OUTCOME_COLORS = {"faster": "#1a7f37", "not_faster": "#d4a72c", "verified": "#1b7c83", "inconclusive": "#afb8c1",
                  "wrong": "#d1242f", "cheated": "#8250df", "build_failed": "#6e7781", "crashed": "#bc4c00",
                  "timed_out": "#0969da", "needs_device": "#57606a"}
OUTCOME_ORDER = list(OUTCOME_COLORS)
SERIES_COLORS = ["#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0598bc", "#bf3989", "#57606a"]
FONT = 'font-size="13" font-family="system-ui,sans-serif"'


def _e(x) -> str:
    return html.escape(str(x))


def nice_step(span: float, target: int) -> float:
    """A 1/2/2.5/5 x 10^k step that cuts ``span`` into about ``target`` intervals."""
    raw = max(span, 1e-9) / target
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _open(width: int, height: int, label: str) -> str:
    return (f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="{_e(label)}" style="max-width:100%;height:auto" xmlns="http://www.w3.org/2000/svg" {FONT}>')


def _y_axis(el: list, top_value: float, left: int, top: int, pw: float, ph: float, unit: str = "x"):
    """Grid lines and values from 0 to ``top_value``; returns the value -> y mapping."""
    ystep = nice_step(top_value, 5)
    ytop = ystep * math.ceil(top_value * 1.04 / ystep)

    def Y(v: float) -> float:
        return top + ph * (1 - v / ytop)

    k = 0
    while k * ystep <= ytop + 1e-9:
        v = k * ystep
        el.append(f'<line x1="{left}" y1="{Y(v):.1f}" x2="{left + pw}" y2="{Y(v):.1f}" stroke="#e4e4e4"/>'
                  f'<text x="{left - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:g}{unit}</text>')
        k += 1
    el.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#444"/>'
              f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#444"/>')
    return Y


def curve_svg(points: list, start: float | None = None, final: dict | None = None,
              width: int = 680, height: int = 280) -> str:
    """Best speedup so far against evaluation number (1..n), as an inline SVG step line.

    The line starts at evaluation 1 from ``start`` (the champion the run started from) or from
    the baseline (1x) and rises at each faster candidate, as measured during the search.
    ``final`` (``speedup``, ``ci_low``, ``ci_high``, ``label``) marks the champion's announced
    figure after the last evaluation, with its CI, so a re-measured figure is told apart."""
    n = len(points)
    if n == 0:
        return '<p class="muted">no evaluations in this run</p>'
    level = start if start else 1.0
    steps = []  # (evaluation, best so far)
    for i, s in points:
        level = max(level, s) if s is not None else level
        steps.append((i, level))
    tops = [v for _, v in steps] + [1.0]
    if final and final.get("speedup") is not None:
        tops += [final["speedup"], final.get("ci_high") or final["speedup"]]
    left, right, top, bottom = 60, 178 if final else 24, 14, 46
    pw, ph = width - left - right, height - top - bottom
    xmax = max(n, 2)

    def X(i: float) -> float:
        return left + pw * (i - 1) / (xmax - 1)

    el = [_open(width, height, "best speedup so far by evaluation")]
    Y = _y_axis(el, max(tops), left, top, pw, ph)
    xstep = next(m * 10 ** e for e in range(12) for m in (1, 2, 5) if m * 10 ** e >= (n - 1) / 6)
    xticks = [1] + [t for t in range(xstep, n + 1, xstep) if t - 1 >= xstep / 2]
    if n - xticks[-1] >= xstep / 2:
        xticks.append(n)  # the last evaluation, unless a tick already stands near it
    for t in xticks:  # x ticks
        el.append(f'<line x1="{X(t):.1f}" y1="{top + ph}" x2="{X(t):.1f}" y2="{top + ph + 5}" stroke="#444"/>'
                  f'<text x="{X(t):.1f}" y="{top + ph + 20}" text-anchor="middle">{t}</text>')
    el.append(f'<line x1="{left}" y1="{Y(1):.1f}" x2="{left + pw}" y2="{Y(1):.1f}" stroke="#888" '
              f'stroke-dasharray="5 4"/><text x="{left + pw - 4}" y="{Y(1) + 16:.1f}" text-anchor="end" '
              f'fill="#666">baseline</text>')
    path, prev = [], None
    for i, v in steps:
        if prev is None:
            path.append(f"M{X(i):.1f},{Y(v):.1f}")
        else:
            path.append(f"L{X(i):.1f},{Y(prev):.1f}L{X(i):.1f},{Y(v):.1f}")
        prev = v
    if n == 1:
        path.append(f"L{X(2):.1f},{Y(prev):.1f}")
    el.append(f'<path d="{"".join(path)}" fill="none" stroke="#1f6feb" stroke-width="2.5"/>')
    if final and final.get("speedup") is not None:
        x, lo, hi = left + pw + 14, final.get("ci_low"), final.get("ci_high")
        if lo is not None and hi is not None:
            el.append(f'<line x1="{x}" y1="{Y(lo):.1f}" x2="{x}" y2="{Y(hi):.1f}" stroke="#d1242f" stroke-width="2"/>')
        el.append(f'<circle cx="{x}" cy="{Y(final["speedup"]):.1f}" r="4.5" fill="#d1242f"/>'
                  f'<text x="{x + 9}" y="{Y(final["speedup"]) - 3:.1f}" fill="#d1242f">{final["speedup"]:.2f}x</text>'
                  f'<text x="{x + 9}" y="{Y(final["speedup"]) + 13:.1f}" fill="#d1242f" font-size="12">'
                  f'{_e(final.get("label", "champion"))}</text>')
    el.append(f'<text x="{left + pw / 2:.1f}" y="{height - 6}" text-anchor="middle">evaluation (this run)</text>'
              f'<text transform="translate(16,{top + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
              f'best speedup so far</text></svg>')
    return "".join(el)


def _time_ticks(t0: float, t1: float, n: int = 5) -> list[float]:
    span = max(t1 - t0, 1.0)
    return [t0 + span * k / (n - 1) for k in range(n)]


def _time_label(t: float, span: float) -> str:
    d = datetime.fromtimestamp(t, timezone.utc)
    return d.strftime("%H:%M:%S" if span < 600 else "%H:%M" if span < 86400 else "%m-%d %H:%M")


def timeline_svg(series: dict[str, list[tuple[float, float]]], width: int = 680, height: int = 260,
                 ylabel: str = "champion speedup", until: float | None = None) -> str:
    """Step lines of a value over wall-clock time (UTC), one per series (``label -> [(unix time,
    value)]``, time ascending), with a legend. A series holds its last value to the right edge,
    ``until`` (e.g. now) or the last point."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return '<p class="muted">nothing to plot yet</p>'
    times = [t for pts in series.values() for t, _ in pts]
    t0, t1 = min(times), max(times + ([until] if until else []))
    t1 = t1 if t1 > t0 else t0 + 60
    left, right, top, bottom = 60, 40, 14, 46 + 18 * ((len(series) + 2) // 3)
    pw, ph = width - left - right, height - top - bottom
    el = [_open(width, height, ylabel + " over time")]
    Y = _y_axis(el, max([v for pts in series.values() for _, v in pts] + [1.0]), left, top, pw, ph)

    def X(t: float) -> float:
        return left + pw * (t - t0) / (t1 - t0)

    for t in _time_ticks(t0, t1, 5 if t1 - t0 >= 8 else 2):
        el.append(f'<line x1="{X(t):.1f}" y1="{top + ph}" x2="{X(t):.1f}" y2="{top + ph + 5}" stroke="#444"/>'
                  f'<text x="{X(t):.1f}" y="{top + ph + 20}" text-anchor="middle">{_time_label(t, t1 - t0)}</text>')
    el.append(f'<line x1="{left}" y1="{Y(1):.1f}" x2="{left + pw}" y2="{Y(1):.1f}" stroke="#888" '
              f'stroke-dasharray="5 4"/>')
    for k, (label, pts) in enumerate(series.items()):
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        d, prev = [], None
        for t, v in pts:
            d.append(f"M{X(t):.1f},{Y(v):.1f}" if prev is None else f"L{X(t):.1f},{Y(prev):.1f}L{X(t):.1f},{Y(v):.1f}")
            prev = v
        d.append(f"L{left + pw:.1f},{Y(prev):.1f}")
        el.append(f'<path d="{"".join(d)}" fill="none" stroke="{color}" stroke-width="2.5"/>')
        el.extend(f'<circle cx="{X(t):.1f}" cy="{Y(v):.1f}" r="3" fill="{color}"><title>{_e(label)}: {v:.2f}x at '
                  f'{_time_label(t, 1e9)}</title></circle>' for t, v in pts)
        lx, ly = left + (k % 3) * (pw / 3), top + ph + 38 + 18 * (k // 3)
        el.append(f'<rect x="{lx:.1f}" y="{ly - 10}" width="12" height="12" fill="{color}"/>'
                  f'<text x="{lx + 17:.1f}" y="{ly}">{_e(label)} ({prev:.2f}x)</text>')
    el.append(f'<text transform="translate(16,{top + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
              f'{_e(ylabel)}</text></svg>')
    return "".join(el)


def stacked_bars_svg(rows: list[tuple[str, dict[str, int]]], width: int = 680) -> str:
    """One horizontal bar per row (``label``, ``{outcome: count}``), split by outcome in the
    verdict colours, the count written at its end, a legend of the outcomes present below."""
    rows = [(label, {k: v for k, v in counts.items() if v}) for label, counts in rows]
    rows = [(label, counts) for label, counts in rows if counts]
    if not rows:
        return '<p class="muted">no verdicts yet</p>'
    present = [o for o in OUTCOME_ORDER if any(o in c for _, c in rows)]
    present += sorted({o for _, c in rows for o in c} - set(present))
    label_w = min(240, 20 + 8 * max(len(label) for label, _ in rows))
    left, right, bar, gap = label_w, 70, 20, 8
    legend, x, line = [], 10.0, 0  # (x, line, outcome), wrapped to the width
    for o in present:
        need = 30 + 7.5 * len(o)
        if x + need > width and x > 10:
            x, line = 10.0, line + 1
        legend.append((x, line, o))
        x += need
    top_legend = len(rows) * (bar + gap) + 22
    height = top_legend + 18 * (line + 1)
    most = max(sum(c.values()) for _, c in rows)
    pw = width - left - right
    el = [_open(width, height, "verdict breakdown")]
    for i, (label, counts) in enumerate(rows):
        y, x = 6 + i * (bar + gap), float(left)
        el.append(f'<text x="{left - 8}" y="{y + bar - 5}" text-anchor="end">{_e(label)}</text>')
        for o in present:
            n = counts.get(o, 0)
            if not n:
                continue
            w = pw * n / most
            el.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar}" '
                      f'fill="{OUTCOME_COLORS.get(o, "#999")}"><title>{_e(label)}: {_e(o)} {n}</title></rect>')
            x += w
        el.append(f'<text x="{x + 6:.1f}" y="{y + bar - 5}">{sum(counts.values())}</text>')
    for x, line, o in legend:
        y = top_legend + 18 * line
        el.append(f'<rect x="{x:.1f}" y="{y - 10}" width="12" height="12" fill="{OUTCOME_COLORS.get(o, "#999")}"/>'
                  f'<text x="{x + 16:.1f}" y="{y}">{_e(o)}</text>')
    el.append("</svg>")
    return "".join(el)


def bars_svg(rows: list[tuple[str, float]], unit: str = "x", reference: float | None = 1.0,
             width: int = 680) -> str:
    """One horizontal bar per row (``label``, ``value``), the value written at its end; a dashed
    line marks ``reference`` (e.g. 1x: the default)."""
    rows = [(label, v) for label, v in rows if v is not None]
    if not rows:
        return '<p class="muted">nothing measured yet</p>'
    label_w = min(240, 20 + 8 * max(len(label) for label, _ in rows))
    left, right, bar, gap = label_w, 80, 18, 6
    height = len(rows) * (bar + gap) + 10
    top = max([v for _, v in rows] + [reference or 0]) or 1.0
    pw = width - left - right
    el = [_open(width, height, "bars")]
    for i, (label, v) in enumerate(rows):
        y = 4 + i * (bar + gap)
        w = pw * max(v, 0) / top
        el.append(f'<text x="{left - 8}" y="{y + bar - 4}" text-anchor="end">{_e(label)}</text>'
                  f'<rect x="{left}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar}" fill="#1f6feb"/>'
                  f'<text x="{left + w + 6:.1f}" y="{y + bar - 4}">{v:.2f}{_e(unit)}</text>')
    if reference:
        x = left + pw * reference / top
        el.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height}" stroke="#888" stroke-dasharray="5 4"/>')
    el.append("</svg>")
    return "".join(el)
