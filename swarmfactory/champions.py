"""The corridor between the kernel factory and the engine: which factory kernel may run here, that
kernel built, and what the engine found wrong with it recorded.

Everything that crosses from the kernel factory into the engine goes through this module:

- **The one rule** (``refusal``): a candidate of a problem may run here when its latest
  evaluation of this version of the problem on this hardware is correct (``outcome.CORRECT``: a
  case found later that breaks it retires it), it held that version's title here at some point
  (only a kernel once confirmed faster here runs in the engine), and its confirmation
  (``swarm/succession.confirmation``) was not measured on a busy machine. A config
  names a candidate as ``champion:PROBLEM`` (the current champion) or ``champion:PROBLEM@ID``
  (pinned; a prefix will do; ``kernelref.py`` reads the names).
- **Fetch and build** (``Corridor.build``): the candidate's source passes the harness's static
  check and is built with the C backend exactly as the harness built it (default flags, the ABI
  declared ahead, the checks on what the compiler produced: the same cached shared object). The
  engine receives the ``BuiltKernel`` (``engine/supply.py``), never the store.
- **A kernel found wrong while serving** (``Corridor.on_wrong``, which the engine calls once,
  after it dropped the kernel; ``engine/audit.py``): the shape that broke it becomes a permanent
  validation case of the problem (found by ``engine-audit``); the candidate gets a ``wrong``
  evaluation on this hardware (purpose ``engine-audit``), so the rule above refuses it from then
  on; and if it is this hardware's champion it is dethroned (``swarmfactory verify --problem P``
  re-verifies the others against the new case and crowns the best that passes). A failure to
  write is logged and costs the engine nothing: the kernel is already dropped.
"""

from __future__ import annotations

import logging
import os

from swarmfactory.backends import get_backend
from swarmfactory.backends.base import BuildError, CheatError
from swarmfactory.engine.supply import BuiltKernel, UnavailableKernel
from swarmfactory.evidence.store import Store, StoreError
from swarmfactory.kernelref import KernelRef
from swarmfactory.outcome import CORRECT, Outcome, Verdict
from swarmfactory.problems import load_problem
from swarmfactory.problems.spec import Case
from swarmfactory.swarm.succession import busy_refusal

log = logging.getLogger("swarmfactory.champions")

FOUND_BY = "engine-audit"
ID_LEN = 20  # a candidate id's hex digits (evidence.store.content_hash)


def refusal(store: Store, problem, candidate_id: str) -> str | None:
    """Why ``candidate_id`` may not run as a kernel of ``problem`` on this hardware, or None (the
    module docstring's rule)."""
    spec = problem.spec_hash()
    evs = [e for e in store.evaluations(problem=problem.name, candidate_id=candidate_id, this_hardware=True)
           if e.problem_spec == spec]
    if not any(e.outcome in CORRECT for e in evs):
        return (f"candidate {candidate_id} has no correct evaluation ({', '.join(CORRECT)}) of this version of "
                f"{problem.name} on this hardware")
    if evs[-1].outcome not in CORRECT:  # a case found later broke it
        return f"candidate {candidate_id} no longer passes the harness on this hardware (latest: {evs[-1].outcome})"
    if not any(r.candidate_id == candidate_id and r.problem_spec == spec
               for r in store.champion_history(problem.name)):
        return (f"candidate {candidate_id} was never a champion of {problem.name} (this version of the problem) "
                "on this hardware")
    return busy_refusal(store, problem, candidate_id)


def current(store: Store, problem_name: str) -> str | None:
    """The candidate id of ``problem_name``'s champion here that may run, or None (no champion,
    or one confirmed on a busy machine: logged with why). What ``engine tune`` pins."""
    problem = load_problem(problem_name)
    champ = store.champion(problem)
    if champ is None:
        return None
    why = busy_refusal(store, problem, champ.candidate_id)
    if why:
        log.warning("champion:%s not taken: %s", problem_name, why)
        return None
    return champ.candidate_id


def _pinned(store: Store, problem, pin: str, spec: str) -> str:
    """The candidate id ``pin`` names: a full id as it is (the rule then asks its evaluations),
    a shorter prefix only if exactly one candidate of the problem has it."""
    if len(pin) >= ID_LEN:
        return pin
    matches = [c.id for c in store.candidates(problem.name) if c.id.startswith(pin)]
    if len(matches) != 1:
        raise UnavailableKernel(f"{spec}: {'no' if not matches else 'more than one'} candidate {pin} of "
                                f"{problem.name} in {store.shown}")
    return matches[0]


class Corridor:
    """The ``KernelSupply`` an engine is handed: kernels from one evidence store, and the findings
    of the engine's audit written back to it.

    ``store`` is a ``Store`` (used, not closed) or a path/URL opened (create=False) at the first
    kernel named, so an engine that names none never touches it."""

    def __init__(self, store: Store | str | None):
        self._store = store if isinstance(store, Store) else None
        self._url = None if isinstance(store, Store) else store
        self._owned = False

    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self._url, create=False)
            self._owned = True
        return self._store

    def close(self) -> None:
        if self._owned and self._store is not None:
            self._store.close()
        self._store, self._owned = None, False

    def build(self, spec: str, signature: str) -> BuiltKernel:
        ref = KernelRef.parse(spec)
        if ref.kind != "champion":
            raise UnavailableKernel(f"{spec}: not a kernel of the evidence store")
        problem = load_problem(ref.target)
        if problem.c_signature != signature:
            raise UnavailableKernel(f"{spec}: the problem's ABI is now {problem.c_signature}, the engine calls "
                                    f"{signature}")
        try:
            store = self.store()
        except StoreError as e:
            raise UnavailableKernel(f"{spec}: {e}") from None
        cand, speedup = self._runnable(store, problem, ref)
        who = f"{'candidate' if ref.pin else 'champion'} {cand.id}"
        if cand.backend != "c" or cand.flags:
            raise UnavailableKernel(f"{spec}: {who} is not a plain C kernel (backend {cand.backend!r}, flags "
                                    f"{cand.flags}); the engine loads C kernels only")
        backend = get_backend("c")
        reason = backend.check(cand.source)
        if reason:
            raise UnavailableKernel(f"{spec}: {who} fails the static check: {reason}")
        try:  # as the harness built it: its cache entry, the same checks
            art = backend.build(cand.source, problem.entry, prototype=problem.c_prototype, checks=True)
        except (BuildError, CheatError) as e:
            raise UnavailableKernel(f"{spec}: {who} did not build: {e}") from None
        tol = problem.tolerance
        return BuiltKernel(spec, problem.name, cand.id, art.path, cand.source, store.shown, tol.rtol, tol.atol,
                           speedup)

    def _runnable(self, store: Store, problem, ref: KernelRef) -> tuple[dict, float | None]:
        """The candidate ``ref`` names and its recorded speedup (if it holds the title), under the rule."""
        champ = store.champion(problem)
        if ref.pin:
            cid = _pinned(store, problem, ref.pin, ref.spec)
            why = refusal(store, problem, cid)
            if why:
                raise UnavailableKernel(f"{ref.spec}: {why}; it is not run (an engine design naming it must be "
                                        "tuned again: swarmfactory engine tune)")
        else:
            if champ is None:
                raise UnavailableKernel(f"{ref.spec}: no champion of {problem.name} for this hardware (and this "
                                        f"version of the problem) in {store.shown}; run the kernel factory on it "
                                        f"first (`swarmfactory run --problems {problem.name}`)")
            cid = champ.candidate_id
            why = refusal(store, problem, cid)
            if why:
                raise UnavailableKernel(f"{ref.spec}: {why}; it is not run")
        cand = store.candidate(cid)
        if cand is None or cand.problem != problem.name:
            raise UnavailableKernel(f"{ref.spec}: candidate {cid} of {problem.name} is missing from the candidates "
                                    f"of {store.shown}")
        holds = champ is not None and champ.candidate_id == cand.id
        return cand, (champ.speedup if holds else None)

    def on_wrong(self, problem: str, candidate: str, shape: dict, detail: str) -> str:
        """Record a kernel's wrong output seen while serving (the module docstring); returns what
        was done, for the log."""
        msg = (f"{problem} kernel {candidate} gave a wrong output while serving ({detail}); dropped, the "
               "engine's own code runs instead")
        try:
            store = self.store()
            msg += report_wrong(store, load_problem(problem), candidate, shape, detail)
        except Exception as e:  # noqa: BLE001 - the kernel is dropped already; this is bookkeeping
            log.warning("could not record the engine audit's finding in the evidence store: %s", e)
        log.error("%s", msg)
        return msg


def report_wrong(store: Store, problem, candidate_id: str, shape: dict, detail: str) -> str:
    """The store's side of ``Corridor.on_wrong``: what was recorded, as a tail for its message."""
    if store.candidate(candidate_id) is None:
        return f"; not recorded: no candidate {candidate_id} in {store.shown}"
    case = Case(shape={k: int(v) for k, v in shape.items()}, seed=int.from_bytes(os.urandom(4), "little"),
                origin=FOUND_BY)
    store.add_case(problem.name, case, FOUND_BY, candidate_id, detail[:500])
    verdict = Verdict(Outcome.WRONG, f"wrong while serving in the engine: {detail}", FOUND_BY,
                      evidence={"case": case.key()})
    eval_id = store.record_evaluation(candidate_id, problem, verdict, None, FOUND_BY, {}, purpose=FOUND_BY)
    tail = ""
    champ = store.champion(problem)
    if champ and champ.candidate_id == candidate_id:
        store.set_champion(problem, None, eval_id, None, None,
                           f"dethroned {candidate_id}: wrong while serving in the engine ({detail})"[:500])
        tail += (f"; dethroned as {problem.name}'s champion (`swarmfactory verify --problem {problem.name}` "
                 "crowns the best candidate that passes the new case)")
    return tail + f"; case {case.key()} added to {problem.name}'s validation set in {store.shown}"
