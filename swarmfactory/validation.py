"""The validation set of a problem: its bundled seed cases plus every case found since.

Its version is part of every evaluation record: when the set grows, results measured against the
old set are no longer proof of correctness and champions are re-verified.
"""

from __future__ import annotations

import hashlib

from swarmfactory.problems.spec import Case, Problem


def validation_set(problem: Problem, store=None) -> tuple[list[Case], str]:
    cases = problem.seed_cases()
    found = store.found_cases(problem.name) if store is not None else []
    known = {c.key() for c in cases}
    from swarmfactory.adversary import case_from_key

    for row in found:
        case = case_from_key(row["case_key"], origin=row["found_by"])
        if case.key() not in known:
            cases.append(case)
            known.add(case.key())
    blob = problem.spec_hash() + "|" + "|".join(sorted(r["case_key"] for r in found))
    return cases, hashlib.sha256(blob.encode()).hexdigest()[:12]
