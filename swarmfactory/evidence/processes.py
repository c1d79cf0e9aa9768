"""The store's ledger of processes (schema ``processes``): ``ProcessLedger(store)`` is what
``lifecycle.watch`` takes; swarmfactory/lifecycle.py decides what goes in and what is ended."""

from __future__ import annotations

from sqlalchemy import delete, insert, select

from swarmfactory.evidence.schema import processes as P

_READY: set[int] = set()


def _ensure(store) -> None:
    if id(store.engine) in _READY:
        return
    try:
        P.create(store.engine, checkfirst=True)
    except Exception:
        from sqlalchemy import inspect

        with store.engine.connect() as c:
            if not inspect(c).has_table(P.name):
                raise
    _READY.add(id(store.engine))


class ProcessLedger:
    """One store's ``processes`` table, as a ``lifecycle.Ledger``."""

    def __init__(self, store):
        self.store = store

    def record(self, pid: int, start: str, what: str, owner_pid: int, owner_start: str | None,
               boot: str) -> None:
        _ensure(self.store)
        self.store._exec(insert(P).values(boot=boot, pid=pid, start=start, what=what[:64],
                                          owner_pid=owner_pid, owner_start=owner_start))

    def forget(self, pid: int, start: str, boot: str) -> None:
        _ensure(self.store)
        self.store._exec(delete(P).where(P.c.boot == boot, P.c.pid == pid, P.c.start == start))

    def recorded(self, boot: str) -> list[dict]:
        _ensure(self.store)
        return self.store._rows(select(P.c.pid, P.c.start, P.c.what, P.c.owner_pid, P.c.owner_start)
                                .where(P.c.boot == boot))
