"""What the engine does when a kernel-factory kernel gives a wrong output while serving.

Both seams that run factory code in the engine's process audit it on what it is actually
given, not only on the shapes checked at load: the native decoder recomputes one random row
group of every call of the external ``q4_1_packed_matvec`` kernel with its built-in loop
(decode.c, ``Ext``); a per-op ``q4_1_matmul`` library (``native_seam.NativeLinear``) has random
output rows of its calls recomputed from the dequantised weight, on every call at a batch size
it has not run before and on a random share of the others. Every call of the matvec, and every
audited call of a library, must also leave its inputs as they were and the memory just past
its outputs untouched. A kernel that a hostile or unlucky candidate made wrong only at some
batch size, row count or position is caught at its first audited wrong call.

At the first mismatch the kernel is dropped for the rest of the process: the call (or the
decode step) is computed again by the engine's own code, so no wrong output reaches a user,
and every later call runs the built-in path. Then ``report`` closes the loop through the
evidence store (``$SWARMFACTORY_STORE``, else ``.swarmfactory/evidence.db``):

- the shape that broke it becomes a permanent validation case of the problem
  (found by ``engine-audit``, naming the candidate), so every later re-verification and run of
  the kernel factory checks it;
- the candidate gets a ``wrong`` evaluation on this hardware (purpose ``engine-audit``), so a
  pin to it (``champion:PROBLEM@ID``) no longer passes here and ``engine serve`` refuses the
  profiles that name it;
- if it is this hardware's champion, it is dethroned; ``swarmfactory verify --problem PROBLEM``
  re-verifies the others against the new case and crowns the best that passes.

A failure to write to the store is logged and costs the engine nothing else: the kernel is
already dropped.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("swarmfactory.engine")

FOUND_BY = "engine-audit"


def caught(kernel_audit: dict) -> str | None:
    """The first finding in an engine's ``kernel_audit()`` (as ``/health`` carries it), or None."""
    seams = [*(kernel_audit.get("native_kernels") or {}).values(), kernel_audit.get("native_matvec") or {}]
    return next((s["dropped"] for s in seams if s.get("dropped")), None)


def report(problem_name: str, candidate_id: str | None, shape: dict, detail: str) -> str:
    """Record a kernel's wrong output seen while serving (see the module docstring); returns
    what was done, for the log. ``candidate_id`` None (a user's ``so:`` file): log only."""
    msg = f"{problem_name} kernel {candidate_id or '(not from the store)'} gave a wrong output while serving " \
          f"({detail}); dropped, the engine's own code runs instead"
    if not candidate_id:
        log.error("%s", msg)
        return msg
    from swarmfactory.evidence.store import Store, StoreError
    from swarmfactory.harness.outcome import Outcome, Verdict
    from swarmfactory.problems import load_problem
    from swarmfactory.problems.spec import Case

    try:
        problem = load_problem(problem_name)
        store = Store(None, create=False)
    except (StoreError, ValueError, OSError) as e:  # the kernel is dropped already; this is bookkeeping
        log.error("%s", msg)
        log.warning("could not record the engine audit's finding in the evidence store: %s", e)
        return msg
    try:
        if store.candidate(candidate_id) is None:
            msg += f"; not recorded: no candidate {candidate_id} in {store.shown}"
            return msg
        case = Case(shape={k: int(v) for k, v in shape.items()}, seed=int.from_bytes(os.urandom(4), "little"),
                    origin=FOUND_BY)
        store.add_case(problem.name, case, FOUND_BY, candidate_id, detail[:500])
        verdict = Verdict(Outcome.WRONG, f"wrong while serving in the engine: {detail}", FOUND_BY,
                          evidence={"case": case.key()})
        eval_id = store.record_evaluation(candidate_id, problem, verdict, None, FOUND_BY, {}, purpose=FOUND_BY)
        champ = store.champion(problem)
        if champ and champ["candidate_id"] == candidate_id:
            store.set_champion(problem, None, eval_id, None, None,
                               f"dethroned {candidate_id}: wrong while serving in the engine ({detail})"[:500])
            msg += (f"; dethroned as {problem.name}'s champion (`swarmfactory verify --problem {problem.name}` "
                    "crowns the best candidate that passes the new case)")
        msg += f"; case {case.key()} added to {problem.name}'s validation set in {store.shown}"
    except Exception as e:  # noqa: BLE001 - as above
        log.warning("could not record the engine audit's finding in the evidence store: %s", e)
    finally:
        store.engine.dispose()
        log.error("%s", msg)
    return msg
