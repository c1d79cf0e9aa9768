"""The analyst: lessons from the evidence store, re-checked as evidence grows.

It proposes nothing; it reads what the swarm measured and writes ``lessons``. A lesson is a claim
about two values of one knob of one problem on one machine:

    on softmax (rows 1-72, cols 512-49152), exp=poly beats exp=libm by 10.31x [6.54, 16.26],
    10 evaluations, 5 matched pairs, AMD EPYC avx512

**Evidence.** Every correct, measured evaluation (``faster`` or ``not_faster``: search, eval or
re-measure; never ``inconclusive`` or ``verified``) of a knob candidate of the problem's current
spec on that machine. A candidate that was ever ``wrong``, ``cheated`` or ``crashed`` is left out
entirely: a broken kernel teaches nothing about what is fast. Each evaluation weighs its
measurement quality, ``w = (1 - suffered) / (1 + (ci_high - ci_low) / speedup)`` (``suffered``
from ``evidence["contention"]``, 0 where not recorded; ``evidence/quality.py``), and one measured
on a busy machine weighs 0, i.e. is left out. A configuration's figure is the weighted geometric
mean of its evaluations' speedups (or, for a subset of the workload, of its per-shape speedups on
that subset).

**Effect.** The ratio of geometric-mean speedups of configurations with ``knob=a`` to those with
``knob=b``. Matched where the data allows: two configurations identical in every other knob are a
pair, and with at least ``MIN_PAIRS`` pairs the effect is the geometric mean of the pairs' ratios
and its 95% CI a bootstrap over pairs. Otherwise, with at least ``MIN_PER_SIDE`` configurations on
each side, it is the ratio of the two sides' geometric means, each side resampled on its own
("unmatched": the other knobs are not held equal, and the claim says so). The bootstrap is the
*expanded* percentile interval (Hesterberg): a plain percentile interval is too narrow for a
handful of pairs, so its percentiles are moved out to where ``sqrt(n/(n-1)) x t(n-1)`` puts a
95% interval. A bootstrap cannot reach beyond the range of its data (4 noisy pairs that happen
to agree would exclude 1 whatever their spread), so the interval is widened to the t interval on
the log ratios (paired, or Welch's) wherever that is wider.

**Scope.** The whole workload (the recorded speedup, itself a geometric mean over the workload
shapes); and where the effect is not the same on every shape, the shapes on which each direction
holds shape by shape, as a claim of its own.

**Rule.** A claim becomes a lesson when the better value is at least ``MIN_EFFECT`` (5%) faster,
with the support above, and its CI excludes 1 at a family-wise 95%: a pass compares every pair of
values of every knob, on the whole workload and shape by shape, so each comparison is held to
``1 - 0.05 / m`` (Bonferroni over the ``m`` comparisons of the problem in that pass). The lesson
shows its plain 95% CI. Each time the analyst runs, every lesson of the problem and machine is
re-checked on all the evidence there is now: it stays active while its plain 95% CI still
excludes 1 in its direction (no minimum effect, no correction: hysteresis against flapping) and
is *retired*, with why, when that CI includes 1 or lies on the other side. A retired lesson
whose claim qualifies again becomes active again (its history is kept).

**Identity.** The store is append-only: a lesson's identity is ``data["key"]`` (problem,
machine, knob, better > worse, scope) and every status change is a new row, so the latest row of
a key is the lesson as it stands (``Store.current_lessons``). An active lesson is also
re-recorded, with fresh figures, once its support has grown by half.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import zlib
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import Any, Iterable

import numpy as np

from swarmfactory.evidence.rows import KnobEvidence, Lesson
from swarmfactory.outcome import MEASURED, MISBEHAVED
from swarmfactory.problems.spec import knob_key

AGENT = "analyst"
MIN_PAIRS = 4          # matched pairs for a matched estimate
MIN_PER_SIDE = 6       # configurations on each side for an unmatched one
MIN_ADJUSTED = 8       # configurations for an adjusted (additive-model) estimate
MIN_ADJUSTED_SIDE = 3  # ... with at least this many on each side
MIN_DF = 4             # ... and this many residual degrees of freedom
LOCAL_PAIRS = 2        # matched pairs (or an adjusted estimate from 2 per side) that test a lesson from elsewhere
MIN_EFFECT = 1.05      # a new lesson's better value is at least 5% faster
CONFIDENCE = 0.95
RESAMPLES = 4000
REFRESH_GROWTH = 1.5   # an active lesson is re-recorded once its support grew by this factor
RULE = (f"ratio >= {MIN_EFFECT:g} and its CI excludes 1 at a family-wise {CONFIDENCE:.0%} (Bonferroni over the "
        f"problem's comparisons), from >= {MIN_PAIRS} matched pairs, >= {MIN_PER_SIDE} configurations per side, or "
        f"an additive model of >= {MIN_ADJUSTED} configurations (>= {MIN_ADJUSTED_SIDE} per side, >= {MIN_DF} residual "
        f"degrees of freedom); retired when a re-check's plain {CONFIDENCE:.0%} CI includes 1 or lies on the other "
        "side; a lesson from another machine or problem is a hypothesis there until local evidence confirms it, "
        "and is retired there by the first that contradicts it")


@dataclass
class Config:
    """One knob configuration as measured on one machine."""

    knobs: dict
    evals: list[int]
    log_speedup: float
    log_shapes: dict[str, float]   # shape key -> mean log speedup on that shape


@dataclass
class Estimate:
    """Geometric-mean speedup with knob=a over knob=b, with its CI."""

    ratio: float
    low: float
    high: float
    support: list[int]   # evaluation ids
    pairs: int
    method: str          # matched | unmatched
    strict_low: float = 0.0    # the family-wise interval (Bonferroni over the pass's comparisons)
    strict_high: float = math.inf

    def favours(self) -> int:
        """+1: a is faster, -1: b is faster, 0: the (plain 95%) CI includes 1."""
        return 1 if self.low > 1.0 else -1 if self.high < 1.0 else 0

    def qualifies(self) -> int:
        """Like ``favours``, on the family-wise interval: what a new lesson needs."""
        return 1 if self.strict_low > 1.0 else -1 if self.strict_high < 1.0 else 0

    def flipped(self) -> "Estimate":
        """The same comparison read as knob=b over knob=a."""
        return Estimate(1 / self.ratio, 1 / self.high, 1 / self.low, self.support, self.pairs, self.method,
                        1 / self.strict_high if self.strict_high else math.inf,
                        1 / self.strict_low if self.strict_low else math.inf)

    def oriented(self, a_better: bool, strict: bool = False) -> tuple[float, float, float]:
        """(ratio, low, high) of the better value over the worse one as the claim states it (the
        family-wise interval with ``strict``)."""
        e = self if a_better else self.flipped()
        return (e.ratio, e.strict_low, e.strict_high) if strict else (e.ratio, e.low, e.high)


def shape_key(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def scope_key(scope: list[str] | None) -> str:
    return "all" if scope is None else ";".join(sorted(scope))


def lesson_key(problem: str, hardware_id: str, knob: str, better: Any, worse: Any, scope: list[str] | None) -> str:
    return f"{problem}|{hardware_id}|{knob}:{better}>{worse}|{scope_key(scope)}"


def isa_label(features: list[str] | tuple[str, ...]) -> str:
    f = set(features or ())
    for flag, label in (("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx"), ("sve", "sve"),
                        ("asimd", "neon"), ("neon", "neon"), ("sse4_2", "sse4.2")):
        if flag in f:
            return label
    return "baseline ISA"


MACHINE_FIELDS = ("vendor", "family", "cpu_model", "stepping", "caches", "bandwidth_gbs")


def hardware_info(hw: dict) -> dict:
    """The machine a lesson comes from, as it is shown and compared (``hardware.similarity``): its
    model name, ISA level, cores and features, and where recorded its microarchitecture, caches and
    memory bandwidth. For this machine those come from ``hardware.machine_profile``."""
    from swarmfactory.hardware import cpu_fingerprint, machine_profile

    if hw.get("id") == cpu_fingerprint()["id"] and hw.get("mask") == cpu_fingerprint().get("mask"):
        hw = {**machine_profile(), **hw}
    model = re.sub(r"\((R|TM|tm|r)\)|\bCPU\b|\bProcessor\b|\b\d+-Core\b|@.*$", "", hw.get("model") or "?")
    model = " ".join(model.split()) or hw.get("arch") or "?"
    info = {"id": hw.get("id"), "model": model, "isa": isa_label(hw.get("features") or ()),
            "cpus": hw.get("cpus"), "features": list(hw.get("features") or ()), "mask": hw.get("mask")}
    info.update({k: hw[k] for k in MACHINE_FIELDS if hw.get(k) is not None})
    return info


def hardware_label(info: dict) -> str:
    return f"{info['model']} {info['isa']}" + (f" (masked {info['mask']})" if info.get("mask") else "")


# -- evidence ------------------------------------------------------------------------------------------
def configurations(rows: list[KnobEvidence], spec: str, hardware_id: str) -> tuple[dict[str, Config], list[dict]]:
    """The measured configurations of one spec on one machine, and the workload shapes seen."""
    rows = [r for r in rows if r.problem_spec == spec and r.hardware_id == hardware_id]
    bad = {r.candidate_id for r in rows if r.outcome in MISBEHAVED}
    groups: dict[str, list[tuple[KnobEvidence, float]]] = {}
    shapes: dict[str, dict] = {}
    for r in rows:
        if (r.candidate_id in bad or r.outcome not in MEASURED or not isinstance(r.knobs, dict)
                or not r.knobs or not r.speedup or r.speedup <= 0):
            continue
        w = quality(r)
        if w <= 0:
            continue  # measured on a busy machine: not evidence
        groups.setdefault(knob_key(r.knobs), []).append((r, w))
        for s in r.shapes or []:
            shapes.setdefault(shape_key(s["shape"]), dict(s["shape"]))
    configs = {}
    for key, evs in groups.items():
        per_shape: dict[str, list[tuple[float, float]]] = {}
        for ev, w in evs:
            for s in ev.shapes or []:
                if s.get("speedup") and s["speedup"] > 0:
                    per_shape.setdefault(shape_key(s["shape"]), []).append((math.log(s["speedup"]), w))
        configs[key] = Config(dict(evs[0][0].knobs), [e.id for e, _ in evs],
                              _weighted([(math.log(e.speedup), w) for e, w in evs]),
                              {k: _weighted(v) for k, v in per_shape.items()})
    return configs, list(shapes.values())


def quality(row: KnobEvidence) -> float:
    """An evaluation's weight in a configuration's figure (``evidence.quality.weight``: 0 for one
    measured on a busy machine; one without an interval or contention recorded weighs 1)."""
    from swarmfactory.evidence.quality import weight

    return weight(row.speedup, row.ci_low, row.ci_high, row.contention)


def _weighted(pairs: list[tuple[float, float]]) -> float:
    """The weighted mean of (value, weight) pairs."""
    total = sum(w for _, w in pairs)
    return float(sum(v * w for v, w in pairs) / total)


def _value(cfg: Config, scope: list[str] | None) -> float | None:
    if scope is None:
        return cfg.log_speedup
    vals = [cfg.log_shapes.get(s) for s in scope]
    return None if any(v is None for v in vals) else sum(vals) / len(vals)


@lru_cache(maxsize=None)
def expanded_tail(n: int, confidence: float = CONFIDENCE) -> float:
    """The tail share of each end of the expanded percentile interval for ``n`` observations:
    the normal tail beyond ``sqrt(n/(n-1)) x t(n-1)`` at ``confidence`` (at 95%: 0.00012 for
    n=4, 0.0086 for n=10, 0.019 for n=30; 0.025 in the limit)."""
    from statistics import NormalDist

    from scipy.special import stdtrit

    q = math.sqrt(n / (n - 1)) * float(stdtrit(n - 1, 1 - (1 - confidence) / 2))
    return 1 - NormalDist().cdf(q)


def estimate(configs: dict[str, Config], knob: str, a: Any, b: Any, scope: list[str] | None = None,
             comparisons: int = 1, local: bool = False) -> Estimate | None:
    """knob=a against knob=b over ``scope`` (None: the whole workload); None without the support
    the rule asks for. ``comparisons``: how many the caller makes in all (for the family-wise
    interval). ``local``: the support that tests a lesson from elsewhere (``LOCAL_PAIRS`` matched
    pairs, or an adjusted estimate from ``LOCAL_PAIRS`` configurations per side), not the support
    that makes a new lesson."""
    sides: tuple[dict, dict] = ({}, {})
    for cfg in configs.values():
        if knob not in cfg.knobs or cfg.knobs[knob] not in (a, b):
            continue
        x = _value(cfg, scope)
        if x is not None:
            rest = knob_key({k: v for k, v in cfg.knobs.items() if k != knob})
            sides[0 if cfg.knobs[knob] == a else 1][rest] = (x, cfg)
    rng = np.random.default_rng(zlib.crc32(f"{knob}|{a}|{b}|{scope_key(scope)}".encode()))
    matched = [k for k in sides[0] if k in sides[1]]
    if local:
        if len(matched) < LOCAL_PAIRS:
            return adjusted(configs, knob, a, b, scope, comparisons, min_configs=2 * LOCAL_PAIRS,
                            min_side=LOCAL_PAIRS, min_df=1)
    elif len(matched) < MIN_PAIRS:
        # fewer pairs than a matched estimate needs: the additive model holds the other knobs
        # equal where it can; the unmatched comparison of the two sides where it cannot
        adj = adjusted(configs, knob, a, b, scope, comparisons)
        if adj is not None or min(len(sides[0]), len(sides[1])) < MIN_PER_SIDE:
            return adj
    if len(matched) >= (LOCAL_PAIRS if local else MIN_PAIRS):
        d = np.array([sides[0][k][0] - sides[1][k][0] for k in matched])
        boot = d[rng.integers(0, len(d), (RESAMPLES, len(d)))].mean(axis=1)
        point, used, pairs, method = d.mean(), [sides[i][k][1] for k in matched for i in (0, 1)], len(matched), "matched"
        se, df = d.std(ddof=1) / math.sqrt(len(d)), len(d) - 1
    elif min(len(sides[0]), len(sides[1])) >= MIN_PER_SIDE:
        xa = np.array([x for x, _ in sides[0].values()])
        xb = np.array([x for x, _ in sides[1].values()])
        boot = (xa[rng.integers(0, len(xa), (RESAMPLES, len(xa)))].mean(axis=1)
                - xb[rng.integers(0, len(xb), (RESAMPLES, len(xb)))].mean(axis=1))
        point, used, pairs, method = xa.mean() - xb.mean(), [c for s in sides for _, c in s.values()], 0, "unmatched"
        va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va ** 2 / (len(xa) - 1) + vb ** 2 / (len(xb) - 1)) if va + vb > 0 else len(xa) + len(xb) - 2
    else:
        return None
    n = pairs if method == "matched" else min(len(sides[0]), len(sides[1]))
    family = 1 - (1 - CONFIDENCE) / max(1, comparisons)
    lo, hi = _interval(boot, point, se, df, n, CONFIDENCE)
    slo, shi = _interval(boot, point, se, df, n, family)
    return Estimate(math.exp(point), math.exp(lo), math.exp(hi), sorted(e for c in used for e in c.evals),
                    pairs, method, math.exp(slo), math.exp(shi))


def adjusted(configs: dict[str, Config], knob: str, a: Any, b: Any, scope: list[str] | None = None,
             comparisons: int = 1, min_configs: int = MIN_ADJUSTED, min_side: int = MIN_ADJUSTED_SIDE,
             min_df: int = MIN_DF) -> Estimate | None:
    """knob=a against knob=b adjusted for the other knobs: the least-squares fit of every measured
    configuration's log speedup to an intercept plus one term per value of every knob (additive:
    no interactions), the effect the difference of the two values' terms, its interval the t
    interval on the fit's residual variance (interactions the model leaves out count as noise
    there). What a short run's evidence supports, where few configurations differ in one knob
    only. None with fewer than ``min_configs`` configurations, ``min_side`` on either side or
    ``min_df`` residual degrees of freedom, or where the design cannot separate the two values
    from the other knobs (every a-configuration also has vw=16, say)."""
    from scipy.special import stdtrit

    rows = [(cfg, x) for cfg in configs.values() if knob in cfg.knobs
            for x in [_value(cfg, scope)] if x is not None]
    side = [sum(1 for c, _ in rows if c.knobs[knob] == v) for v in (a, b)]
    if len(rows) < min_configs or min(side) < min_side:
        return None
    names = sorted({k for c, _ in rows for k in c.knobs})
    levels = {k: sorted({json.dumps(c.knobs.get(k), sort_keys=True) for c, _ in rows}) for k in names}
    columns = [(k, v) for k in names for v in levels[k][1:]]   # the first level of each knob is the intercept's
    index = {col: 1 + i for i, col in enumerate(columns)}
    X = np.zeros((len(rows), 1 + len(columns)))
    X[:, 0] = 1.0
    for i, (c, _) in enumerate(rows):
        for k in names:
            j = index.get((k, json.dumps(c.knobs.get(k), sort_keys=True)))
            if j is not None:
                X[i, j] = 1.0
    y = np.array([x for _, x in rows])
    contrast = np.zeros(X.shape[1])
    for v, sign in ((a, 1.0), (b, -1.0)):
        j = index.get((knob, json.dumps(v, sort_keys=True)))
        if j is not None:
            contrast[j] += sign
    pinv = np.linalg.pinv(X)
    rank = int(np.linalg.matrix_rank(X))
    df = len(rows) - rank
    # estimable only where the contrast lies in the row space of the design
    if df < min_df or np.abs(contrast @ (np.eye(X.shape[1]) - pinv @ X)).max() > 1e-8:
        return None
    beta = pinv @ y
    resid = y - X @ beta
    sigma2 = float(resid @ resid) / df
    se = math.sqrt(max(sigma2 * float(contrast @ pinv @ pinv.T @ contrast), 0.0))
    point = float(contrast @ beta)
    family = 1 - (1 - CONFIDENCE) / max(1, comparisons)
    q, qs = (float(stdtrit(df, 1 - (1 - c) / 2)) * se for c in (CONFIDENCE, family))
    support = sorted(e for c, _ in rows for e in c.evals)
    return Estimate(math.exp(point), math.exp(point - q), math.exp(point + q), support, 0, "adjusted",
                    math.exp(point - qs), math.exp(point + qs))


def _interval(boot, point: float, se: float, df: float, n: int, confidence: float) -> tuple[float, float]:
    """The expanded percentile bootstrap interval, widened to the t interval where that is wider:
    a bootstrap never reaches beyond the range of its data, so with a handful of pairs that all
    point one way it alone would exclude 1 however noisy they are."""
    from scipy.special import stdtrit

    tail = expanded_tail(n, confidence)
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    q = float(stdtrit(df, 1 - (1 - confidence) / 2)) * se
    return min(float(lo), point - q), max(float(hi), point + q)


# -- claims ----------------------------------------------------------------------------------------------
def scope_label(features: dict) -> str:
    """``rows 1-128, cols 576`` for a whole workload; the shapes themselves for a subset."""
    dims = features.get("dims") or {}
    if features.get("coverage", 1.0) < 1.0 and features.get("shapes"):
        return (" x ".join(dims) + " " + ", ".join("x".join(str(v) for v in s.values())
                                                    for s in features["shapes"]))
    return ", ".join(f"{d} {lo}" if lo == hi else f"{d} {lo}-{hi}" for d, (lo, hi) in dims.items())


def claim_text(problem: str, features: dict, knob: str, better: Any, worse: Any, effect: tuple[float, float, float],
               evaluations: int, pairs: int, method: str, hardware: dict) -> str:
    r, lo, hi = effect
    how = f"{pairs} matched pairs" if method == "matched" else "unmatched"
    return (f"on {problem} ({scope_label(features)}), {knob}={better} beats {knob}={worse} by {r:.2f}x "
            f"[{lo:.2f}, {hi:.2f}], {evaluations} evaluations, {how}, {hardware_label(hardware)}")


def _features(problem, name: str, knob: str, scope_shapes: list[dict] | None, all_shapes: list[dict]) -> dict:
    """What a claim is about. ``scope_shapes`` None: the whole workload (the shapes seen, or the
    problem's own workload where the evidence carries no per-shape timings), coverage 1."""
    whole = scope_shapes is None
    if whole:
        scope_shapes = all_shapes or ([dict(s) for s in problem.workload] if problem is not None else [])
    dims: dict[str, list[int]] = {}
    for s in scope_shapes:
        for d, v in s.items():
            lo, hi = dims.get(d, [v, v])
            dims[d] = [min(lo, v), max(hi, v)]
    f: dict[str, Any] = {"problem": name, "dims": dims, "shapes": scope_shapes,
                         "coverage": 1.0 if whole else len(scope_shapes) / max(1, len(all_shapes))}
    if problem is not None:
        f["aspect"] = problem.knob_aspects.get(knob)
        f["kernel"] = problem.entry   # a model's variant of a family problem shares its family's kernel
        try:
            if problem.roofline is not None:
                rl = [problem.roofline(s) for s in scope_shapes]
                f["bytes"] = [min(x.bytes for x in rl), max(x.bytes for x in rl)]
                f["flops"] = [min(x.flops for x in rl), max(x.flops for x in rl)]
        except Exception:
            pass  # a shape the roofline does not know: no size features
    return f


def _load(name: str):
    from swarmfactory.problems import load_problem

    try:
        return load_problem(name)
    except Exception:
        return None


class Analyst:
    """Writes and re-checks lessons; ``update`` is cheap (one query per problem, numpy bootstraps)."""

    name = AGENT

    def __init__(self, store):
        self.store = store

    def update(self, problems: Iterable | None = None, run_id: str | None = None,
               hardware_ids: Iterable[str] | None = None) -> list[dict]:
        """Analyse ``problems`` (Problem objects or names; default: every problem with evidence) on
        ``hardware_ids`` (default: every machine in the store); record new, re-checked and retired
        lessons with ``run_id``; return the rows written."""
        written: list[dict] = []
        names = problems if problems is not None else self.store.evaluated_problems()
        hw_filter = None if hardware_ids is None else set(hardware_ids)
        everything = {r.key: r for r in self.store.current_lessons(include_retired=True)}
        for prob in names:
            name = prob if isinstance(prob, str) else prob.name
            problem = _load(name) if isinstance(prob, str) else prob
            rows = self.store.knob_evidence(name)
            machines: dict[str, dict] = {}
            for r in rows:
                machines[r.hardware_id] = r.hardware
            for hw_id, hw in machines.items():
                if hw_filter is not None and hw_id not in hw_filter:
                    continue
                spec = problem.spec_hash() if problem is not None else \
                    next(r.problem_spec for r in reversed(rows) if r.hardware_id == hw_id)
                mine = {k: r for k, r in everything.items() if r.problem == name and r.hardware_id == hw_id}
                measured = configurations(rows, spec, hw_id)   # read once for both passes below
                written += self._analyse(name, problem, spec, hw_id, hardware_info(hw), measured, mine, run_id)
                everything.update(mine)
                if problem is not None:
                    written += self._test_hypotheses(name, problem, hw_id, measured, everything, run_id)
        return written

    def _test_hypotheses(self, name, problem, hw_id, measured: tuple[dict[str, Config], list[dict]],
                         lessons: dict[str, Lesson],
                         run_id) -> list[dict]:
        """Test every active lesson from elsewhere (another machine, another problem) that applies to
        ``name`` against ``name``'s own evidence on ``hw_id``. A lesson from elsewhere is a
        hypothesis here: it may order the first proposals, but the first local evidence that
        contradicts it (``LOCAL_PAIRS`` matched pairs or an adjusted estimate whose point estimate
        is not in its favour) retires it *here*, for good, while it stays active where it was
        learnt; local evidence whose plain 95% CI excludes 1 in its favour confirms it here. Its
        standing here is ``data["local"]["PROBLEM@MACHINE"]``, written as a new row of the lesson
        (its status where it was learnt unchanged), and ``priors.relevance`` reads it."""
        configs, shapes = measured
        if len(configs) < 2:
            return []
        here_shapes = {shape_key(s) for s in shapes}
        where = f"{name}@{hw_id}"
        out = []
        for key, row in list(lessons.items()):
            d = row.data or {}
            knob, better, worse = d.get("knob"), d.get("better"), d.get("worse")
            if (row.status != "active" or (row.problem == name and row.hardware_id == hw_id)
                    or knob not in problem.knobs or better not in problem.knobs[knob]
                    or worse not in problem.knobs[knob] or better == worse):
                continue
            prev = (d.get("local") or {}).get(where) or {}
            if prev.get("status") == "retired":
                continue
            scope = d.get("scope")
            if row.problem != name or not scope or not all(s in here_shapes for s in scope):
                scope = None
            e = estimate(configs, knob, better, worse, scope, local=True)
            if e is None:
                continue
            r, lo, hi = e.oriented(True)
            status = "retired" if r <= 1.0 else "confirmed" if lo > 1.0 else "pending"
            if status == prev.get("status", "pending"):
                continue
            now = (f"{knob}={better} vs {knob}={worse} is {r:.2f}x [{lo:.2f}, {hi:.2f}] here over "
                   f"{len(e.support)} evaluations ({e.method})")
            why = {"retired": f"contradicted here: {now}", "confirmed": f"confirmed here: {now}",
                   "pending": f"no longer confirmed here: {now}"}[status]
            verdict = {"status": status, "why": why, "effect": r, "ci_low": lo, "ci_high": hi,
                       "evaluations": len(e.support), "pairs": e.pairs, "method": e.method, "run_id": run_id}
            data = {**d, "local": {**(d.get("local") or {}), where: verdict}}
            self.store.add_lesson(row.problem, AGENT, row.text, data, run_id, hardware_id=row.hardware_id)
            lessons[key] = dataclasses.replace(row, data=data)
            out.append({"key": key, "problem": row.problem, "status": row.status, "here": where,
                        "local": status, "text": row.text, "why": why})
        return out

    def _analyse(self, name, problem, spec, hw_id, hw, measured: tuple[dict[str, Config], list[dict]],
                 current: dict[str, Lesson],
                 run_id) -> list[dict]:
        configs, shapes = measured
        if len(configs) < 2:
            return []
        if problem is not None and problem.knobs:
            domain = {k: list(v) for k, v in problem.knobs.items()}
        else:
            domain = {}
            for c in configs.values():
                for k, v in c.knobs.items():
                    if v not in domain.setdefault(k, []):
                        domain[k].append(v)
        all_keys = [shape_key(s) for s in shapes]
        by_key = {shape_key(s): s for s in shapes}
        seen = {k: [v for v in values if any(c.knobs.get(k) == v for c in configs.values())]
                for k, values in domain.items()}
        # every value pair of every knob, on the whole workload and on each shape
        comparisons = sum(len(v) * (len(v) - 1) // 2 for v in seen.values()) * (1 + len(all_keys) * (len(all_keys) > 1))
        found: dict[tuple, Estimate | None] = {}   # (knob, a, b, scope) -> estimate, a before b as JSON

        def est(knob, a, b, scope):
            """One computation per comparison, whichever way round it is asked for."""
            ja, jb = json.dumps(a), json.dumps(b)
            swap = ja > jb
            k = (knob, jb, ja, scope_key(scope)) if swap else (knob, ja, jb, scope_key(scope))
            if k not in found:
                found[k] = (estimate(configs, knob, b, a, scope, comparisons) if swap
                            else estimate(configs, knob, a, b, scope, comparisons))
            e = found[k]
            return e.flipped() if (e is not None and swap) else e

        claims = []  # (knob, a, b, scope, estimate)
        for knob in domain:
            for a, b in combinations(seen[knob], 2):
                whole = est(knob, a, b, None)
                if whole is None:
                    continue
                claims.append((knob, a, b, None, whole))
                if len(all_keys) < 2:
                    continue
                per = {s: est(knob, a, b, [s]) for s in all_keys}
                for d in (1, -1):
                    subset = [s for s in all_keys if per[s] is not None and per[s].favours() == d]
                    if subset and len(subset) < len(all_keys) and whole.favours() != d:
                        part = est(knob, a, b, subset)
                        if part is not None:
                            claims.append((knob, a, b, subset, part))

        def features(knob, scope):
            scope_shapes = None if scope is None else [by_key[s] for s in scope if s in by_key]
            return _features(problem, name, knob, scope_shapes, shapes)

        out = []
        # re-check every lesson of this problem and machine on the evidence there is now
        for key, row in current.items():
            d = row.data
            if row.status != "active" or d.get("spec", spec) != spec:
                continue
            knob, better, worse, scope = d["knob"], d["better"], d["worse"], d.get("scope")
            if scope is not None and not all(s in by_key for s in scope):
                continue
            e = est(knob, better, worse, scope)
            if e is None:
                continue  # too little valid evidence to say either way: a lesson is retired by evidence only
            r, lo, hi = e.oriented(True)
            if e.favours() == 1:
                if len(e.support) >= REFRESH_GROWTH * d.get("evaluations", len(e.support)):
                    out.append(self._write(name, hw_id, hw, spec, knob, better, worse, scope, e, True,
                                           features(knob, scope), "active", "re-checked: still holds", run_id,
                                           comparisons, d.get("local")))
                continue
            now = f"{knob}={better} vs {knob}={worse} is now {r:.2f}x [{lo:.2f}, {hi:.2f}] over {len(e.support)} evaluations"
            why = (f"contradicted: {now}" if e.favours() == -1 else f"no longer supported: {now}, the CI includes 1")
            data = {**d, "status": "retired", "why": why,
                    "recheck": {"effect": r, "ci_low": lo, "ci_high": hi, "evaluations": len(e.support),
                                "pairs": e.pairs, "method": e.method, "support": e.support}}
            self.store.add_lesson(name, AGENT, row.text, data, run_id, hardware_id=hw_id)
            out.append({"key": key, "problem": name, "status": "retired", "text": row.text, "why": why})
            current[key] = dataclasses.replace(row, data=data)
        # new lessons, and retired ones whose claim qualifies again (once each)
        derived: set[str] = set()
        for knob, a, b, scope, e in claims:
            if e.qualifies() == 0:
                continue
            a_better = e.qualifies() == 1
            better, worse = (a, b) if a_better else (b, a)
            if e.oriented(a_better)[0] < MIN_EFFECT:
                continue
            key = lesson_key(name, hw_id, knob, better, worse, scope)
            prev = current.get(key)
            if key in derived or (prev is not None and prev.status == "active" and prev.data.get("spec", spec) == spec):
                continue
            why = ("new" if prev is None else "re-established: the claim qualifies again" if prev.status != "active"
                   else "re-derived for the problem's current spec")
            out.append(self._write(name, hw_id, hw, spec, knob, a, b, scope, e, a_better, features(knob, scope),
                                   "active", why, run_id, comparisons, (prev.data or {}).get("local") if prev else None))
            derived.add(key)
        return out

    def _write(self, name, hw_id, hw, spec, knob, a, b, scope, e: Estimate, a_better: bool, features: dict,
               status: str, why: str, run_id, comparisons: int, local: dict | None = None) -> dict:
        better, worse = (a, b) if a_better else (b, a)
        effect = e.oriented(a_better)
        key = lesson_key(name, hw_id, knob, better, worse, scope)
        text = claim_text(name, features, knob, better, worse, effect, len(e.support), e.pairs, e.method, hw)
        data = {"key": key, "status": status, "why": why, "knob": knob, "better": better, "worse": worse,
                "effect": effect[0], "ci_low": effect[1], "ci_high": effect[2], "confidence": CONFIDENCE,
                "family_ci": [e.oriented(a_better, strict=True)[1], e.oriented(a_better, strict=True)[2]],
                "comparisons": comparisons,
                "method": e.method, "pairs": e.pairs, "evaluations": len(e.support), "support": e.support,
                "scope": scope, "features": features, "hardware": hw, "spec": spec, "rule": RULE}
        if local:
            data["local"] = local   # its standing on other problems and machines (``_test_hypotheses``)
        self.store.add_lesson(name, AGENT, text, data, run_id, hardware_id=hw_id)
        return {"key": key, "problem": name, "status": status, "text": text, "why": why}
