"""Writes the store could not take (a full disk, a file made read-only, a lost connection), kept on
local disk until it can.

One JSON line per write: ``{"id", "table", "values", "where"}`` (``where`` only for an update,
column = value). The journal of a SQLite store lies beside it (``FILE.pending.jsonl``) where its
folder takes a file; else under the user's cache folder (``$SWARMFACTORY_CACHE`` or
``~/.cache/swarmfactory``, ``pending/``), else under the system's temporary folder, named by a hash
of the store's URL. Each line is flushed to disk before the write counts as kept.

``replay`` writes a store's journals into it when it is next opened for writing, oldest line first
(the lines of every place, by the time they were kept): each line in its own transaction together with a marker row (``sf_meta`` key ``replayed:ID``, kept: the store is
append-only), so a replay cut short, or a journal replayed again, never writes a line twice; a line
the store refuses as a duplicate (the candidate was recorded meanwhile) is skipped. A replayed
journal file is removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

from sqlalchemy import and_, insert, select, update
from sqlalchemy.exc import IntegrityError

from swarmfactory.evidence import schema as S
from swarmfactory.hardware import cache_dir
from swarmfactory.redact import redact

SUFFIX = ".pending.jsonl"
_MARK = "replayed:"


class Journal:
    """The journal files of the store at ``url`` (``sqlite_path``: its file, for a SQLite store)."""

    def __init__(self, url: str, sqlite_path: str | None = None):
        name = hashlib.sha256(redact(url).encode()).hexdigest()[:16] + SUFFIX  # the same after a password change
        beside = [Path(sqlite_path + SUFFIX)] if sqlite_path and sqlite_path != ":memory:" else []
        self.paths = beside + [cache_dir() / "pending" / name,
                               Path(tempfile.gettempdir()) / f"swarmfactory-pending-{os.getuid()}" / name]
        self.failure: str | None = None  # why the store did not take a write: from then on they come here
        self.kept = 0                 # lines this process kept
        self.where: Path | None = None  # the file the last of them went to
        self.error: str | None = None   # why the last line could not be kept anywhere
        self._lock = threading.Lock()

    def append(self, table: str, values: dict, where: dict | None = None) -> bool:
        """Keep one write; False (``error`` says why) when no place would take it."""
        line = json.dumps({"id": uuid.uuid4().hex, "t": time.time(), "table": table, "values": _encode(values),
                           **({"where": _encode(where)} if where else {})}, default=str) + "\n"
        errors = []
        with self._lock:
            for path in ([self.where] if self.where else []) + [p for p in self.paths if p != self.where]:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with open(path, "a", encoding="utf-8") as f:
                        f.write(line)
                        f.flush()
                        os.fsync(f.fileno())
                except OSError as exc:
                    errors.append(f"{path}: {exc.strerror or exc}")
                    continue
                self.kept += 1
                self.where, self.error = path, None
                return True
            self.error = "; ".join(errors)
            return False

    def pending(self) -> list[Path]:
        return [p for p in self.paths if p.is_file()]


def replay(journal: Journal, engine, lock) -> tuple[int, int]:
    """Write ``journal``'s lines into the store, oldest first (see the module docstring); returns
    (written, skipped as duplicates). A write failure stops it (raised), the rest kept for the next
    time."""
    entries = []
    paths = journal.pending()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for raw in f.read().splitlines():
                try:
                    entry = json.loads(raw)
                    entry["table"] = S.metadata.tables[entry["table"]]
                    entries.append((float(entry.get("t", 0.0)), len(entries), entry))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # a line cut short by the failure that made it: its write went to the next place
    written = skipped = 0
    for _t, _n, entry in sorted(entries, key=lambda e: e[:2]):
        mark = _MARK + entry["id"]
        with lock:
            try:
                with engine.begin() as c:
                    if c.execute(select(S.meta.c.key).where(S.meta.c.key == mark)).first() is not None:
                        continue  # written by an earlier replay that was cut short
                    c.execute(_statement(entry["table"], entry))
                    c.execute(insert(S.meta).values(key=mark, value=entry["table"].name))
                written += 1
            except IntegrityError:
                skipped += 1  # recorded meanwhile (a candidate, a problem, a case)
    for path in paths:
        path.unlink(missing_ok=True)
    return written, skipped


def _statement(table, entry: dict):
    values = _decode(entry["values"])
    where = entry.get("where")
    if not where:
        return insert(table).values(**values)
    return update(table).where(and_(*(table.c[k] == v for k, v in _decode(where).items()))).values(**values)


def _encode(values: dict) -> dict:
    return {k: {"$datetime": v.isoformat()} if isinstance(v, datetime) else v for k, v in values.items()}


def _decode(values: dict) -> dict:
    return {k: datetime.fromisoformat(v["$datetime"]) if isinstance(v, dict) and set(v) == {"$datetime"} else v
            for k, v in values.items()}
