"""The dashboard's reads: SQLAlchemy Core over the store's tables, SELECT only.

Every query is bounded: aggregates run in SQL (GROUP BY), lists are pages (LIMIT, and keyset
``before`` for evaluations), so a request costs the same with 100 evaluations or 100,000 and no
request loads every evaluation into Python. Functions take a connection and return plain dicts
(JSON-ready apart from datetimes, which ``jsonable`` turns into text).
"""

from __future__ import annotations

import difflib
import re
from datetime import datetime, timezone

from sqlalchemy import Text, case, cast, func, or_, select, true
from sqlalchemy.engine import Connection

from swarmfactory.contention import BUSY
from swarmfactory.evidence import quality
from swarmfactory.evidence import schema as S
from swarmfactory.outcome import CORRECT

E, C, R, CH, V, L = S.evaluations, S.candidates, S.runs, S.champions, S.validation_cases, S.lessons
EVAL_LIST = (E.c.id, E.c.candidate_id, E.c.problem, E.c.run_id, E.c.purpose, E.c.outcome, E.c.stage, E.c.detail,
             E.c.speedup, E.c.ci_low, E.c.ci_high, E.c.seconds, E.c.created_at)
_SECRET = re.compile(r"key|token|secret|passw|auth|cookie", re.I)


class NotFound(LookupError):
    """An id that names nothing in the store (the server answers 404)."""


def version(c: Connection) -> str:
    """A token that changes whenever anything the dashboard shows changes (the store is
    append-only apart from a run's status): the highest ids, and the runs' statuses."""
    subs = [select(func.max(t.c.id)).scalar_subquery() for t in (E, CH, V, L)]
    row = c.execute(select(*subs, select(func.count()).select_from(R).scalar_subquery(),
                           select(func.count()).select_from(R).where(R.c.status == "running")
                           .scalar_subquery())).one()
    return "-".join(str(v or 0) for v in row)


def _model_name(cfg: dict) -> str:
    """An engine run's model file by its name (the folder it lies in is this machine's business)."""
    return str(cfg.get("model") or "").replace("\\", "/").rsplit("/", 1)[-1]


def _budget(cfg: dict) -> dict:
    kind = cfg.get("kind") or "kernel"
    if kind == "optimize":  # optimize.py: the model and the stage it is at (its kernel and tune runs are listed too)
        inner = cfg.get("config") or {}
        running = [r for r in cfg.get("runs") or [] if r.get("status") == "running"]
        stage = str(cfg.get("stage") or "")
        if stage == "kernels" and running:
            stage += f" (pass {running[0].get('pass')}: {running[0].get('problem')}, run {running[0].get('run_id')})"
        elif stage == "engine" and cfg.get("tune_run"):
            stage += f" (tune run {cfg['tune_run']})"
        return {"kind": kind, "problems": [f"{_model_name(inner)}: stage {stage}"], "budget": None,
                "time_s": inner.get("time_s"), "agents": None}
    return {"kind": kind, "problems": cfg.get("problems") or ([_model_name(cfg)] if cfg.get("model") else []),
            "budget": cfg.get("budget"), "time_s": cfg.get("time_s"),
            "agents": cfg.get("agents") if isinstance(cfg.get("agents"), list) else None}


def _aware(t):
    if isinstance(t, datetime) and t.tzinfo is None:
        return t.replace(tzinfo=timezone.utc)  # SQLite's CURRENT_TIMESTAMP is UTC without a zone
    return t


def _progress(run: dict, done: int, last_at) -> dict:
    """How far a run is: evaluations against its budget and/or elapsed time against its time."""
    cfg = _budget(run["config"] or {})
    start, end = _aware(run["created_at"]), _aware(run["finished_at"])
    now = end or (datetime.now(timezone.utc) if run["status"] == "running" else _aware(last_at) or start)
    elapsed = max((now - start).total_seconds(), 0.0) if start else None
    parts = []
    if cfg["budget"]:
        parts.append(done / cfg["budget"])
    if cfg["time_s"] and elapsed is not None:
        parts.append(elapsed / cfg["time_s"])
    frac = 1.0 if run["status"] == "finished" else min(max(parts), 1.0) if parts else None
    return {**cfg, "done": done, "elapsed_s": elapsed, "fraction": frac}


def runs(c: Connection, limit: int = 20, offset: int = 0) -> dict:
    """A page of runs, newest first, each with its evaluation counts and progress."""
    total = c.execute(select(func.count()).select_from(R)).scalar()
    rows = [dict(r._mapping) for r in c.execute(
        select(R).order_by(R.c.created_at.desc(), R.c.id.desc()).limit(limit).offset(offset))]
    counts = {}
    if rows:
        q = (select(E.c.run_id, func.count().label("evaluations"),
                    func.sum(case((E.c.purpose == "search", 1), else_=0)).label("search"),
                    func.sum(case((E.c.outcome == "faster", 1), else_=0)).label("faster"),
                    func.max(E.c.created_at).label("last_at"))
             .where(E.c.run_id.in_([r["id"] for r in rows])).group_by(E.c.run_id))
        counts = {r.run_id: r._mapping for r in c.execute(q)}
    out = []
    for r in rows:
        n = counts.get(r["id"], {})
        done = int(n.get("search") or 0)
        out.append({"id": r["id"], "status": r["status"], "hardware_id": r["hardware_id"],
                    "parent_run": r["parent_run"], "created_at": r["created_at"], "finished_at": r["finished_at"],
                    "evaluations": int(n.get("evaluations") or 0), "faster": int(n.get("faster") or 0),
                    "last_verdict_at": n.get("last_at"), "progress": _progress(r, done, n.get("last_at"))})
    return {"total": total, "limit": limit, "offset": offset, "runs": out}


def run(c: Connection, run_id: str) -> dict:
    """One run: its progress, verdicts per problem and the agent scoreboard (search evaluations)."""
    row = c.execute(select(R).where(R.c.id == run_id)).first()
    if row is None:
        raise NotFound(f"no run {run_id!r} in this store")
    r = dict(row._mapping)
    n = c.execute(select(func.count(), func.max(E.c.created_at)).where(E.c.run_id == run_id,
                                                                       E.c.purpose == "search")).one()
    return {"id": r["id"], "status": r["status"], "hardware_id": r["hardware_id"], "parent_run": r["parent_run"],
            "created_at": r["created_at"], "finished_at": r["finished_at"],
            "progress": _progress(r, int(n[0]), n[1]), "verdicts": verdicts(c, run_id),
            "scoreboard": scoreboard(c, run_id), "contention": run_contention(c, run_id)}


def _busy():
    """SQL: the evaluation was measured on a busy machine (evidence/quality.py: the harness said
    so, or the timed code waited for a CPU more than ``contention.BUSY`` of the time)."""
    return or_(E.c.evidence[("contention", "busy")].as_boolean() == true(),
               E.c.evidence[("contention", "suffered")].as_float() > BUSY)


def run_contention(c: Connection, run_id: str) -> dict:
    """How many of a run's evaluations were measured on a busy machine, or were inconclusive."""
    row = c.execute(select(func.count(), func.sum(case((_busy(), 1), else_=0)),
                           func.sum(case((E.c.outcome == "inconclusive", 1), else_=0)))
                    .where(E.c.run_id == run_id)).one()
    return {"evaluations": int(row[0] or 0), "busy": int(row[1] or 0), "inconclusive": int(row[2] or 0)}


def latest_run_id(c: Connection) -> str | None:
    return c.execute(select(R.c.id).order_by(R.c.created_at.desc(), R.c.id.desc()).limit(1)).scalar()


def verdicts(c: Connection, run_id: str | None = None) -> list[dict]:
    """Search verdicts by problem and outcome: ``[{problem, outcomes: {outcome: n}, total}]``."""
    q = select(E.c.problem, E.c.outcome, func.count().label("n")).where(E.c.purpose == "search")
    if run_id:
        q = q.where(E.c.run_id == run_id)
    by: dict[str, dict] = {}
    for r in c.execute(q.group_by(E.c.problem, E.c.outcome).order_by(E.c.problem)):
        by.setdefault(r.problem, {})[r.outcome] = r.n
    return [{"problem": p, "outcomes": o, "total": sum(o.values())} for p, o in by.items()]


def scoreboard(c: Connection, run_id: str | None = None) -> list[dict]:
    """Per agent: proposals (search evaluations), verdicts, correct, faster, champions it made."""
    q = (select(C.c.agent, E.c.outcome, func.count().label("n")).select_from(E.join(C, C.c.id == E.c.candidate_id))
         .where(E.c.purpose == "search"))
    if run_id:
        q = q.where(E.c.run_id == run_id)
    board: dict[str, dict] = {}
    for r in c.execute(q.group_by(C.c.agent, E.c.outcome)):
        a = board.setdefault(r.agent, {"agent": r.agent, "proposals": 0, "outcomes": {}, "champions": 0})
        a["outcomes"][r.outcome] = r.n
        a["proposals"] += r.n
    q = (select(C.c.agent, func.count().label("n")).select_from(CH.join(C, C.c.id == CH.c.candidate_id))
         .where(~CH.c.reason.like("re-measured%")))
    if run_id:
        q = q.where(CH.c.run_id == run_id)
    for r in c.execute(q.group_by(C.c.agent)):
        board.setdefault(r.agent, {"agent": r.agent, "proposals": 0, "outcomes": {}, "champions": 0})["champions"] = r.n
    for a in board.values():
        a["correct"] = sum(a["outcomes"].get(o, 0) for o in CORRECT)
        a["faster"] = a["outcomes"].get("faster", 0)
    return sorted(board.values(), key=lambda a: (-a["champions"], -a["faster"], a["agent"]))


def evaluations(c: Connection, run_id: str | None = None, problem: str | None = None, outcome: str | None = None,
                candidate_id: str | None = None, before: int | None = None, limit: int = 25) -> dict:
    """A page of evaluations, newest first (keyset: ``before`` an id), with the candidate's agent;
    ``next_before`` continues the listing (None at the end)."""
    q = select(*EVAL_LIST, C.c.agent, C.c.operator).select_from(E.outerjoin(C, C.c.id == E.c.candidate_id))
    for col, value in ((E.c.run_id, run_id), (E.c.problem, problem), (E.c.outcome, outcome),
                       (E.c.candidate_id, candidate_id)):
        if value is not None:
            q = q.where(col == value)
    if before is not None:
        q = q.where(E.c.id < before)
    rows = [dict(r._mapping) for r in c.execute(q.order_by(E.c.id.desc()).limit(limit + 1))]
    more = len(rows) > limit
    rows = rows[:limit]
    for r in rows:
        r["detail"] = _clip(r["detail"], 240)
    return {"evaluations": rows, "next_before": rows[-1]["id"] if more and rows else None, "limit": limit}


def champion_history(c: Connection, problem: str | None = None, limit: int = 2000) -> list[dict]:
    """Champion changes per (problem, machine), oldest first: the latest ``limit`` rows."""
    q = select(CH.c.id, CH.c.problem, CH.c.hardware_id, CH.c.candidate_id, CH.c.evaluation_id, CH.c.run_id,
               CH.c.speedup, CH.c.reason, CH.c.created_at)
    if problem:
        q = q.where(CH.c.problem == problem)
    rows = [dict(r._mapping) for r in c.execute(q.order_by(CH.c.id.desc()).limit(limit))]
    return rows[::-1]


def champions_now(c: Connection) -> list[dict]:
    """The title as it stands per (problem, machine): the latest champions row,
    with ``confirmed`` (the champion's latest ``faster`` evaluation holding the title: when, by
    which evaluation, the contention it was measured under; None if none) and ``unconfirmed``
    (the reason, where a later re-measure could not confirm it)."""
    latest = (select(func.max(CH.c.id)).group_by(CH.c.problem, CH.c.hardware_id)
              .scalar_subquery())
    rows = [dict(r._mapping) for r in c.execute(
        select(CH.c.id, CH.c.problem, CH.c.problem_spec, CH.c.hardware_id, CH.c.candidate_id, CH.c.evaluation_id,
               CH.c.run_id, CH.c.speedup, CH.c.reason, CH.c.created_at)
        .where(CH.c.id.in_(latest)).order_by(CH.c.problem, CH.c.hardware_id, CH.c.id))]
    cols = (E.c.id, E.c.created_at, E.c.purpose, E.c.run_id, E.c.speedup,
            E.c.evidence["contention"].label("contention"))
    for r in rows:
        r["confirmed"], r["unconfirmed"] = None, None
        cid = r["candidate_id"]
        if not cid:
            continue
        mine = (E.c.candidate_id == cid, E.c.outcome == "faster", E.c.hardware_id == r["hardware_id"],
                E.c.problem_spec == r["problem_spec"])
        ev = c.execute(select(*cols).select_from(CH.join(E, E.c.id == CH.c.evaluation_id))
                       .where(CH.c.problem == r["problem"], CH.c.problem_spec == r["problem_spec"],
                              CH.c.hardware_id == r["hardware_id"], CH.c.candidate_id == cid, *mine)
                       .order_by(CH.c.id.desc()).limit(1)).first()
        if ev is None:  # rows from before confirmations were kept: its latest faster evaluation
            ev = c.execute(select(*cols).where(E.c.problem == r["problem"], *mine).order_by(E.c.id.desc())
                           .limit(1)).first()
        if ev is not None:
            conf = dict(ev._mapping)
            conf["busy"] = quality.busy(conf["contention"])
            conf["text"] = quality.describe(conf["contention"])
            r["confirmed"] = conf
        if r["reason"].startswith("re-measured:") and "not confirmed" in r["reason"]:
            r["unconfirmed"] = r["reason"].removeprefix("re-measured: ")
    return rows


def candidate(c: Connection, cand_id: str, eval_limit: int = 10) -> dict:
    """A candidate with its lineage (ancestors through ``parents``, children), its source diff
    against its first parent and its latest evaluations with their evidence."""
    row = c.execute(select(C).where(C.c.id == cand_id)).first()
    if row is None:
        raise NotFound(f"no candidate {cand_id!r} in this store")
    cand = dict(row._mapping)
    parents = [p for p in (cand["parents"] or []) if isinstance(p, str)]
    parent = c.execute(select(C).where(C.c.id == parents[0])).first() if parents else None
    diff = None
    if parent is not None:
        diff = "".join(difflib.unified_diff(parent.source.splitlines(keepends=True),
                                            cand["source"].splitlines(keepends=True),
                                            fromfile=f"parent {parent.id}", tofile=f"candidate {cand_id}", n=3))
    evs = [dict(r._mapping) for r in c.execute(
        select(E).where(E.c.candidate_id == cand_id).order_by(E.c.id.desc()).limit(eval_limit))]
    for e in evs:
        e["evidence"] = scrub(e["evidence"])
        e.pop("hardware", None)
    children = [dict(r._mapping) for r in c.execute(
        select(C.c.id, C.c.agent, C.c.operator, C.c.generation)
        .where(C.c.problem == cand["problem"], cast(C.c.parents, Text).like(f'%"{cand_id}"%'))
        .order_by(C.c.created_at).limit(50))]
    for ch in children:
        ch["best_speedup"] = _best(c, ch["id"])
    return {"candidate": cand, "parent_found": parent is not None, "diff": diff, "evaluations": evs,
            "ancestors": ancestors(c, cand_id), "children": children, "best_speedup": _best(c, cand_id)}


def _best(c: Connection, cand_id: str):
    return c.execute(select(func.max(E.c.speedup)).where(E.c.candidate_id == cand_id,
                                                         E.c.outcome == "faster")).scalar()


def ancestors(c: Connection, cand_id: str, limit: int = 30) -> list[dict]:
    """The candidate and its ancestors, breadth-first through ``parents`` (at most ``limit``)."""
    out, queue, seen = [], [cand_id], set()
    while queue and len(out) < limit:
        cid = queue.pop(0)
        if cid in seen:
            continue
        seen.add(cid)
        row = c.execute(select(C.c.id, C.c.agent, C.c.operator, C.c.generation, C.c.parents, C.c.knobs)
                        .where(C.c.id == cid)).first()
        if row is None:
            continue
        out.append({**row._mapping, "best_speedup": _best(c, cid)})
        queue.extend(p for p in (row.parents or []) if isinstance(p, str))
    return out


def cases(c: Connection, problem: str | None = None, limit: int = 25, offset: int = 0) -> dict:
    """Validation cases found during runs, newest first, with who found them and what they broke."""
    q = select(V.c.id, V.c.problem, V.c.case_key, V.c.shape, V.c.seed, V.c.dist, V.c.found_by, V.c.broke_candidate,
               V.c.note, V.c.created_at)
    n = select(func.count()).select_from(V)
    if problem:
        q, n = q.where(V.c.problem == problem), n.where(V.c.problem == problem)
    rows = [dict(r._mapping) for r in c.execute(q.order_by(V.c.id.desc()).limit(limit).offset(offset))]
    return {"total": c.execute(n).scalar(), "limit": limit, "offset": offset, "cases": rows}


def lessons(c: Connection, limit: int = 500) -> list[dict]:
    """Each lesson as it stands (the latest row of its key among the latest ``limit`` rows),
    active first, newest first."""
    rows = [dict(r._mapping) for r in c.execute(select(L).order_by(L.c.id.desc()).limit(limit))]
    latest: dict[str, dict] = {}
    for r in rows:  # newest first: the first row seen of a key is the lesson as it stands
        data = r["data"] if isinstance(r["data"], dict) else {}
        key = data.get("key") or f"row:{r['id']}"
        if key in latest:
            latest[key]["changes"] += 1
            continue
        latest[key] = {"id": r["id"], "key": key, "problem": r["problem"], "hardware_id": r["hardware_id"],
                       "agent": r["agent"], "text": r["text"], "status": data.get("status", "active"),
                       "why": data.get("why"), "run_id": r["run_id"], "created_at": r["created_at"], "changes": 0}
    return sorted(latest.values(), key=lambda x: (x["status"] != "active", -x["id"]))


def engine_runs(c: Connection, limit: int = 10, per_run: int = 100) -> list[dict]:
    """Engine-factory tune runs (newest first) with each design's verdict and serving figures."""
    cand_runs = [dict(r._mapping) for r in c.execute(select(R).order_by(R.c.created_at.desc()).limit(500))]
    tunes = [r for r in cand_runs if (r["config"] or {}).get("kind") == "engine-tune"][:limit]
    out = []
    for r in tunes:
        q = (select(E.c.id, E.c.candidate_id, E.c.problem, E.c.purpose, E.c.outcome, E.c.speedup, E.c.detail,
                    E.c.seconds, E.c.evidence, C.c.agent)
             .select_from(E.outerjoin(C, C.c.id == E.c.candidate_id)).where(E.c.run_id == r["id"])
             .order_by(E.c.id).limit(per_run))
        designs = []
        for e in c.execute(q):
            ev = e.evidence if isinstance(e.evidence, dict) else {}
            serving = ev.get("serving") if isinstance(ev.get("serving"), dict) else {}
            levels = [{"workload": wl, "concurrency": lv.get("concurrency"), "output_tok_s": lv.get("output_tok_s"),
                       "ttft_ms_p99": lv.get("ttft_ms_p99"), "tpot_ms_median": lv.get("tpot_ms_median")}
                      for wl, lvs in serving.items() if isinstance(lvs, list) for lv in lvs if isinstance(lv, dict)]
            designs.append({"evaluation_id": e.id, "candidate_id": e.candidate_id, "agent": e.agent,
                            "purpose": e.purpose, "outcome": e.outcome, "ratio": e.speedup,
                            "fitness": ev.get("fitness"), "design": _clip(str(ev.get("design") or ""), 200),
                            "detail": _clip(e.detail, 200), "seconds": e.seconds, "serving": levels})
        cfg = r["config"] or {}
        problem = c.execute(select(E.c.problem).where(E.c.run_id == r["id"]).limit(1)).scalar()
        model = _model_name(cfg)
        out.append({"id": r["id"], "status": r["status"], "created_at": r["created_at"],
                    "model": model or problem or "?", "problem": problem, "weights": cfg.get("weights"),
                    "concurrency": cfg.get("concurrency"), "workloads": cfg.get("workloads"), "designs": designs})
    return out


def problems(c: Connection) -> list[str]:
    return [r[0] for r in c.execute(select(E.c.problem).distinct().order_by(E.c.problem))]


def scrub(obj, depth: int = 0):
    """``obj`` with the values of secret-looking keys (key, token, password, ...) replaced."""
    if depth > 12:
        return "..."
    if isinstance(obj, dict):
        return {k: "[hidden]" if _SECRET.search(str(k)) and isinstance(v, (str, int, float)) and v != ""
                else scrub(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v, depth + 1) for v in obj]
    return obj


def jsonable(obj):
    """Datetimes as ISO text, everything else as it is (for ``json.dumps``)."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, datetime):
        return _aware(obj).isoformat()
    return obj


def _clip(text, n: int):
    text = "" if text is None else str(text)
    return text if len(text) <= n else text[: n - 1] + "…"
