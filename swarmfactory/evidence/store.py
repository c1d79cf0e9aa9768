"""The evidence store: every problem, candidate, evaluation, case, champion and lesson.

SQLAlchemy over SQLite (default ``.swarmfactory/evidence.db``; WAL, one writer: the coordinator)
or PostgreSQL (``postgresql://...``). Each ``record_*`` commits its own transaction, so a
``kill -9`` loses at most what was in flight. Reads return frozen rows (``evidence/rows.py``).
What may be called from several threads, and which tables are only ever appended to: ``Store``.

A store opened for writing is checked to take a write before any work. A write that fails later
(a full disk, a file made read-only, a lost connection) is kept in a local journal
(``evidence/journal.py``) and raises ``StoreWriteError``, whose one line says where it is kept;
the next open for writing writes the journal into the store. Messages show the URL through
``redact``: never a password.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, insert, inspect, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from swarmfactory.evidence import schema as S
from swarmfactory.evidence.journal import Journal, replay
from swarmfactory.evidence.quality import contention
from swarmfactory.evidence.rows import (TOOL_KEYS, CandidateRow, Champion, Evaluation, FoundCase, KnobEvidence,
                                        Lesson, LlmCall, MeasuredFigure, Profile, Run)
from swarmfactory.hardware import cpu_fingerprint
from swarmfactory.outcome import MEASURED
from swarmfactory.redact import redact

DEFAULT_PATH = ".swarmfactory/evidence.db"


class StoreError(RuntimeError):
    pass


class StoreWriteError(StoreError):
    """A write the store did not take after it was opened; what could be kept is in its journal.
    ``result``: what the caller had computed, for a front end that still shows it (``api.evaluate``
    sets the verdict's)."""

    result: dict | None = None


def _evidence_write(method):
    """A public write (several row writes, as ``record_verdict``): once one of them fails, the rest
    are journaled too, and ``StoreWriteError`` is raised when the outermost such call returns."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        depth = getattr(self._unit, "depth", 0)
        self._unit.depth = depth + 1
        if depth == 0:
            self._unit.journaled = 0
        try:
            res = method(self, *args, **kwargs)
        finally:
            self._unit.depth = depth
        if depth == 0 and self._unit.journaled:
            raise StoreWriteError(self.write_failure())
        return res
    return wrapper


def store_url(path_or_url: str | None, create: bool = True) -> str:
    """The SQLAlchemy URL for ``--store`` (a SQLite path or a URL), checked before anything opens it.

    Only the default store's folder (``.swarmfactory/``, used when neither a path nor
    ``SWARMFACTORY_STORE`` is given) is created; a path the user gave must lie in an existing
    folder. With ``create=False`` (reading commands) a SQLite file that does not exist is an
    error, never a new empty store.
    """
    given = path_or_url or os.environ.get("SWARMFACTORY_STORE")
    target = given or DEFAULT_PATH
    if "://" in target:
        scheme = target.split("://", 1)[0].lower()
        if scheme == "postgresql":
            return target.replace("postgresql://", "postgresql+psycopg://", 1)
        if scheme.split("+", 1)[0] == "postgresql":
            return target
        if scheme.split("+", 1)[0] != "sqlite":
            raise StoreError(f"unknown store URL scheme {scheme!r} in {redact(target)!r}: give a SQLite file "
                             "path or a postgresql:// URL")
        from sqlalchemy.engine import make_url

        db = make_url(target).database
        if db and db != ":memory:":
            _check_sqlite_path(Path(db), target, create, given is None)
        return target
    path = Path(target).expanduser()
    _check_sqlite_path(path, target, create, given is None)
    return f"sqlite:///{path.resolve()}"


def _check_sqlite_path(path: Path, shown: str, create: bool, default: bool) -> None:
    if path.is_dir():
        raise StoreError(f"store {shown} is a folder: give a database file, e.g. --store {path / 'evidence.db'}")
    if path.exists():
        return
    if not create:
        raise StoreError(f"no evidence store at {shown}: check --store (or SWARMFACTORY_STORE); "
                         "`swarmfactory run` or `eval` creates one")
    parent = path.parent
    if parent.is_dir():
        return
    if default:
        parent.mkdir(parents=True, exist_ok=True)
        return
    what = "is a file, not a folder" if parent.exists() else "does not exist"
    raise StoreError(f"cannot create store {shown}: {parent} {what} (a new store's folder is not created "
                     "for you): create the folder or choose another --store")


def content_hash(source: str, backend: str, flags: list[str] | tuple[str, ...] = ()) -> str:
    """The dedupe key: normalised source (trailing spaces, blank lines) + backend + flags."""
    lines = [ln.rstrip() for ln in source.strip().splitlines()]
    norm = "\n".join(ln for ln in lines if ln)
    return hashlib.sha256("\0".join([norm, backend, " ".join(flags)]).encode()).hexdigest()[:20]


class Store:
    """Open (``create=False``: an existing store only) or create an evidence store; ``write``
    (default: ``create``): it will be written to, so check now that it takes a write and write in
    what an earlier failure left in its journal (``replayed``: rows written, duplicates skipped).

    Every failure to open one is a ``StoreError`` with a one-line message. ``created`` says
    whether this call made a new store. ``shown``: the URL as messages show it (no password).
    ``close()`` (or the end of ``with Store(url) as store:``) ends its connections.

    **Threads.** One ``Store`` may be shared by every thread of a process (the coordinator's
    loop, the harness's parallel builds, the leases' heartbeat): each write is one transaction
    taken under ``lock`` (SQLite has one writer; the lock keeps this process's writers from
    waiting on each other's busy timeout); each read takes a pooled connection of its own,
    except inside ``consistent()``, whose snapshot belongs to the thread that opened it; a
    public write in progress (``_evidence_write``) is tracked per thread, and the journal
    appends under a lock of its own. Rows are frozen: one may be handed between threads or
    cached. ``close()`` is for the end, when no thread uses the store any more. Several processes
    and machines may share one store (SQLite in WAL mode on one machine; PostgreSQL anywhere):
    everything that must not happen twice is decided by a unique key or a conditional update in
    the database, never by what one process read before (``record_candidate``, ``add_case``,
    ``record_problem``, evaluation leases).

    **Append-only.** Evidence is never rewritten: ``problems``, ``candidates``, ``evaluations``,
    ``validation_cases``, ``llm_calls`` and the measured ``baselines`` and ``roofs`` are
    inserted only; ``champions`` and ``lessons`` too, a change being a new row (the latest row
    of a problem's title, of a lesson's key, is how it stands; earlier rows are its history).
    Updated in place: a run's ``status``, ``finished_at`` and ``config`` (``set_run_status``,
    ``set_run_config``: a resumed run given new limits); ``sf_meta``'s schema version (rewritten
    as it is, the check that a store takes writes; journal replay markers are inserted and
    kept); the coordination tables, ``leases`` (claimed, renewed, taken over, done; deleted when
    abandoned: ``evidence/leases.py``) and ``processes`` (deleted once ended:
    ``evidence/processes.py``).
    """

    def __init__(self, path_or_url: str | None = None, *, create: bool = True, write: bool | None = None):
        self.url = store_url(path_or_url, create)
        self.shown = redact(self.url.replace("postgresql+psycopg://", "postgresql://", 1))  # as the user wrote it
        try:
            self.engine: Engine = create_engine(self.url, future=True, pool_pre_ping=True)
        except Exception as exc:
            raise StoreError(f"cannot open store {self.shown}: {_one_line(exc)}") from exc
        db = self.engine.url.database if self.url.startswith("sqlite") else None
        self._new_file = bool(db) and db != ":memory:" and not Path(db).exists()
        if self.url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self.lock = threading.Lock()
        self._snap = threading.local()  # the connection of a ``consistent()`` block, per thread
        self._unit = threading.local()  # the public write in progress, per thread (``_evidence_write``)
        self.journal = Journal(self.url, db)  # shared with ``on_hardware`` views, as the engine is
        self.hardware = cpu_fingerprint()
        write = create if write is None else write
        self.created = self._init_schema(create, write)
        self.replayed = (0, 0)
        if write:
            self._check_writable()
            self._replay()

    def _init_schema(self, create: bool, write: bool) -> bool:
        try:
            if self.url.startswith("sqlite"):  # read-only look first: a file that is not ours stays untouched
                _check_sqlite_store(self.engine.url.database, create)
            with self.engine.connect() as c:
                exists = inspect(c).has_table(S.meta.name)
            if not exists and not create:
                raise StoreError(f"{self.shown} is not a swarmfactory evidence store (no {S.meta.name} table)")
            if not exists:
                _create_schema(self.engine)
            with self.engine.begin() as c:
                row = c.execute(select(S.meta.c.value).where(S.meta.c.key == "schema_version")).first()
            if row is None:
                try:
                    with self.engine.begin() as c:
                        c.execute(insert(S.meta).values(key="schema_version", value=str(S.SCHEMA_VERSION)))
                except Exception:  # another process made the same new store at this moment
                    with self.engine.begin() as c:
                        row = c.execute(select(S.meta.c.value).where(S.meta.c.key == "schema_version")).first()
            if row is not None:
                if int(row[0]) != S.SCHEMA_VERSION:
                    raise StoreError(f"store {self.shown} has schema v{row[0]}, this swarmfactory "
                                     f"reads v{S.SCHEMA_VERSION}; use a new --store")
            return not exists
        except StoreError:
            self.engine.dispose()
            raise
        except Exception as exc:
            self.engine.dispose()
            note = self._folder_note() if write and self._sqlite_file() is not None else ""
            if (self._new_file or note) and _write_failure(exc):
                what = f": cannot create it{note}" if self._new_file else note
                raise StoreError(f"the store {self.shown} is not writable{what}: {_one_line(exc)}") from exc
            raise StoreError(f"cannot open store {self.shown}: {_one_line(exc)}") from exc

    # -- writability and the journal -------------------------------------------------------------
    def _sqlite_file(self) -> Path | None:
        db = self.engine.url.database if self.url.startswith("sqlite") else None
        return Path(db) if db and db != ":memory:" else None

    def _folder_note(self) -> str:
        path = self._sqlite_file()
        if path is None:
            return ""
        if path.exists() and not os.access(path, os.W_OK):
            return f" (the file {path} is read-only)"
        if not os.access(path.parent, os.W_OK):
            return f" (its folder {path.parent} is not writable; SQLite keeps its -wal and -shm files there)"
        return ""

    @contextlib.contextmanager
    def _refused_is_unwritable(self, why: str):
        """A write refused inside the block closes the store with one line: not writable, ``why``."""
        try:
            yield
        except Exception as exc:
            if not _write_failure(exc):
                raise
            self.engine.dispose()
            raise StoreError(f"the store {self.shown} is not writable{why}: {_one_line(exc)}") from None

    def _check_writable(self) -> None:
        """One real write (the schema version, rewritten as it is) before any work."""
        with self._refused_is_unwritable(self._folder_note()), self.lock, self.engine.begin() as c:
            c.execute(update(S.meta).where(S.meta.c.key == "schema_version").values(value=S.meta.c.value))

    def _replay(self) -> None:
        pending = self.journal.pending()
        if not pending:
            return
        with self._refused_is_unwritable(f": writing in what {', '.join(map(str, pending))} kept failed"):
            self.replayed = replay(self.journal, self.engine, self.lock)

    @property
    def unwritable(self) -> str | None:
        """Why a write failed after the open (None while writes succeed); later writes are journaled."""
        return self.journal.failure

    def write_failure(self) -> str:
        """The one line that says a write failed, why, and where what it held is kept."""
        j = self.journal
        text = f"the store {self.shown} is not writable: {self.unwritable}"
        if j.error is not None:
            return text + f"; the write could not be kept either: {j.error}"
        if j.kept:
            return (text + f"; {j.kept} write(s) kept in {j.where}, written into the store when it is next "
                           "opened for writing")
        return text

    def _exec(self, stmt):
        """One write in its own transaction. A write the store does not take (not a duplicate) marks
        the store unwritable and raises ``StoreWriteError``."""
        try:
            with self.lock, self.engine.begin() as c:
                return c.execute(stmt)
        except Exception as exc:
            if not _write_failure(exc):
                raise
            self.journal.failure = self.journal.failure or _one_line(exc)
            raise StoreWriteError(self.write_failure()) from exc

    def _write(self, table, values: dict, where: dict | None = None):
        """An evidence row: written, or kept in the journal (the caller, an ``_evidence_write``,
        then raises). A duplicate (``IntegrityError``) is raised as is."""
        if self.unwritable is None:
            try:
                if where is None:
                    return self._exec(insert(table).values(**values))
                cond = [table.c[k] == v for k, v in where.items()]
                return self._exec(update(table).where(*cond).values(**values))
            except StoreWriteError:
                pass
        self.journal.append(table.name, values, where)
        self._unit.journaled = getattr(self._unit, "journaled", 0) + 1
        return None

    def _cache_write(self, stmt) -> None:
        """A measured machine fact kept to save measuring it again: a failure costs the cache, not
        the measurement (nothing journaled)."""
        if self.unwritable is not None:
            return
        try:
            self._exec(stmt)
        except StoreWriteError:
            pass

    def close(self) -> None:
        """End the store's connections (views from ``on_hardware`` share them). A store used
        after ``close`` connects again."""
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def discard_if_created(self) -> None:
        """Remove the SQLite file this ``Store`` just created (a run that could not start leaves
        no empty store behind); anything else is left alone."""
        self.close()
        if self.created and self._new_file:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(self.engine.url.database + suffix).unlink(missing_ok=True)

    def on_hardware(self, hardware: dict) -> "Store":
        """This store as seen from another machine: the same database, connections and lock, but
        every per-hardware key (evaluations recorded, champions, baselines, lessons) is
        ``hardware``'s. A coordinator whose executor measures on a cluster's nodes reads and
        writes through the view of the nodes' hardware."""
        view = copy.copy(self)
        view.hardware = dict(hardware)
        return view

    @contextlib.contextmanager
    def consistent(self):
        """Reads inside this block (this thread) see one snapshot of the store, however many
        queries they take, while runs keep writing: one REPEATABLE READ transaction on
        PostgreSQL, one read transaction on SQLite (WAL keeps its snapshot)."""
        if getattr(self._snap, "conn", None) is not None:
            yield self
            return
        with self.engine.connect() as c:
            if c.dialect.name == "sqlite":
                c.exec_driver_sql("BEGIN")  # pysqlite starts none before a read
            else:
                c = c.execution_options(isolation_level="REPEATABLE READ")
                c.begin()
            self._snap.conn = c
            try:
                yield self
            finally:
                self._snap.conn = None
                c.rollback()

    def _rows(self, stmt) -> list[dict]:
        """The rows of a SELECT as dicts (the snapshot's connection inside ``consistent()``)."""
        snap = getattr(self._snap, "conn", None)
        if snap is not None:
            return [dict(r._mapping) for r in snap.execute(stmt)]
        with self.engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(stmt)]

    def _typed(self, row_type, stmt) -> list:
        """The rows of a SELECT as ``row_type`` rows."""
        return [row_type.of(r) for r in self._rows(stmt)]

    def _one(self, row_type, stmt):
        """The first row of a SELECT as a ``row_type`` row; None where there is none."""
        rows = self._typed(row_type, stmt.limit(1))
        return rows[0] if rows else None

    # -- runs -------------------------------------------------------------------------------
    @_evidence_write
    def create_run(self, config: dict, parent_run: str | None = None) -> str:
        run_id = secrets.token_hex(4)
        self._write(S.runs, dict(id=run_id, status="running", config=config, hardware_id=self.hardware["id"],
                                 parent_run=parent_run))
        return run_id

    @_evidence_write
    def set_run_status(self, run_id: str, status: str) -> None:
        from datetime import datetime, timezone

        self._write(S.runs, dict(status=status, finished_at=datetime.now(timezone.utc) if status != "running" else None),
                    where={"id": run_id})

    @_evidence_write
    def set_run_config(self, run_id: str, config: dict) -> None:
        """A run's recorded configuration, replaced (a resumed run given new limits)."""
        self._write(S.runs, dict(config=config), where={"id": run_id})

    def runs(self) -> list[Run]:
        """Every run of the store, oldest first."""
        return self._typed(Run, select(S.runs).order_by(S.runs.c.created_at, S.runs.c.id))

    def run(self, run_id: str | None = None) -> Run | None:
        """Run ``run_id``, or the latest run."""
        q = select(S.runs)
        q = q.where(S.runs.c.id == run_id) if run_id else q.order_by(S.runs.c.created_at.desc(), S.runs.c.id.desc())
        return self._one(Run, q)

    # -- problems and candidates --------------------------------------------------------------
    @_evidence_write
    def record_problem(self, problem) -> None:
        exists = self._rows(select(S.problems.c.id).where(S.problems.c.name == problem.name,
                                                          S.problems.c.spec_hash == problem.spec_hash()))
        if not exists:
            try:
                self._write(S.problems, dict(name=problem.name, version=problem.version, spec_hash=problem.spec_hash(),
                                             signature=problem.c_signature, description=problem.description))
            except IntegrityError:
                pass  # recorded concurrently by another process

    @_evidence_write
    def record_candidate(self, cand: dict[str, Any] | CandidateRow) -> bool:
        """Insert if new (a ``agents.base.candidate_record``, or a row read from a store); returns
        False when this content hash is already known."""
        values = _candidate_values(cand)
        if self.candidate(values["id"]) is not None:
            return False
        try:
            self._write(S.candidates, values)
        except IntegrityError:
            return False
        return True

    def candidate(self, cand_id: str) -> CandidateRow | None:
        return self._one(CandidateRow, select(S.candidates).where(S.candidates.c.id == cand_id))

    def candidates(self, problem: str, run_id: str | None = None) -> list[CandidateRow]:
        q = select(S.candidates).where(S.candidates.c.problem == problem)
        if run_id:
            q = q.where(S.candidates.c.run_id == run_id)
        return self._typed(CandidateRow, q)

    # -- evaluations --------------------------------------------------------------------------
    @_evidence_write
    def record_evaluation(self, candidate_id: str, problem, verdict, run_id: str | None,
                          validation_version: str, tools: dict, purpose: str = "search") -> int:
        d = verdict.to_dict()
        res = self._write(S.evaluations, dict(
            candidate_id=candidate_id, problem=problem.name, problem_spec=problem.spec_hash(),
            validation_version=validation_version, run_id=run_id, purpose=purpose, hardware_id=self.hardware["id"],
            hardware=self.hardware, tools=tools, outcome=d["outcome"], stage=d["stage"],
            detail=d["detail"], speedup=d["speedup"], ci_low=d["ci_low"], ci_high=d["ci_high"],
            vs_reference=d["vs_reference"], roofline_fraction=d["roofline_fraction"],
            baseline=d["baseline"], shapes=_jsonable(d["shapes"]), flags=d["flags"],
            evidence=_jsonable(d["evidence"]), cases_checked=d["cases_checked"], seconds=d["seconds"]))
        return int(res.inserted_primary_key[0]) if res is not None else None

    @_evidence_write
    def record_verdict(self, problem, cand: dict[str, Any] | CandidateRow, verdict, run_id: str | None,
                       validation_version: str, purpose: str = "search") -> int:
        """Record a verdict with what it judged: the problem, the candidate (a
        ``agents.base.candidate_record``, or its row) and the evaluation, with today's tool
        versions; returns the evaluation's id. ``StoreWriteError`` when the store did not take it:
        all three are then in the journal."""
        from swarmfactory.tools import tool_versions

        self.record_problem(problem)
        self.record_candidate(cand)
        return self.record_evaluation(_candidate_values(cand)["id"], problem, verdict, run_id, validation_version,
                                      tool_versions(), purpose)

    def evaluations(self, problem: str | None = None, run_id: str | None = None,
                    candidate_id: str | None = None, this_hardware: bool = False) -> list[Evaluation]:
        """Evaluations, oldest first: of ``problem``, of ``run_id``, of ``candidate_id``, on this
        hardware (``this_hardware``), as given."""
        q = select(S.evaluations).order_by(S.evaluations.c.id)
        if problem:
            q = q.where(S.evaluations.c.problem == problem)
        if run_id:
            q = q.where(S.evaluations.c.run_id == run_id)
        if candidate_id:
            q = q.where(S.evaluations.c.candidate_id == candidate_id)
        if this_hardware:
            q = q.where(S.evaluations.c.hardware_id == self.hardware["id"])
        return self._typed(Evaluation, q)

    def measured_figures(self, problem) -> list[MeasuredFigure]:
        """``candidate_id``, ``speedup`` and ``contention`` (the evidence's) of every ``faster`` or
        ``not_faster`` evaluation of ``problem`` (this version) on this hardware: what the spread
        between evaluations is learnt from, read at every measurement. One query, no sources or
        evidence blobs."""
        e = S.evaluations
        return self._typed(MeasuredFigure, select(e.c.candidate_id, e.c.speedup,
                                                  e.c.evidence["contention"].label("contention"))
                           .where(e.c.problem == problem.name, e.c.problem_spec == problem.spec_hash(),
                                  e.c.hardware_id == self.hardware["id"], e.c.outcome.in_(MEASURED))
                           .order_by(e.c.id))

    def evaluation(self, evaluation_id: int) -> Evaluation | None:
        return self._one(Evaluation, select(S.evaluations).where(S.evaluations.c.id == evaluation_id))

    # -- champions ------------------------------------------------------------------------------
    def champion(self, problem) -> Champion | None:
        """The current champion of ``problem`` on this hardware (latest champions row); None
        where there is none or the title is vacant."""
        row = self._one(Champion, select(S.champions).where(
            S.champions.c.problem == problem.name, S.champions.c.problem_spec == problem.spec_hash(),
            S.champions.c.hardware_id == self.hardware["id"]).order_by(S.champions.c.id.desc()))
        return row if row is not None and row.candidate_id else None

    def champion_history(self, problem_name: str) -> list[Champion]:
        """Every champions row of ``problem_name`` (any spec) on this hardware, oldest first."""
        return self._typed(Champion, select(S.champions).where(S.champions.c.problem == problem_name,
                                                               S.champions.c.hardware_id == self.hardware["id"])
                           .order_by(S.champions.c.id))

    @_evidence_write
    def set_champion(self, problem, candidate_id: str | None, evaluation_id: int | None,
                     speedup: float | None, run_id: str | None, reason: str) -> None:
        self._write(S.champions, dict(
            problem=problem.name, problem_spec=problem.spec_hash(), hardware_id=self.hardware["id"],
            candidate_id=candidate_id, evaluation_id=evaluation_id, run_id=run_id, speedup=speedup,
            reason=reason))

    # -- validation cases -------------------------------------------------------------------------
    @_evidence_write
    def add_case(self, problem_name: str, case, found_by: str, broke: str | None, note: str = "") -> bool:
        try:
            self._write(S.validation_cases, dict(
                problem=problem_name, case_key=case.key(), shape=dict(case.shape), seed=case.seed,
                dist=case.dist, found_by=found_by, broke_candidate=broke, note=note))
            return True
        except IntegrityError:
            return False  # already known

    def found_cases(self, problem_name: str) -> list[FoundCase]:
        return self._typed(FoundCase, select(S.validation_cases).where(S.validation_cases.c.problem == problem_name)
                           .order_by(S.validation_cases.c.id))

    # -- measured machine facts ----------------------------------------------------------------------
    def get_baseline(self, problem, shape, compile_too: bool) -> dict | None:
        """The latest baseline record (the harness's JSON) of ``problem`` at ``shape`` on this
        hardware with today's torch."""
        rows = self._rows(select(S.baselines.c.record).where(
            S.baselines.c.problem == problem.name, S.baselines.c.spec_hash == problem.spec_hash(),
            S.baselines.c.shape_key == json.dumps(dict(shape), sort_keys=True),
            S.baselines.c.hardware_id == self.hardware["id"], S.baselines.c.tools_key == _tools_key(),
            S.baselines.c.compile == int(compile_too)).order_by(S.baselines.c.id.desc()).limit(1))
        return rows[0]["record"] if rows else None

    def put_baseline(self, problem, shape, compile_too: bool, record: dict) -> None:
        self._cache_write(insert(S.baselines).values(
            problem=problem.name, spec_hash=problem.spec_hash(),
            shape_key=json.dumps(dict(shape), sort_keys=True), hardware_id=self.hardware["id"],
            tools_key=_tools_key(), compile=int(compile_too), record=_jsonable(record)))

    def latest_roofs(self, threads: int) -> tuple[dict, float | None] | None:
        """The last roofs recorded for this hardware at ``threads`` threads, with when (seconds
        since the epoch; None if unknown)."""
        rows = self._rows(select(S.roofs.c.record, S.roofs.c.created_at).where(
            S.roofs.c.hardware_id == self.hardware["id"], S.roofs.c.threads == threads)
            .order_by(S.roofs.c.id.desc()).limit(1))
        if not rows:
            return None
        at = rows[0]["created_at"]
        return rows[0]["record"], (at.timestamp() if hasattr(at, "timestamp") else None)

    def put_roofs(self, threads: int, record: dict) -> None:
        self._cache_write(insert(S.roofs).values(hardware_id=self.hardware["id"], threads=threads, record=record))

    # -- LLM calls ----------------------------------------------------------------------------------
    @_evidence_write
    def record_llm_call(self, row: dict) -> None:
        self._write(S.llm_calls, _jsonable(row))

    def llm_calls(self, run_id: str | None = None) -> list[LlmCall]:
        q = select(S.llm_calls).order_by(S.llm_calls.c.id)
        if run_id:
            q = q.where(S.llm_calls.c.run_id == run_id)
        return self._typed(LlmCall, q)

    # -- lessons --------------------------------------------------------------------------------------
    # A lesson's identity is ``data["key"]``; each status change (or a material update of its
    # figures) is a new row, never an edit: the latest row of a key is the lesson as it stands.
    @_evidence_write
    def add_lesson(self, problem: str | None, agent: str, text: str, data: dict, run_id: str | None,
                   hardware_id: str | None = None) -> int:
        res = self._write(S.lessons, dict(problem=problem, hardware_id=hardware_id or self.hardware["id"],
                                          agent=agent, text=text, data=_jsonable(data), run_id=run_id))
        return int(res.inserted_primary_key[0]) if res is not None else None

    def lessons(self, problem: str | None = None, limit: int = 50) -> list[Lesson]:
        """The latest ``limit`` lesson rows of this hardware (every status change), newest first."""
        q = select(S.lessons).where(S.lessons.c.hardware_id == self.hardware["id"])
        if problem:
            q = q.where(S.lessons.c.problem == problem)
        return self._typed(Lesson, q.order_by(S.lessons.c.id.desc()).limit(limit))

    def current_lessons(self, problem: str | None = None, include_retired: bool = False) -> list[Lesson]:
        """Each lesson as it stands (its latest row, any hardware), oldest first; ``history`` holds
        its earlier rows. Active ones only unless ``include_retired``."""
        q = select(S.lessons).order_by(S.lessons.c.id)
        if problem:
            q = q.where(S.lessons.c.problem == problem)
        latest: dict[str, Lesson] = {}
        for row in self._typed(Lesson, q):
            before = latest.get(row.key)
            history = (*before.history, dataclasses.replace(before, history=())) if before else ()
            latest[row.key] = dataclasses.replace(row, history=history)
        rows = sorted(latest.values(), key=lambda r: r.id)
        return [r for r in rows if include_retired or r.status == "active"]

    def evaluated_problems(self) -> list[str]:
        """Names of the problems that have evaluations, in name order."""
        return [r["problem"] for r in self._rows(select(S.evaluations.c.problem).distinct()
                                                  .order_by(S.evaluations.c.problem))]

    def knob_evidence(self, problem: str) -> list[KnobEvidence]:
        """Every evaluation of ``problem`` (any hardware) with its candidate's knobs and agent and
        what its measurement quality is read from (``ci_low``, ``ci_high``, ``contention``: the
        evidence's, None where not recorded): what the analyst and the cost model read. One query,
        no sources."""
        e, c = S.evaluations, S.candidates
        q = (select(e.c.id, e.c.candidate_id, e.c.problem, e.c.problem_spec, e.c.hardware_id, e.c.hardware,
                    e.c.purpose, e.c.outcome, e.c.speedup, e.c.ci_low, e.c.ci_high,
                    e.c.evidence["contention"].label("contention"), e.c.shapes, e.c.run_id, c.c.knobs, c.c.agent)
             .join(c, c.c.id == e.c.candidate_id).where(e.c.problem == problem).order_by(e.c.id))
        return self._typed(KnobEvidence, q)

    # -- engine profiles ------------------------------------------------------------------------------
    def profiles(self, model_sha256: str | None = None, hardware_id: str | None = None,
                 tools: dict | None = None) -> list[Profile]:
        """The engine profiles (``rows.Profile``), newest first: per engine problem, spec and
        hardware, its latest champions row that names a design, with the design's candidate and
        the measured evaluation that made it champion (one whose evaluation is not measured, or
        is missing, is none). Only those of the model file ``model_sha256``, the hardware
        ``hardware_id`` and the toolchain ``tools`` (``rows.TOOL_KEYS``), where given: a profile
        is keyed by the three. One query over the champions, evaluations and candidates tables
        (no table of its own: every store that holds engine champions has its profiles)."""
        ch, e, c = S.champions, S.evaluations, S.candidates
        q = (select(ch.c.problem, ch.c.problem_spec, ch.c.hardware_id, ch.c.run_id, ch.c.created_at, ch.c.speedup,
                    ch.c.reason, c.c.id.label("design"), c.c.source, c.c.knobs, e.c.outcome, e.c.hardware, e.c.tools,
                    e.c.evidence)
             .select_from(ch.outerjoin(e, e.c.id == ch.c.evaluation_id).outerjoin(c, c.c.id == ch.c.candidate_id))
             .where(ch.c.problem.like("engine:%"), ch.c.candidate_id.is_not(None))
             .order_by(ch.c.id.desc()))
        seen, out = set(), []
        for row in self._rows(q):
            key = (row["problem"], row["problem_spec"], row["hardware_id"])
            if key in seen:
                continue
            seen.add(key)
            if row["design"] is None or row["outcome"] not in MEASURED:
                continue
            prof = _profile(row)
            if ((model_sha256 is None or prof.model_sha256 == model_sha256)
                    and (hardware_id is None or prof.hardware_id == hardware_id)
                    and (tools is None or all(prof.tools.get(k) == tools.get(k) for k in TOOL_KEYS))):
                out.append(prof)
        return out


def _create_schema(engine: Engine) -> None:
    """Create the tables; two coordinators starting on one new PostgreSQL store race here (the
    loser's CREATE fails once the winner's commits): then every table is there, check and go on."""
    for attempt in range(3):
        try:
            S.metadata.create_all(engine)
            return
        except Exception:
            if attempt == 2:
                raise


def _candidate_values(cand: dict[str, Any] | CandidateRow) -> dict[str, Any]:
    """A candidate's columns: a ``candidate_record`` as it is, a row's fields."""
    return cand.as_dict() if isinstance(cand, CandidateRow) else dict(cand)


def _profile(row: dict) -> Profile:
    """An engine profile from ``Store.profiles``'s joined columns."""
    evidence = row["evidence"] or {}
    return Profile(id=row["design"], problem=row["problem"], run_id=row["run_id"], created_at=row["created_at"],
                   speedup=row["speedup"], reason=row["reason"], config_yaml=row["source"],
                   knobs=row["knobs"] or {}, hardware_id=row["hardware_id"], hardware=row["hardware"] or {},
                   tools=row["tools"] or {}, model_sha256=evidence.get("model_sha256", ""),
                   serving=evidence.get("serving", {}), description=evidence.get("design", ""),
                   contention=contention(evidence))


def _tools_key() -> str:
    import torch

    return f"torch-{torch.__version__}"


def _check_sqlite_store(database: str | None, create: bool) -> None:
    """An existing SQLite file must hold a store; only an empty one may become one."""
    if not database or database == ":memory:" or not Path(database).exists():
        return
    import sqlite3

    con = sqlite3.connect(Path(database).resolve().as_uri() + "?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        con.close()
    if S.meta.name not in tables and (tables or not create):
        raise StoreError(f"{database} is not a swarmfactory evidence store (no {S.meta.name} table): "
                         "give another --store")


def _one_line(exc: Exception) -> str:
    """The driver's own message, first line only (SQLAlchemy appends the statement, its
    parameters and a background link), without a password."""
    inner = getattr(exc, "orig", None) or exc
    lines = str(inner).strip().splitlines()
    return redact(f"{type(inner).__name__}: {lines[0] if lines else ''}")


# SQLSTATEs of a write refused for good: no privilege, a read-only transaction, a full disk.
_REFUSED = {"42501", "25006", "53100"}


def _write_failure(exc: BaseException) -> bool:
    """A write the store could not take (a read-only file or server, a full disk, a lost
    connection): not a duplicate row, not a bug in the statement."""
    kinds = {c.__name__ for c in type(exc).__mro__}  # SQLAlchemy's wrappers and the drivers' own errors
    if "IntegrityError" in kinds:
        return False
    if kinds & {"OperationalError", "InternalError"} or isinstance(exc, OSError):
        return True
    orig = getattr(exc, "orig", None) or exc
    return (getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)) in _REFUSED


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()
