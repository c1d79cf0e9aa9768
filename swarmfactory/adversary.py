"""The adversary: the swarm's hunter of validation cases that break the retained candidates.

It is not an ``Agent`` (agents propose kernels to the coordinator): it proposes validation
*cases*, searching every dimension of a case: edge shapes
(1, primes, non-multiples of the vector width and tile, very long rows, each dimension alone at
its extreme), value distributions (huge/tiny magnitudes, constant rows, alternating signs, NaN,
-0.0, denormals and infinities where the problem defines them) and scalar arguments (eps, theta,
scale... at the ends of their realistic range and in between), weighted towards what broke
kernels of this problem before (the shapes and distributions of recorded ``wrong`` verdicts).
Out-of-bounds writes need no case of their own: every buffer sits between guard zones. A case is kept only if the reference is well
defined on it and it makes a retained candidate disagree with the reference: then it becomes a
permanent case with provenance, and the validation set's version changes.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

import numpy as np

from swarmfactory.evidence.rows import CandidateRow
from swarmfactory.problems.spec import Case, Problem, to_torch

SMALL = (1, 2, 3, 5, 6, 10, 13, 18, 34)
TAILS = (31, 63, 66, 127, 130, 257, 509, 514, 1021, 1030)
LONG = (2053, 4099, 8191, 10007, 16411)
EXTRA_DISTS = ("large", "tiny", "constant", "alternating", "uniform")
RESCALING = ("large", "tiny")
MAX_ELEMENTS = 4 << 20


@dataclass
class Finding:
    case: Case
    broke: str
    detail: str


def well_defined(problem: Problem, case: Case) -> bool:
    """The reference must give finite outputs wherever the inputs are finite (and run at all)."""
    try:
        if not problem.valid_shape(case.shape):
            return False
        inputs = problem.case_inputs(case)
        if not problem.valid_shape(case.shape):
            return False
        n = sum(v.size for v in inputs.values() if isinstance(v, np.ndarray))
        if n > MAX_ELEMENTS:
            return False
        out = problem.reference(to_torch(inputs))
        expected = problem.output_shapes(case.shape)
        if any(tuple(out[k].shape) != tuple(expected[k]) for k in expected):
            return False  # the reference does not define this shape the way the ABI does
    except Exception:
        return False
    inputs_finite = all(np.isfinite(v).all() for v in inputs.values()
                        if isinstance(v, np.ndarray) and v.dtype.kind == "f")
    outs_finite = all(np.isfinite(v.detach().numpy()).all() for v in out.values())
    return outs_finite or not inputs_finite


class Adversary:
    """Proposes cases; ``hunt`` tests them against retained candidates through the harness.
    ``name`` is its provenance on the cases it finds."""

    name = "adversary"

    def __init__(self, cases_per_turn: int = 24):
        self.cases_per_turn = cases_per_turn

    # -- generation -------------------------------------------------------------------------
    def _dim_values(self, problem: Problem, dim: str) -> list[int]:
        """Small, tail-heavy and long sizes; for a dim that only ever takes multiples of a step
        (q4_1's k % 32), the same ideas in units of that step."""
        seen = [s[dim] for s in (*problem.workload, *problem.edge_shapes, *problem.stress_shapes)]
        step = math.gcd(*seen)
        top = max(seen) // step
        beyond = {2 * top + 1, 4 * top - 1, 8 * top + 3}  # past every size the seed set has
        if step > 1:
            units = {1, 2, 3, 5, 7, 13, 31, 67, 129} | {v // step + d for v in seen for d in (-1, 1)} | beyond
            return sorted(u * step for u in units if u >= 1)
        near = {v + d for v in seen for d in (-2, -1, 1, 2) if v + d >= 1}
        return sorted(set(SMALL) | set(TAILS) | set(LONG) | near | set(seen) | beyond)

    @staticmethod
    def _params(problem: Problem, rng: random.Random) -> dict[str, float]:
        """Half the cases pin each scalar argument: at an end of its range or log-uniformly inside."""
        params = {}
        for name, (lo, hi) in problem.param_ranges.items():
            if rng.random() < 0.5:
                params[name] = float(np.float32(rng.choice((lo, hi, math.exp(rng.uniform(math.log(lo), math.log(hi)))))))
        return params

    def propose_cases(self, problem: Problem, failures: list[dict], rng: random.Random,
                      known: set[str]) -> list[Case]:
        dims = list(problem.workload[0])
        # a distribution that rescales values is only fair where the problem's tolerance allows it
        extra = [d for d in EXTRA_DISTS if d not in RESCALING or d in problem.dists]
        dists = list(dict.fromkeys([*problem.dists, *extra]))
        fail_dists = [f["dist"] for f in failures if f.get("dist") in dists]
        fail_shapes = [f["shape"] for f in failures if set(f.get("shape", {})) == set(dims)]
        base = rng.choice(problem.workload)
        out: list[Case] = []
        # first, every dimension alone just past twice the largest size the seed set has (once)
        tried = {json.dumps(json.loads(k)["shape"], sort_keys=True) for k in known}
        for d in dims:
            seen = [s[d] for s in (*problem.workload, *problem.edge_shapes, *problem.stress_shapes)]
            step = math.gcd(*seen)
            shape = {**dict(min(problem.workload, key=lambda sh: math.prod(sh.values()))),
                     d: (2 * (max(seen) // step) + 1) * step}
            case = Case(shape, seed=rng.randrange(1 << 30), dist=dists[0], origin=self.name)
            if (len(out) < self.cases_per_turn and json.dumps(shape, sort_keys=True) not in tried
                    and not any(c.shape == case.shape for c in out)
                    and math.prod(shape.values()) <= MAX_ELEMENTS and well_defined(problem, case)):
                known.add(case.key())
                out.append(case)
        attempts = 0
        while len(out) < self.cases_per_turn and attempts < self.cases_per_turn * 20:
            attempts += 1
            r = rng.random()
            shape = dict(rng.choice(fail_shapes) if fail_shapes and r < 0.25 else base)
            family = rng.choice(("one-extreme", "tails", "random", "ones"))
            values = {d: self._dim_values(problem, d) for d in dims}
            if family == "one-extreme":  # one dim at 1 or beyond its largest seen size, the rest as is
                d = rng.choice(dims)
                top = max(s[d] for s in (*problem.workload, *problem.edge_shapes, *problem.stress_shapes))
                beyond = [v for v in values[d] if v > top][:5] or values[d][-3:]
                shape[d] = rng.choice((values[d][0], *beyond))
            elif family == "tails":  # non-multiples of vector width / tile in the innermost dims
                for d in dims[-2:]:
                    shape[d] = rng.choice(values[d][: len(values[d]) * 2 // 3])
            elif family == "ones":
                for d in dims[:-1]:
                    shape[d] = values[d][0]
                shape[dims[-1]] = rng.choice(values[dims[-1]][len(values[dims[-1]]) // 2:])
            else:
                for d in dims:
                    shape[d] = rng.choice(values[d])
            dist = rng.choice(fail_dists) if fail_dists and rng.random() < 0.3 else rng.choice(dists)
            case = Case(shape, seed=rng.randrange(1 << 30), dist=dist, origin=self.name,
                        params=self._params(problem, rng))
            if case.key() in known or math.prod(shape.values()) > MAX_ELEMENTS:
                continue
            if not well_defined(problem, case):
                continue
            known.add(case.key())
            out.append(case)
        return out

    # -- hunting ------------------------------------------------------------------------------
    def hunt(self, harness, problem: Problem, targets: list[CandidateRow], failures: list[dict],
             rng: random.Random, known: set[str]) -> list[Finding]:
        """Run new cases against each target candidate (recorded candidates)."""
        cases = self.propose_cases(problem, failures, rng, known)
        findings: list[Finding] = []
        for cand in targets:
            remaining = list(cases)
            while remaining:
                prep = harness.prepare(problem, cand.source, remaining, problem.backend_of(cand))
                rej = prep.rejected
                if rej is None or rej.stage != "verify" or "case" not in rej.evidence:
                    break
                key = rej.evidence["case"]
                broke = next(c for c in remaining if c.key() == key)
                findings.append(Finding(broke, cand.id, f"{rej.outcome.value}: {rej.detail}"))
                remaining = [c for c in remaining if c.key() != key]
                if len(findings) >= 8:
                    return findings
        return findings


def case_from_key(key: str, origin: str = "seed") -> Case:
    d = json.loads(key)
    return Case(d["shape"], d["seed"], d["dist"], origin, params=d.get("params", {}))
