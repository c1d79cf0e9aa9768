"""The dashboard's HTML: one overview page (live), one page per candidate, and the 404 page.

Pages are drawn on the server from ``queries`` results; charts come from ``report/charts.py``
(the report's). The only script is the small inline poller in ``LIVE_JS``: nothing is fetched
from anywhere but this server, so the page works offline.
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from urllib.parse import quote, urlencode

from swarmfactory.dashboard import queries as Q
from swarmfactory.report.charts import OUTCOME_COLORS, OUTCOME_ORDER, bars_svg, stacked_bars_svg, timeline_svg

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#24292f;color:#fff;padding:.6em 1.5em;display:flex;gap:1.5em;align-items:baseline;flex-wrap:wrap}
header a{color:#fff}header h1{font-size:1.25em;margin:0}#status{margin-left:auto;font-size:.9em;color:#9be9a8}
main{max-width:1200px;margin:0 auto;padding:0 1.5em 3em}section{background:#fff;border:1px solid #ddd;
border-radius:6px;padding:.4em 1.2em 1em;margin-top:1.2em}h2{font-size:1.15em;border-bottom:1px solid #ddd;
padding-bottom:.3em}table{border-collapse:collapse;margin:.5em 0;font-size:13px}td,th{border:1px solid #d8d8d8;
padding:3px 8px;text-align:right;vertical-align:top}th{background:#f3f3f3}td.l,th.l{text-align:left}
pre{background:#f6f8fa;padding:.8em;overflow:auto;font-size:12px;max-height:36em}.muted{color:#777}
.bar{display:inline-block;width:140px;height:10px;background:#e4e4e4;border-radius:5px;vertical-align:middle}
.bar i{display:block;height:10px;border-radius:5px;background:#1f6feb}.running{color:#0969da;font-weight:600}
.o{display:inline-block;padding:0 6px;border-radius:8px;color:#fff;font-size:12px}
.add{background:#e6ffec;display:block}.del{background:#ffebe9;display:block}.hunk{color:#0969da;display:block}
.pager a{margin-right:1em}.grid{display:grid;grid-template-columns:1fr 1fr;gap:1.2em}
.warning{color:#9a6700;font-weight:600}
@media(max-width:900px){.grid{grid-template-columns:1fr}}"""

LIVE_JS = """(function(){
var token=document.body.dataset.version,last=Date.now(),st=document.getElementById('status');
function frag(){var s=location.search;return location.pathname+(s?s+'&':'?')+'fragment=1';}
async function tick(){
 try{
  var v=await (await fetch('/api/version',{cache:'no-store'})).json();
  var running=document.querySelector('[data-running="1"]');
  if(v.version!==token||(running&&Date.now()-last>10000)){
   var r=await fetch(frag(),{cache:'no-store'});
   if(r.ok){document.getElementById('live').innerHTML=await r.text();token=v.version;last=Date.now();}
  }
  st.textContent='live \\u00b7 checked '+new Date().toLocaleTimeString();st.style.color='#9be9a8';
 }catch(e){st.textContent='disconnected: retrying';st.style.color='#ff8182';}
 setTimeout(tick,1000);
}
setTimeout(tick,1000);})();"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def _when(t) -> str:
    if t is None:
        return "-"
    if isinstance(t, datetime):
        t = Q._aware(t).astimezone(timezone.utc)
        return t.strftime("%Y-%m-%d %H:%M:%S")
    return str(t)[:19]


def _dur(s) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _outcome(o: str) -> str:
    return f'<span class="o" style="background:{OUTCOME_COLORS.get(o, "#999")}">{_e(o)}</span>'


def _cand(cid) -> str:
    return f'<a href="/candidates/{quote(str(cid))}">{_e(cid)}</a>' if cid else "-"


def _run(rid) -> str:
    return f'<a href="/runs/{quote(str(rid))}">{_e(rid)}</a>' if rid else "-"


def _link(path: str, params: dict, text: str) -> str:
    q = urlencode({k: v for k, v in params.items() if v is not None})
    return f'<a href="{_e(path + ("?" + q if q else ""))}">{_e(text)}</a>'


def page(title: str, body: str, store_label: str, version: str = "", live: bool = False) -> str:
    script = f"<script>{LIVE_JS}</script>" if live else ""
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<meta name='viewport' content='width=device-width,initial-scale=1'><style>{CSS}</style></head>"
            f"<body data-version='{_e(version)}'><header><h1><a href='/'>swarmfactory dashboard</a></h1>"
            f"<span>store {_e(store_label)}</span><span id='status'>{'live' if live else ''}</span></header>"
            f"<main>{body}</main>{script}</body></html>")


def not_found(message: str, store_label: str) -> str:
    return page("not found", f"<section><h2>Not found</h2><p id='error'>{_e(message)}</p>"
                             f"<p><a href='/'>back to the overview</a></p></section>", store_label)


# -- the overview ---------------------------------------------------------------------------------
def overview(c, run_id: str | None, params: dict) -> str:
    """Everything on the live page below the header (what the poller swaps in)."""
    runs = Q.runs(c, limit=params["runs_limit"], offset=params["runs_offset"])
    run_id = run_id or Q.latest_run_id(c)
    parts = [_runs_section(runs, run_id, params)]
    if run_id:
        parts.append(_run_section(c, Q.run(c, run_id), params))
    parts.append(_champions_section(c))
    parts.append(_cases_section(c, params))
    lessons = Q.lessons(c)
    if lessons:
        parts.append(_lessons_section(lessons))
    engine = Q.engine_runs(c)
    if engine:
        parts.append(_engine_section(engine))
    return "\n".join(parts)


def _progress_bar(p: dict, status: str) -> str:
    frac = p.get("fraction")
    what = []
    if p.get("budget"):
        what.append(f"{p['done']}/{p['budget']} evaluations")
    else:
        what.append(f"{p['done']} evaluations")
    if p.get("time_s"):
        what.append(f"{_dur(p['elapsed_s'])} of {_dur(p['time_s'])}")
    elif p.get("elapsed_s") is not None:
        what.append(_dur(p["elapsed_s"]))
    bar = (f'<span class="bar" title="{frac:.0%}"><i style="width:{100 * frac:.1f}%"></i></span> '
           if frac is not None else "")
    return bar + _e(", ".join(what))


def _runs_section(runs: dict, selected: str | None, params: dict) -> str:
    rows = []
    for r in runs["runs"]:
        p = r["progress"]
        status = (f'<span class="running" data-running="1">{_e(r["status"])}</span>' if r["status"] == "running"
                  else _e(r["status"]))
        mark = " &#9664;" if r["id"] == selected else ""
        rows.append(f"<tr data-run='{_e(r['id'])}'><td class='l'>{_run(r['id'])}{mark}</td><td class='l'>{status}</td>"
                    f"<td class='l'>{_e(p['kind'])}</td><td class='l'>{_e(', '.join(map(str, p['problems'])))}</td>"
                    f"<td class='l'>{_progress_bar(p, r['status'])}</td><td>{r['evaluations']}</td>"
                    f"<td>{r['faster']}</td><td class='l'>{_when(r['created_at'])}</td>"
                    f"<td class='l'>{_when(r['last_verdict_at'])}</td></tr>")
    pager = _pager("/", params, "runs_offset", runs["offset"], runs["limit"], runs["total"])
    body = ("<table><tr><th class='l'>run</th><th class='l'>status</th><th class='l'>kind</th>"
            "<th class='l'>problems</th><th class='l'>progress</th><th>evaluations</th><th>faster</th>"
            "<th class='l'>started (UTC)</th><th class='l'>last verdict</th></tr>" + "".join(rows) + "</table>"
            if rows else "<p class='muted'>no runs in this store yet</p>")
    return f"<section id='runs'><h2>Runs ({runs['total']})</h2>{body}{pager}</section>"


def _pager(path: str, params: dict, key: str, offset: int, limit: int, total: int) -> str:
    links = []
    keep = {k: v for k, v in params.items() if k in ("run", "before", "runs_offset", "cases_offset") and v}
    if offset > 0:
        links.append(_link(path, {**keep, key: max(offset - limit, 0) or None}, "newer"))
    if offset + limit < total:
        links.append(_link(path, {**keep, key: offset + limit}, "older"))
    return f"<p class='pager'>{''.join(links)}</p>" if links else ""


def _run_section(c, run: dict, params: dict) -> str:
    rid = run["id"]
    v = run["verdicts"]
    bars = stacked_bars_svg([(x["problem"], x["outcomes"]) for x in v], width=540)
    board = run["scoreboard"]
    cols = [o for o in OUTCOME_ORDER if any(o in a["outcomes"] for a in board)]
    head = ("<tr><th class='l'>agent</th><th>proposals</th><th>correct</th><th>faster</th><th>champions</th>"
            + "".join(f"<th>{_e(o)}</th>" for o in cols if o not in ("faster",)) + "</tr>")
    rows = "".join(f"<tr><td class='l'>{_e(a['agent'])}</td><td>{a['proposals']}</td><td>{a['correct']}</td>"
                   f"<td>{a['faster']}</td><td>{a['champions']}</td>"
                   + "".join(f"<td>{a['outcomes'].get(o, 0)}</td>" for o in cols if o != "faster") + "</tr>"
                   for a in board)
    scoreboard = f"<table>{head}{rows}</table>" if board else "<p class='muted'>no search verdicts yet</p>"
    evs = Q.evaluations(c, run_id=rid, before=params["before"], limit=params["limit"])
    status = (f'<span class="running" data-running="1">{_e(run["status"])}</span>' if run["status"] == "running"
              else _e(run["status"]))
    n = run.get("contention") or {}
    busy = [f"{n['busy']} of {n['evaluations']} evaluations measured on a busy machine"] if n.get("busy") else []
    busy += [f"{n['inconclusive']} inconclusive (too busy to time)"] if n.get("inconclusive") else []
    warn = (f"<p class='warning' id='run-contention'>warning: {_e('; '.join(busy))}: this run's figures are less "
            "certain</p>" if busy else "")
    return (f"<section id='run'><h2>Run {_e(rid)}: {status}</h2>{warn}"
            f"<p>{_progress_bar(run['progress'], run['status'])}; started {_when(run['created_at'])} UTC"
            + (f"; finished {_when(run['finished_at'])} UTC" if run["finished_at"] else "")
            + (f"; resumed from {_run(run['parent_run'])}" if run["parent_run"] else "") + "</p>"
            f"<div class='grid'><div><h3>Verdicts (search)</h3>{bars}</div>"
            f"<div><h3>Agent scoreboard</h3>{scoreboard}</div></div>"
            f"<h3>Latest verdicts</h3>{_evaluations_table(evs, params, rid)}</section>")


def _evaluations_table(evs: dict, params: dict, rid: str) -> str:
    if not evs["evaluations"]:
        return "<p class='muted'>no evaluations in this run yet</p>"
    rows = "".join(
        f"<tr data-evaluation='{e['id']}'><td>{e['id']}</td><td class='l'>{_when(e['created_at'])}</td>"
        f"<td class='l'>{_e(e['problem'])}</td><td class='l'>{_cand(e['candidate_id'])}</td>"
        f"<td class='l'>{_e(e['agent'] or '?')}</td><td class='l'>{_e(e['purpose'])}</td>"
        f"<td class='l'>{_outcome(e['outcome'])}</td><td>{_f(e['speedup'])}"
        f"{' [' + _f(e['ci_low']) + ', ' + _f(e['ci_high']) + ']' if e['ci_low'] is not None else ''}</td>"
        f"<td class='l'>{_e(e['detail'])}</td></tr>" for e in evs["evaluations"])
    pager = []
    if params["before"]:
        pager.append(_link("/runs/" + quote(rid), {}, "newest"))
    if evs["next_before"]:
        pager.append(_link("/runs/" + quote(rid), {"before": evs["next_before"]}, "older"))
    return ("<table id='evaluations'><tr><th>#</th><th class='l'>at (UTC)</th><th class='l'>problem</th>"
            "<th class='l'>candidate</th><th class='l'>agent</th><th class='l'>purpose</th><th class='l'>verdict</th>"
            "<th>speedup [95% CI]</th><th class='l'>detail</th></tr>" + rows + "</table>"
            + (f"<p class='pager'>{''.join(pager)}</p>" if pager else ""))


def _champions_section(c) -> str:
    hist = Q.champion_history(c)
    hardware = {r["hardware_id"] for r in hist}
    series: dict[str, list] = {}
    for r in hist:
        label = r["problem"] + (f" @{r['hardware_id'][:8]}" if len(hardware) > 1 else "")
        if r["speedup"] is not None and r["created_at"] is not None:
            series.setdefault(label, []).append((Q._aware(r["created_at"]).timestamp(), r["speedup"]))
    now = Q.champions_now(c)
    rows = "".join(f"<tr data-champion='{_e(r['problem'])}'><td class='l'>{_e(r['problem'])}</td>"
                   f"<td class='l'>{_e(r['hardware_id'][:12])}</td><td class='l'>"
                   f"{_cand(r['candidate_id'])}</td><td>{_f(r['speedup'])}</td><td class='l'>{_run(r['run_id'])}</td>"
                   f"<td class='l'>{_e(r['reason'])}</td><td class='l'>{_when(r['created_at'])}</td>"
                   f"{_confirmed_cells(r)}</tr>" for r in now)
    table = ("<table><tr><th class='l'>problem</th><th class='l'>machine</th><th class='l'>champion</th>"
             "<th>speedup</th><th class='l'>run</th><th class='l'>why</th><th class='l'>since (UTC)</th>"
             "<th class='l'>last confirmed (UTC)</th><th class='l'>under</th></tr>" + rows + "</table>") if rows else ""
    warn = "".join(f"<p class='warning'>{_e(line)}</p>" for line in _champion_warnings(now))
    return (f"<section id='champions'><h2>Champion speedup over time</h2>"
            f"{timeline_svg(series, until=datetime.now(timezone.utc).timestamp())}{warn}{table}</section>")


def _confirmed_cells(r: dict) -> str:
    if not r["candidate_id"]:
        return "<td class='l'>-</td><td class='l'>-</td>"
    conf = r["confirmed"]
    if conf is None:
        return "<td class='l'>never (no faster measurement here)</td><td class='l'>-</td>"
    when = f"{_when(conf['created_at'])} (evaluation {conf['id']}, {_e(conf['purpose'])})"
    if r["unconfirmed"]:
        when += f"<br><span class='muted'>since then: {_e(r['unconfirmed'])}</span>"
    style = " style='color:#9a6700'" if conf["busy"] else ""
    return f"<td class='l'>{when}</td><td class='l'{style}>{_e(conf['text'])}</td>"


def _champion_warnings(now: list[dict]) -> list[str]:
    """A line per champion whose figures are less certain: confirmed on a busy machine, or its
    latest re-measure could not confirm it."""
    out = []
    for r in now:
        conf = r["confirmed"]
        if r["candidate_id"] and conf and conf["busy"]:
            out.append(f"warning: the {r['problem']} champion {r['candidate_id'][:12]} was last confirmed on a busy "
                       f"machine ({conf['text']}): the engine does not take it until a quieter re-measure confirms it")
        elif r["candidate_id"] and r["unconfirmed"]:
            out.append(f"warning: the {r['problem']} champion {r['candidate_id'][:12]} is not confirmed by its "
                       f"latest re-measure ({r['unconfirmed'].split(':', 1)[0]})")
    return out


def _cases_section(c, params: dict) -> str:
    cs = Q.cases(c, limit=params["limit"], offset=params["cases_offset"])
    if not cs["total"]:
        return ("<section id='cases'><h2>Validation cases found</h2><p class='muted'>none yet: the adversary adds "
                "the cases that break a champion (the seed cases are in <code>swarmfactory cases</code>)</p></section>")
    rows = "".join(f"<tr><td class='l'>{_e(r['problem'])}</td><td class='l'>{_e(_shape(r['shape']))}</td>"
                   f"<td>{r['seed']}</td><td class='l'>{_e(r['dist'])}</td><td class='l'>{_e(r['found_by'])}</td>"
                   f"<td class='l'>{_cand(r['broke_candidate'])}</td><td class='l'>{_e(r['note'] or '')}</td>"
                   f"<td class='l'>{_when(r['created_at'])}</td></tr>" for r in cs["cases"])
    return (f"<section id='cases'><h2>Validation cases found ({cs['total']})</h2><table><tr><th class='l'>problem</th>"
            "<th class='l'>shape</th><th>seed</th><th class='l'>values</th><th class='l'>found by</th>"
            "<th class='l'>broke</th><th class='l'>note</th><th class='l'>found at (UTC)</th></tr>" + rows + "</table>"
            + _pager("/", params, "cases_offset", cs["offset"], cs["limit"], cs["total"]) + "</section>")


def _shape(shape) -> str:
    return "x".join(str(v) for v in shape.values()) if isinstance(shape, dict) else str(shape)


def _lessons_section(lessons: list[dict]) -> str:
    rows = "".join(f"<tr><td class='l'>{_e(r['status'])}</td><td class='l'>{_e(r['problem'] or '-')}</td>"
                   f"<td class='l'>{_e(r['text'])}" + (f"<br><span class='muted'>retired: {_e(r['why'])}</span>"
                                                      if r["status"] != "active" and r["why"] else "")
                   + f"</td><td class='l'>{_e(r['agent'])}</td><td class='l'>{_run(r['run_id'])}</td>"
                   f"<td>{r['changes']}</td><td class='l'>{_when(r['created_at'])}</td></tr>" for r in lessons[:100])
    active = sum(r["status"] == "active" for r in lessons)
    return (f"<section id='lessons'><h2>Lessons ({active} active)</h2><table><tr><th class='l'>status</th>"
            "<th class='l'>problem</th><th class='l'>lesson</th><th class='l'>by</th><th class='l'>run</th>"
            "<th>changes</th><th class='l'>as of (UTC)</th></tr>" + rows + "</table></section>")


def _engine_section(runs: list[dict]) -> str:
    parts = ["<section id='engine'><h2>Engine tuning runs</h2>"]
    for r in runs:
        parts.append(f"<h3>{_run(r['id'])}: {_e(r['model'])} ({_e(r['weights'] or '?')}), {_e(r['status'])}</h3>")
        levels = sorted({(lv["workload"], lv["concurrency"]) for d in r["designs"] for lv in d["serving"]},
                        key=lambda k: (str(k[0]), k[1] or 0))
        head = "".join(f"<th>{_e(w)} c={_e(cc)}<br>tok/s</th>" for w, cc in levels)
        rows = []
        for d in r["designs"]:
            at = {(lv["workload"], lv["concurrency"]): lv for lv in d["serving"]}
            cells = "".join(f"<td title='TTFT p99 {_f(at[k]['ttft_ms_p99'], '.0f')} ms'>"
                            f"{_f(at[k]['output_tok_s'], '.1f')}</td>" if k in at else "<td>-</td>" for k in levels)
            rows.append(f"<tr><td class='l'>{_cand(d['candidate_id'])}</td><td class='l'>{_e(d['agent'] or '?')}</td>"
                        f"<td class='l'>{_e(d['purpose'])}</td><td class='l'>{_outcome(d['outcome'])}</td>"
                        f"<td>{_f(d['ratio'])}</td><td>{_f(d['fitness'], '.1f')}</td>{cells}"
                        f"<td class='l'>{_e(d['design'])}</td></tr>")
        ratios = [(f"{d['candidate_id'][:14]} ({d['agent'] or '?'})", d["ratio"]) for d in r["designs"]
                  if d["purpose"] == "search" and d["ratio"]]
        if ratios:
            parts.append("<p>serving fitness against the default design (dashed: 1x)</p>" + bars_svg(ratios[:40]))
        parts.append("<table><tr><th class='l'>design</th><th class='l'>agent</th><th class='l'>purpose</th>"
                     "<th class='l'>verdict</th><th>vs default</th><th>fitness</th>" + head
                     + "<th class='l'>settings</th></tr>" + "".join(rows) + "</table>"
                     if rows else "<p class='muted'>no designs measured yet</p>")
    parts.append("</section>")
    return "".join(parts)


# -- a candidate ------------------------------------------------------------------------------
def candidate(info: dict) -> str:
    cand = info["candidate"]
    cid = cand["id"]
    head = (f"<section><h2>Candidate {_e(cid)}</h2><p>problem <b>{_e(cand['problem'])}</b>; by "
            f"<b>{_e(cand['agent'])}</b> ({_e(cand['operator'])}), generation {cand['generation']}; run "
            f"{_run(cand['run_id'])}; backend {_e(cand['backend'])}; best measured speedup "
            f"<b>{_f(info['best_speedup'])}x</b></p>"
            + (f"<p>knobs <code>{_e(json.dumps(cand['knobs'], sort_keys=True))}</code></p>" if cand["knobs"] else "")
            + "</section>")
    anc = info["ancestors"]
    chain = " &larr; ".join(f"{_cand(a['id'])} <span class='muted'>({_e(a['agent'])}, {_f(a['best_speedup'])}x)"
                            "</span>" for a in anc)
    lineage = (f"<section id='lineage'><h2>Lineage (parent &rarr; child)</h2><p>{chain}</p>"
               "<table><tr><th class='l'>candidate</th><th class='l'>agent</th><th class='l'>operator</th><th>gen</th>"
               "<th>best speedup</th><th class='l'>parents</th></tr>"
               + "".join(f"<tr><td class='l'>{_cand(a['id'])}</td><td class='l'>{_e(a['agent'])}</td>"
                         f"<td class='l'>{_e(a['operator'])}</td><td>{a['generation']}</td>"
                         f"<td>{_f(a['best_speedup'])}</td>"
                         f"<td class='l'>{', '.join(_cand(p) for p in (a['parents'] or []))}</td></tr>" for a in anc)
               + "</table>")
    if info["children"]:
        lineage += ("<h3>children</h3><table><tr><th class='l'>candidate</th><th class='l'>agent</th>"
                    "<th class='l'>operator</th><th>gen</th><th>best speedup</th></tr>"
                    + "".join(f"<tr><td class='l'>{_cand(k['id'])}</td><td class='l'>{_e(k['agent'])}</td>"
                              f"<td class='l'>{_e(k['operator'])}</td><td>{k['generation']}</td>"
                              f"<td>{_f(k['best_speedup'])}</td></tr>" for k in info["children"]) + "</table>")
    lineage += "</section>"
    if info["diff"] is not None:
        src = (f"<section id='diff'><h2>Source: diff against parent {_cand(cand['parents'][0])}</h2>"
               f"<pre>{_diff_html(info['diff']) or 'identical source (flags or knobs differ)'}</pre></section>")
    else:
        why = "its parent is not in this store" if cand["parents"] else "no parent: a first-generation candidate"
        src = f"<section id='diff'><h2>Source ({why})</h2><pre>{_e(cand['source'])}</pre></section>"
    evs = "".join(_evaluation_block(e) for e in info["evaluations"]) or "<p class='muted'>not evaluated yet</p>"
    return head + lineage + src + f"<section id='evidence'><h2>Evidence (latest evaluations)</h2>{evs}</section>"


def _diff_html(diff: str) -> str:
    out = []
    for line in diff.splitlines():
        cls = ("hunk" if line.startswith("@@") else "add" if line.startswith("+") and not line.startswith("+++")
               else "del" if line.startswith("-") and not line.startswith("---") else "")
        out.append(f"<span class='{cls}'>{_e(line)}</span>" if cls else _e(line) + "\n")
    return "".join(out)


def _evaluation_block(e: dict) -> str:
    ci = f" [{_f(e['ci_low'])}, {_f(e['ci_high'])}]" if e["ci_low"] is not None else ""
    out = [f"<h3>evaluation {e['id']}: {_outcome(e['outcome'])} at {_e(e['stage'])} ({_e(e['purpose'])}, "
           f"{_when(e['created_at'])} UTC)</h3><p><b>{_e(e['detail'])}</b></p>"
           f"<p>speedup {_f(e['speedup'])}x{ci} over {_e(e['baseline'] or '-')}; "
           f"{_f(e['vs_reference'])}x the eager reference; {e['cases_checked']} validation cases checked; "
           f"{_f(e['seconds'], '.1f')} s; validation set {_e(e['validation_version'])}; run {_run(e['run_id'])}</p>"]
    shapes = [s for s in (e["shapes"] or []) if isinstance(s, dict)]
    if shapes:
        out.append("<table><tr><th class='l'>shape</th><th>baseline us</th><th>reference us</th><th>candidate us</th>"
                   "<th>speedup [95% CI]</th><th>roofline</th></tr>"
                   + "".join(f"<tr><td class='l'>{_e(_shape(s.get('shape')))}</td><td>{_f(s.get('baseline_us'))}</td>"
                             f"<td>{_f(s.get('reference_us'))}</td><td>{_f(s.get('candidate_us'))}</td>"
                             f"<td>{_f(s.get('speedup'))} [{_f(s.get('ci_low'))}, {_f(s.get('ci_high'))}]</td>"
                             f"<td>{_f(s.get('roofline_fraction'), '.0%')}</td></tr>" for s in shapes) + "</table>")
    if e["flags"]:
        out.append("<p>flags: " + "; ".join(_e(f) for f in e["flags"]) + "</p>")
    if e["evidence"]:
        text = json.dumps(e["evidence"], indent=1, sort_keys=True, default=str)
        out.append(f"<details><summary>evidence</summary><pre>{_e(Q._clip(text, 20000))}</pre></details>")
    return "".join(out)
