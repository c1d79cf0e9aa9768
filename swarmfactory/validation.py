"""The validation set of a problem: its bundled seed cases plus every case found since.

Its version is part of every evaluation record: when the set grows, results measured against the
old set are no longer proof of correctness and champions are re-verified.

The full-size shapes of real models (``Problem.model_draws``) are drawn one per evaluation on
top of it (``draw``): they are not part of the version, which stays the same from draw to draw;
the evaluation's evidence records which it checked (``drawn_evidence``).
"""

from __future__ import annotations

import hashlib

from swarmfactory.problems.spec import Case, Problem


def validation_set(problem: Problem, store=None, draw: int | None = None) -> tuple[list[Case], str]:
    """The cases every evaluation of ``problem`` runs and their version; with ``draw``, the
    model cases of that draw appended (the version is the same whatever the draw)."""
    cases = problem.seed_cases()
    found = store.found_cases(problem.name) if store is not None else []
    known = {c.key() for c in cases}
    from swarmfactory.adversary import case_from_key

    for row in found:
        case = case_from_key(row.case_key, origin=row.found_by)
        if case.key() not in known:
            cases.append(case)
            known.add(case.key())
    blob = problem.spec_hash() + "|" + "|".join(sorted(r.case_key for r in found))
    if problem.model_shapes:  # the fixed sample of model shapes (only where set: other problems
        # keep the version their evidence was recorded under)
        blob += "|models:" + "|".join(c.key() for c in cases if c.origin == "model")
    if draw is not None:
        cases += [c for c in problem.model_cases(draw) if c.key() not in known]
    return cases, hashlib.sha256(blob.encode()).hexdigest()[:12]


def drawn_evidence(draw: int, cases: list[Case]) -> dict:
    """What an evaluation's evidence says of the model cases it drew (``Problem.model_cases``)."""
    return {"draw": draw, "cases": [{"model": c.origin.removeprefix("model:"), "case": c.key()}
                                    for c in cases if c.origin.startswith("model:")]}
