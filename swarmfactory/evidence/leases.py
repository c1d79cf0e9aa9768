"""Evaluation leases: several coordinators on one store never evaluate the same candidate twice.

Before a coordinator evaluates a candidate it claims the key (candidate, problem spec,
validation version, hardware) in the store, atomically: an ``INSERT ... ON CONFLICT DO NOTHING``
on the key's unique constraint, or the takeover of a lease that has expired (an ``UPDATE`` whose
``WHERE`` requires the expiry, so two coordinators racing for one expired lease get it once).
Recording the verdict marks the lease ``done``, after the evaluation row is committed, so a later
claim of the key finds the verdict or the done lease and never evaluates it again.

A lease lives ``ttl_s`` seconds on the database's clock; a heartbeat thread renews the leases its
coordinator holds. A coordinator killed with ``kill -9`` stops renewing: its leases expire, and
``orphans`` lists them for another coordinator to take over; the resumed run of the dead
coordinator takes its own run's leases over at once. Works on SQLite
(one machine, several processes) and PostgreSQL (many machines).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy import and_, delete, or_, select, text, update

from swarmfactory.evidence import schema as S

L = S.leases
CLAIMED, TAKEN, DONE = "claimed", "taken", "done"


@dataclass(frozen=True)
class Claim:
    status: str        # claimed | taken (another coordinator holds it) | done (already evaluated)
    attempts: int = 0  # claims of this key so far; > 1: taken over from a coordinator that died


class Leases:
    """The leases of one coordinator (``owner``) on ``store``'s hardware. Thread-safe."""

    def __init__(self, store, run_id: str, ttl_s: float = 120.0):
        self.store, self.ttl_s = store, float(ttl_s)
        self.run_id, self.owner = run_id, f"{run_id}:{secrets.token_hex(4)}"
        self.hardware_id = store.hardware["id"]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        ensure_table(store.engine)

    # -- claims -----------------------------------------------------------------------------------
    def _key(self, problem, candidate_id: str, vversion: str):
        return and_(L.c.candidate_id == candidate_id, L.c.problem_spec == problem.spec_hash(),
                    L.c.validation_version == vversion, L.c.hardware_id == self.hardware_id)

    def claim(self, problem, candidate_id: str, vversion: str) -> Claim:
        """Claim the key for this coordinator; ``claimed`` means evaluate it and then ``release``.
        ``StoreWriteError`` when the store does not take the claim (nothing to evaluate then)."""
        if self.store.unwritable is not None:
            from swarmfactory.evidence.store import StoreWriteError

            raise StoreWriteError(self.store.write_failure())
        try:
            return self._claim(problem, candidate_id, vversion)
        except Exception as exc:
            from swarmfactory.evidence.store import StoreWriteError, _one_line, _write_failure

            if not _write_failure(exc):
                raise
            self.store.journal.failure = self.store.journal.failure or _one_line(exc)
            raise StoreWriteError(self.store.write_failure()) from exc

    def _claim(self, problem, candidate_id: str, vversion: str) -> Claim:
        key = self._key(problem, candidate_id, vversion)
        with self.store.lock, self.store.engine.begin() as c:
            now = db_now(c)
            ins = _insert(c).values(candidate_id=candidate_id, problem_spec=problem.spec_hash(),
                                    validation_version=vversion, hardware_id=self.hardware_id,
                                    problem=problem.name, owner=self.owner, state="held",
                                    expires_at=now + self.ttl_s, attempts=1)
            # RETURNING says whether a row was written (rowcount is -1 on some drivers)
            if c.execute(ins.on_conflict_do_nothing().returning(L.c.attempts)).first() is not None:
                attempts = 1
            else:
                took = c.execute(update(L).where(key, L.c.state == "held", self._lapsed(now)).values(
                    owner=self.owner, expires_at=now + self.ttl_s, attempts=L.c.attempts + 1)
                    .returning(L.c.attempts)).first()
                if took is None:
                    state = c.execute(select(L.c.state).where(key)).scalar()
                    return Claim(DONE if state == "done" else TAKEN)
                attempts = took[0]
            # A verdict recorded before leases existed, or by a coordinator that died between
            # recording and releasing: the key is done, not to be evaluated again.
            ev = S.evaluations
            known = c.execute(select(ev.c.id).where(
                ev.c.candidate_id == candidate_id, ev.c.problem_spec == problem.spec_hash(),
                ev.c.validation_version == vversion, ev.c.hardware_id == self.hardware_id,
                ev.c.purpose.in_(("search", "eval"))).limit(1)).first()
            if known is not None:
                c.execute(update(L).where(key).values(state="done"))
                return Claim(DONE, attempts)
            return Claim(CLAIMED, attempts)

    def _lapsed(self, now: float):
        """Leases free to take over: expired, or held by an earlier coordinator of this same run
        (a resumed run: the coordinator that held them is gone)."""
        return or_(L.c.expires_at < now, and_(L.c.owner.startswith(f"{self.run_id}:", autoescape=True),
                                              L.c.owner != self.owner))

    def release(self, problem, candidate_id: str, vversion: str) -> None:
        """The verdict is recorded: the key is done for every coordinator."""
        self._set(problem, candidate_id, vversion, done=True)

    def abandon(self, problem, candidate_id: str, vversion: str) -> None:
        """Not evaluated after all (an interrupted run): free the key at once."""
        self._set(problem, candidate_id, vversion, done=False)

    def _set(self, problem, candidate_id: str, vversion: str, done: bool) -> None:
        where = and_(self._key(problem, candidate_id, vversion), L.c.owner == self.owner, L.c.state == "held")
        stmt = update(L).where(where).values(state="done") if done else delete(L).where(where)
        self.store._exec(stmt)

    def orphans(self, problem, vversion: str) -> list[str]:
        """Candidates of ``problem`` whose leases on this hardware lapsed before their verdict was
        recorded (their coordinator died; see ``_lapsed``): oldest first."""
        with self.store.engine.connect() as c:
            now = db_now(c)
            rows = c.execute(select(L.c.candidate_id).where(
                L.c.problem_spec == problem.spec_hash(), L.c.validation_version == vversion,
                L.c.hardware_id == self.hardware_id, L.c.state == "held", self._lapsed(now))
                .order_by(L.c.expires_at)).all()
        return [r[0] for r in rows]

    def held(self) -> int:
        with self.store.engine.connect() as c:
            return len(c.execute(select(L.c.candidate_id).where(L.c.owner == self.owner,
                                                                L.c.state == "held")).all())

    # -- the heartbeat ----------------------------------------------------------------------------
    def renew(self) -> int:
        """Extend every lease this coordinator holds by ``ttl_s`` from now; returns how many."""
        with self.store.lock, self.store.engine.begin() as c:
            now = db_now(c)
            return len(c.execute(update(L).where(L.c.owner == self.owner, L.c.state == "held")
                                 .values(expires_at=now + self.ttl_s).returning(L.c.candidate_id)).all())

    def start(self) -> None:
        """Renew in the background every quarter of the lease's life until ``stop``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="sf-leases", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                self.renew()
            except Exception:  # a store hiccup: the next beat tries again before the lease ends
                pass

    def stop(self, abandon_held: bool = False) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if abandon_held and self.store.unwritable is None:
            from swarmfactory.evidence.store import StoreWriteError

            try:
                self.store._exec(delete(L).where(L.c.owner == self.owner, L.c.state == "held"))
            except StoreWriteError:
                pass  # the store takes no write now: the leases lapse after ttl_s all the same


def ensure_table(engine) -> None:
    """Create the leases table in a store made before it existed (two processes may race)."""
    try:
        L.create(engine, checkfirst=True)
    except Exception:
        from sqlalchemy import inspect

        with engine.connect() as c:
            if not inspect(c).has_table(L.name):
                raise


def db_now(conn) -> float:
    """Seconds since the epoch on the database server's clock (not this machine's). SQLite is
    one machine's file: its clock is this one (and a read before the write would make SQLite's
    deferred transaction fail to upgrade when another process wrote meanwhile)."""
    if conn.dialect.name == "sqlite":
        return time.time()
    return float(conn.execute(text("SELECT extract(epoch from clock_timestamp())")).scalar())


def _insert(conn):
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    return insert(L)
