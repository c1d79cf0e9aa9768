"""A cost model that carries across problems and machines.

Every evaluation of a knob candidate is a row: the problem's features, the machine's features,
the configuration's knobs, and what was measured. The model (an ensemble of gradient-boosted
trees, bootstrap-trained for a spread) predicts a configuration's *relative* log speedup: its log
speedup minus the median log speedup of its (problem, machine) group. Absolute speedups differ by
orders of magnitude between problems (rmsnorm against torch, a quantised matvec against torch's
int4 kernel), but which knob values win is what carries: the relative target lets the trees learn
"vw=16 with two accumulators beats vw=1" once and apply it to any problem whose features and
knobs resemble it. Failed configurations train it as ``FAIL`` below the group's median.

Features (names are shared across problems, so a knob or a family seen before means the same):

* problem: op family (one-hot), number of inputs and outputs, quantised inputs, log10 of the
  workload's bytes and flops (min and max over its shapes, from the problem's roofline), flops
  per byte, log2 of the largest and smallest shape dimension and of the elements per shape;
* machine: instruction-set level (AVX-512, AVX2, VNNI, BF16 flags), cores, cache sizes, vendor and
  memory bandwidth where recorded;
* knobs: numeric values as log2 under the knob's name, other values one-hot ``name=value``, and
  ``threads_on`` (any parallel scheme against ``none``), the knob every template has; the vector
  width ``vw`` against the machine's own register width (``knob_features``).

Rows of the problem being searched, on this machine, weigh at least ``OWN_WEIGHT`` times a
transferred row, and together grow to the weight of everything transferred by ``OWN_SHARE_AT``
rows of their own: as its own evidence accumulates it takes over from what was transferred.
A row of another machine weighs its ``hardware.similarity`` to the searched one (a label such as
"AVX-512" says little: an AMD Zen 4 and an Intel Xeon both carry it). Every row's weight is also
multiplied by its measurement quality (``evidence/quality.py``:
``(1 - suffered) / (1 + relative CI width)``); ``inconclusive`` verdicts and measurements taken on
a busy machine make no row at all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from swarmfactory.evidence.rows import KnobEvidence
from swarmfactory.outcome import MEASURED, REJECTED, Outcome

FAIL = -2.0          # relative log speedup a failed configuration trains as (e^-2: 7x below the median)
OWN_WEIGHT = 4.0     # least weight of a row of the searched problem on this machine
OWN_SHARE_AT = 20    # own rows at which they weigh as much as all transferred rows together
MAX_ROWS = 6000      # most recent rows a model trains on (the store can hold far more)
VW_AGAINST_LANES = True   # the vector width as a share of the machine's register (False: as is; an ablation)


def _log10(x: float) -> float:
    return math.log10(max(float(x), 1e-12))


_FEATURES: dict[tuple[str, int], dict[str, float]] = {}


def problem_features(problem) -> dict[str, float]:
    """Features of a problem that do not depend on the machine or the configuration."""
    key = (problem.name, id(problem))
    if key not in _FEATURES:
        _FEATURES[key] = _problem_features(problem)
    return dict(_FEATURES[key])


def _problem_features(problem) -> dict[str, float]:
    f: dict[str, float] = {f"family={problem.family or 'unknown'}": 1.0,
                           "n_inputs": float(len(problem.inputs)), "n_outputs": float(len(problem.outputs)),
                           "quantised": float(any(a.dtype in ("uint8", "int8") for a in problem.inputs))}
    shapes = [dict(s) for s in problem.workload]
    if problem.roofline is not None:
        try:
            roofs = [problem.roofline(s) for s in shapes]
            b = [r.bytes for r in roofs]
            fl = [r.flops for r in roofs]
            f.update({"log_bytes_min": _log10(min(b)), "log_bytes_max": _log10(max(b)),
                      "log_flops_min": _log10(min(fl)), "log_flops_max": _log10(max(fl)),
                      "log_intensity": _log10(sum(fl) / max(sum(b), 1.0))})
        except Exception:  # a user problem's roofline that fails on a shape: features without it
            pass
    if shapes:
        dims = [v for s in shapes for v in s.values()]
        f["log_dim_max"] = math.log2(max(max(dims), 1))
        f["log_dim_min"] = math.log2(max(min(dims), 1))
        f["n_dims"] = float(len(shapes[0]))
        f["log_elements"] = float(np.mean([math.log2(max(math.prod(s.values()), 1)) for s in shapes]))
    return f


def hardware_features(hw: dict | None) -> dict[str, float]:
    """Features of a machine from its fingerprint (``hardware.cpu_fingerprint``)."""
    hw = hw or {}
    flags = set(hw.get("features") or ())
    f = {f"isa:{flag}": 1.0 for flag in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                                         "avx_vnni", "amx_tile") if flag in flags}
    f["cores"] = float(hw.get("cpus") or 1)
    for level, kib in (hw.get("caches") or {}).items():
        f[f"log_cache_{level}"] = math.log2(max(int(kib), 1))
    if hw.get("vendor"):
        f[f"vendor={hw['vendor']}"] = 1.0
    if hw.get("bandwidth_gbs"):
        f["log_bandwidth"] = math.log2(max(float(hw["bandwidth_gbs"]), 0.1))
    return f


def fp32_lanes(hw: dict | None) -> int | None:
    """fp32 lanes of the widest vector register the machine's flags give (16 with AVX-512, 8 with
    AVX/AVX2, 4 with SSE or NEON); None for a machine described without its flags."""
    flags = set((hw or {}).get("features") or ())
    if not flags:
        return None
    if "avx512f" in flags:
        return 16
    if flags & {"avx", "avx2"}:
        return 8
    return 4


def knob_features(knobs: dict[str, Any], hardware: dict | None = None) -> dict[str, float]:
    """Numeric knobs as log2 under their name, others one-hot. The vector width ``vw`` (fp32
    lanes, as every bundled template counts it) is taken against the machine's own registers
    where its flags are known (``knob:vw/lanes``, log2 of vw over ``fp32_lanes``): vw=8 on an
    AVX2 machine is what vw=16 is on an AVX-512 one (one full register; twice that spills
    into pairs, and on the AVX2 machines measured, into far slower code), so what one machine's
    evidence says of its full-register width carries to the other's."""
    f: dict[str, float] = {}
    lanes = fp32_lanes(hardware) if VW_AGAINST_LANES else None
    for name, value in knobs.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if name == "vw" and lanes and value > 0:
                f["knob:vw/lanes"] = math.log2(value / lanes)
            else:
                f[f"knob:{name}"] = math.log2(value) if value > 0 else float(value)
        else:
            f[f"knob:{name}={value}"] = 1.0
    if "threads" in knobs:
        f["threads_on"] = float(knobs["threads"] not in ("none", 1, "1"))
    return f


@dataclass
class Row:
    """One evaluated configuration: where (problem, machine), what (knobs) and how it did."""

    problem: str
    hardware_id: str
    features: dict[str, float]
    knobs: dict[str, Any]
    log_speedup: float | None      # None: the configuration failed
    target: float = 0.0            # relative log speedup (set by ``relative_targets``)
    weight: float = 1.0            # its measurement's quality (evidence/quality.py); failures weigh 1
    hardware: dict | None = None   # the machine's fingerprint, for its similarity to the one searched


def make_row(problem, hardware: dict | None, knobs: dict, outcome: str, speedup: float | None,
             weight: float = 1.0) -> Row | None:
    """A training row, or None for an outcome that says nothing about speed (``inconclusive``,
    ``verified``; a measurement of ``weight`` 0, taken on a busy machine)."""
    if outcome in MEASURED and speedup and weight > 0:
        log_s = math.log(speedup)
    elif outcome in REJECTED:
        log_s, weight = None, 1.0
    else:
        return None
    feats = {**problem_features(problem), **hardware_features(hardware), **knob_features(knobs, hardware)}
    return Row(problem.name, (hardware or {}).get("id", "?"), feats, dict(knobs), log_s, weight=weight,
               hardware=hardware)


def rows_from_evidence(evidence: Iterable[KnobEvidence | Mapping], problems: dict | None = None) -> list[Row]:
    """Rows from ``Store.knob_evidence`` rows, or recorded sweep records in the same names
    (``benchmarks/data``): problem, hardware, knobs, outcome, speedup (and, where recorded,
    ci_low, ci_high, contention). A configuration
    evaluated several times on one machine counts once (failed if it ever failed), at the
    geometric mean of its speedups weighted by their measurement quality
    (``evidence.quality.weight``; a measurement on a busy machine weighs 0 and is left out), the
    row weighing as much as its best measurement. Problems that cannot be loaded here (a user's
    file that moved) are skipped."""
    from swarmfactory.problems.spec import knob_key
    from swarmfactory.evidence.quality import weight
    from swarmfactory.problems import ProblemError, load_problem

    groups: dict[tuple, list[KnobEvidence]] = {}
    for ev in evidence:
        ev = ev if isinstance(ev, KnobEvidence) else KnobEvidence.of(ev)
        if not ev.knobs:
            continue
        hw = ev.hardware or {}
        groups.setdefault((ev.problem, hw.get("id"), knob_key(ev.knobs)), []).append(ev)
    out = []
    cache: dict[str, Any] = dict(problems or {})
    for (name, _hw, _k), evs in groups.items():
        if name not in cache:
            try:
                cache[name] = load_problem(name)
            except ProblemError:
                cache[name] = None
        problem = cache[name]
        if problem is None:
            continue
        failed = [e for e in evs if e.outcome in REJECTED]
        good = [(e.speedup, w) for e in evs if e.outcome in MEASURED and e.speedup
                for w in [weight(e.speedup, e.ci_low, e.ci_high, e.contention)] if w > 0]
        if failed:
            row = make_row(problem, evs[0].hardware, evs[0].knobs, failed[0].outcome.value, None)
        elif good:
            total = sum(w for _, w in good)
            row = make_row(problem, evs[0].hardware, evs[0].knobs, Outcome.FASTER.value,
                           math.exp(sum(math.log(s) * w for s, w in good) / total), max(w for _, w in good))
        else:
            row = None
        if row is not None:
            out.append(row)
    return out


def evidence_rows(store) -> list[Row]:
    """Every knob evaluation in ``store`` (every problem, every machine) as cost-model rows."""
    return rows_from_evidence(ev for name in store.evaluated_problems() for ev in store.knob_evidence(name))


def relative_targets(rows: list[Row]) -> list[Row]:
    """Set each row's target: its log speedup minus its (problem, machine) group's median;
    failures ``FAIL``. Returns the rows that say something: a measured row alone in its group
    is its own median (target 0 whatever it measured), so it is left out; a failure says
    something on its own and stays. (The first measurement of a problem, the template's
    defaults, would otherwise teach the model that the defaults' knob values are average, with
    all the weight a problem's own rows carry.)"""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.log_speedup is not None:
            groups.setdefault((r.problem, r.hardware_id), []).append(r.log_speedup)
    med = {k: float(np.median(v)) for k, v in groups.items()}
    for r in rows:
        r.target = FAIL if r.log_speedup is None else r.log_speedup - med[(r.problem, r.hardware_id)]
    return [r for r in rows if r.log_speedup is None or len(groups[(r.problem, r.hardware_id)]) > 1]


class CostModel:
    """An ensemble of gradient-boosted trees over the features above. ``fit`` on rows of any
    problems and machines; ``predict`` relative log speedups (mean and spread over the ensemble)
    of configurations of one problem on one machine."""

    def __init__(self, models: int = 4, n_estimators: int = 80, seed: int = 0):
        self.models, self.n_estimators, self.seed = models, n_estimators, seed
        self.vocab: list[str] = []
        self.fitted: list = []

    def _matrix(self, feats: list[dict[str, float]]) -> np.ndarray:
        index = {k: i for i, k in enumerate(self.vocab)}
        X = np.zeros((len(feats), len(self.vocab)))
        for i, f in enumerate(feats):
            for k, v in f.items():
                j = index.get(k)
                if j is not None:
                    X[i, j] = v
        return X

    def fit(self, rows: list[Row], own: tuple[str, str] | None = None, here: dict | None = None) -> CostModel:
        """Train on ``rows`` (targets from ``relative_targets``); rows of ``own`` = (problem,
        hardware id) weigh ``OWN_WEIGHT``. With ``here`` (the searched machine's fingerprint) a
        row of another machine weighs its ``hardware.similarity`` to it as well."""
        from sklearn.ensemble import GradientBoostingRegressor

        rows = rows[-MAX_ROWS:]
        self.vocab = sorted({k for r in rows for k in r.features})
        X = self._matrix([r.features for r in rows])
        y = np.array([r.target for r in rows])
        mine = np.array([bool(own) and (r.problem, r.hardware_id) == own for r in rows])
        n_own, n_other = int(mine.sum()), int((~mine).sum())
        # the searched problem's own rows weigh OWN_WEIGHT each at least, and together up to as much
        # as everything transferred once it has OWN_SHARE_AT rows of its own
        share = min(1.0, n_own / OWN_SHARE_AT)
        w_own = max(OWN_WEIGHT, share * n_other / n_own) if n_own else 0.0
        w = np.where(mine, w_own, 1.0) * np.array([r.weight for r in rows])  # times each row's quality
        if here is not None:
            from swarmfactory.hardware import similarity

            sims: dict[str, float] = {}
            for i, r in enumerate(rows):
                if r.hardware_id != here.get("id"):
                    if r.hardware_id not in sims:
                        sims[r.hardware_id] = max(similarity(r.hardware, here), 0.05)
                    w[i] *= sims[r.hardware_id]
        rng = np.random.default_rng(self.seed)
        self.fitted = []
        for _ in range(self.models):
            idx = rng.integers(0, len(rows), len(rows)) if self.models > 1 else np.arange(len(rows))
            # a few rows train on all of them: a 90% subsample of them can leave no row out of the bag
            m = GradientBoostingRegressor(n_estimators=self.n_estimators, max_depth=3, learning_rate=0.1,
                                          subsample=0.9 if len(rows) >= 20 else 1.0,
                                          random_state=int(rng.integers(1 << 30)))
            m.fit(X[idx], y[idx], sample_weight=w[idx])
            self.fitted.append(m)
        return self

    def predict(self, problem, hardware: dict | None, configs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        base = {**problem_features(problem), **hardware_features(hardware)}
        X = self._matrix([{**base, **knob_features(k, hardware)} for k in configs])
        preds = np.array([m.predict(X) for m in self.fitted])
        return preds.mean(axis=0), preds.std(axis=0)


def spearman(a, b) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    from scipy.stats import spearmanr

    rho = spearmanr(a, b).statistic
    return 0.0 if rho is None or math.isnan(rho) else float(rho)


def spearman_ci(pred, actual, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Spearman's rho of ``pred`` against ``actual`` and its 95% bootstrap CI (over configurations)."""
    pred, actual = np.asarray(pred), np.asarray(actual)
    rng = np.random.default_rng(seed)
    rho = spearman(pred, actual)
    boots = []
    for _ in range(resamples):
        idx = rng.integers(0, len(pred), len(pred))
        boots.append(spearman(pred[idx], actual[idx]))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return rho, float(lo), float(hi)
