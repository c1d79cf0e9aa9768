"""From timed rounds to a verdict: the objective, every shape's own figure, the basis stated.

Only clean rounds count (``rounds.RoundsLog``): with fewer than ``min_clean`` of them the
verdict is ``inconclusive`` (the machine was too busy), never a figure.

The objective (``HarnessConfig.objective``), over the clean rounds' ratios baseline / candidate:

* ``weighted`` (the default): the geometric mean with the problem's workload weights
  (``Problem.workload_weights``, the call mix of the model it comes from; equal when unstated);
  ``faster`` needs its interval above 1 + min_effect *and* no shape significantly slower (its
  own interval below 1): a kernel that loses on a shape that matters is not faster, and the
  verdict names that shape;
* ``geomean``: the equal-weight geometric mean alone (slower shapes are named in a flag);
* ``worst``: the slowest shape of each round: ``faster`` only if faster on every shape.

Each round's yardstick is the fastest of the chosen baseline, its one-thread runner and its rivals
timed beside it (``yardstick_times``, ``baselines.rivals``); the evidence counts the rounds each
was the fastest in.

Every verdict states its basis: the candidate is timed inside the driver's C loop, the torch
baseline as Python calls it (each call's dispatch included). Beside it, a dispatch-free basis:
the baseline less what one call costs a Python caller around any op (measured in its own
worker); a kernel faster only on the first basis wins by dispatch, not by its work, and the
verdict says so (inside the engine, which calls kernels from C, it would not be faster).

Every interval also carries the spread between evaluations (``between_spread``): the rounds of
one evaluation share its baseline worker, its inputs, the machine's state of that minute, and
their interval is a few percent wide where the same kernel measures 20-50% apart minutes later.
That spread, pooled from the kernels measured more than once on this machine (a floor where too
few were), is added to each interval in log space (``widen``).

One evaluation with that spread added cannot call a kernel 1.15x faster (its interval is about
+-17% wide), however often it measures 1.15x. Its independent evaluations can: ``pool`` combines
a kernel's clean measurements here (each its own minute, worker and inputs) into one interval whose
between-evaluation part narrows as 1/sqrt(k), with the spread the kernel's own figures show where
that is wider than the assumed one. The title (swarm/succession.py) uses it; a verdict stays one
evaluation's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from swarmfactory import contention
from swarmfactory.outcome import Outcome, ShapeTiming, Verdict
from swarmfactory.harness.roofline import fraction
from swarmfactory.harness.rounds import RIVAL, SINGLE, RoundsLog, yardsticks
from swarmfactory.harness.timing import geomean, median_ci
from swarmfactory.problems.spec import Problem

OBJECTIVES = ("weighted", "geomean", "worst")
Z95 = 1.96
BETWEEN_FLOOR = 0.08     # log-speedup spread between evaluations assumed at least (about 8%)
BETWEEN_MIN_DOF = 4      # repeats needed before the store's own spread is used
MIN_EFFECT = 0.03        # `faster` needs CI low > 1 + MIN_EFFECT (HarnessConfig.min_effect's default)


def weights(problem: Problem, objective: str) -> np.ndarray:
    n = len(problem.workload)
    w = getattr(problem, "workload_weights", None)
    if objective != "weighted" or not w:
        return np.full(n, 1.0 / n)
    w = np.asarray(w, dtype=float)
    return w / w.sum()


def widen(med: float, lo: float, hi: float, sigma: float, z: float = Z95) -> tuple[float, float]:
    """The interval ``[lo, hi]`` around ``med`` with the spread between evaluations added: in log
    space each side's half-width and ``z * sigma`` add in quadrature (a random-effects interval:
    the rounds of one evaluation cannot show how the next evaluation's setting differs)."""
    if sigma <= 0 or med <= 0 or lo <= 0 or hi <= 0:
        return lo, hi
    lm, b = math.log(med), (z * sigma) ** 2
    return (math.exp(lm - math.sqrt((lm - math.log(lo)) ** 2 + b)),
            math.exp(lm + math.sqrt((math.log(hi) - lm) ** 2 + b)))


def decide(problem: Problem, setups: list[dict], log: RoundsLog, roofs: dict | None, cfg,
           slot_key, baseline_label, between: dict | None = None) -> Verdict:
    """``between``: the spread of log speedups between evaluations of one kernel here
    (``between_spread``: ``sigma`` and where it came from), added to every interval."""
    objective = cfg.objective
    clean = log.clean
    sigma = float((between or {}).get("sigma") or 0.0)
    evidence = {"timing": {slot_key(s["shape"]): {"mode": s["mode"], "sets": s["group"].n} for s in setups},
                "contention": contention_evidence(log), "objective": objective, "bar": 1.0 + cfg.min_effect,
                "basis": basis(setups, baseline_label)}
    if between:
        evidence["between"] = dict(between)
    one = {slot_key(s["shape"]): f"{single_thread_rounds(s)} of {len(s['times'][SINGLE])} rounds"
           for s in setups if SINGLE in s["times"]}
    if one:  # where the multi-threaded yardstick was beaten by its own one-thread runner
        evidence["basis"]["one_thread_faster"] = one
    if any(n.startswith(RIVAL) for s in setups for n in s["times"]) and clean:
        # per shape, which runner was the yardstick in how many clean rounds
        evidence["basis"]["yardstick_rounds"] = {slot_key(s["shape"]): yardstick_wins(s, clean, baseline_label)
                                                 for s in setups if len(yardsticks(s)) > 1}
    left = {slot_key(s["shape"]): s["rivals_left_out"] for s in setups if s.get("rivals_left_out")}
    if left:
        evidence["basis"]["rivals_left_out"] = left
    min_clean = min_clean_rounds(cfg.rounds)
    if len(clean) < min_clean:
        worst = max(log.worst("candidate"), log.worst("baseline"))
        return Verdict(Outcome.INCONCLUSIVE,
                       f"the machine was too busy to time it: {log.disturbed} of {log.run} rounds disturbed "
                       f"(the timed code waited for a CPU up to {worst:.0%} of the time; other work took "
                       f"the measurement CPUs), {len(clean)} clean of the {min_clean} needed after waiting "
                       f"{log.waited_s:.0f} s; no figure is given, it will be measured again",
                       "measure", evidence=evidence)
    shapes, ratios, beyond, slower, by_dispatch = [], [], [], [], []
    for s in setups:
        timing, ratio, notes = _shape(problem, s, clean, roofs, cfg, sigma)
        shapes.append(timing)
        ratios.append(ratio)
        for where, note in zip((slower, by_dispatch, beyond), notes):
            if note:
                where.append(note)
    per_round = objective_per_round(np.vstack(ratios), weights(problem, objective), objective)
    med, lo, hi = median_ci(per_round, cfg.bootstrap_resamples)
    lo, hi = widen(med, lo, hi, sigma)
    fracs = [s.roofline_fraction for s in shapes if s.roofline_fraction]
    faster = lo > 1.0 + cfg.min_effect and not (objective == "weighted" and slower)
    what = {"weighted": "weighted", "geomean": "geomean", "worst": "worst shape"}[objective]
    detail = (f"{med:.3f}x the baseline [{lo:.3f}, {hi:.3f}] ({what} over {len(shapes)} shapes, "
              f"{len(clean)} clean interleaved rounds{f' of {log.run}' if log.run > len(clean) else ''}); "
              f"{geomean([s.vs_reference for s in shapes]):.2f}x the eager reference")
    flags = []
    if slower:
        text = "significantly slower on " + "; ".join(slower)
        if objective == "weighted":
            detail += f"; {text}: not faster where it matters"
        else:
            flags.append(text)
    if not faster and lo <= 1.0 + cfg.min_effect:
        detail += f"; needs CI low > {1 + cfg.min_effect:.2f}"
    if by_dispatch:
        flags.append("faster than torch only by its Python dispatch on " + ", ".join(by_dispatch))
        evidence["wins_by_dispatch"] = by_dispatch
    if log.disturbed:
        flags.append(f"{log.disturbed} of {log.run} rounds disturbed by other work, not counted")
    if slower:
        evidence["slower_shapes"] = slower
    if beyond:
        evidence["beyond the measured roof"] = beyond
    baseline = ", ".join(sorted({_yardstick_label(s, baseline_label) for s in setups}))
    return Verdict(Outcome.FASTER if faster else Outcome.NOT_FASTER, detail, "measure", speedup=med,
                   ci_low=lo, ci_high=hi, vs_reference=geomean([s.vs_reference for s in shapes]),
                   roofline_fraction=geomean(fracs) if fracs else None, baseline=baseline,
                   shapes=shapes, flags=flags, evidence=evidence)


def _shape(problem: Problem, s: dict, clean, roofs: dict | None, cfg, sigma: float):
    """One workload shape over the clean rounds: its ``ShapeTiming``, the per-round speedups, and
    what it says against the verdict (significantly slower; faster only by torch's dispatch;
    beyond the measured roof), each None if not."""
    c = np.array(s["times"]["candidate"])[clean]
    b = yardstick_times(s)[clean]
    ref = np.array(s["times"]["reference"])
    med, lo, hi = median_ci(b / c, cfg.bootstrap_resamples)
    lo, hi = widen(med, lo, hi, sigma)
    label = problem.shape_label(s["shape"])
    slower = f"{label}: {med:.2f}x [{lo:.2f}, {hi:.2f}]" if hi < 1.0 else None
    by_dispatch = None
    if any(s["dispatch"].values()) and lo > 1.0 + cfg.min_effect:
        free = yardstick_times(s, dispatch_free=True)[clean] / c
        if float(np.median(free)) <= 1.0 + cfg.min_effect:
            by_dispatch = f"{label} ({float(np.median(free)):.2f}x without dispatch)"
    frac = beyond = None
    if roofs is not None:
        rl = problem.roofline(s["shape"])
        frac = fraction(roofs, rl.bytes, rl.flops, float(np.median(c)) * 1e-9)
        if frac is None:  # faster than the roof allows: the roof, not the kernel, is wrong
            beyond = label
        else:
            frac = min(frac, 1.0)
    timing = ShapeTiming(
        shape=dict(s["shape"]), candidate_us=float(np.median(c)) / 1e3,
        baseline_us=float(np.median(b)) / 1e3, reference_us=float(np.median(ref)) / 1e3,
        speedup=med, ci_low=lo, ci_high=hi, vs_reference=float(np.median(ref) / np.median(c)),
        roofline_fraction=frac)
    return timing, b / c, (slower, by_dispatch, beyond)


def yardstick_times(s: dict, dispatch_free: bool = False) -> np.ndarray:
    """The yardstick's time in each round: the fastest, in that round, of the chosen baseline, the
    same baseline on one thread where it runs on several (``rounds.SINGLE``) and its rivals
    (``rounds.RIVAL``, ``baselines.rivals``). A team of threads that stalls waiting for one of its
    own (measured on a 2-vCPU VM: the engine's RMSNorm at 2 threads took 3 us per call in some
    rounds and 2-8 ms in others, all CPUs idle meanwhile), or a contender chosen from a few warm
    samples that is the slower one once the inputs rotate, would otherwise be a yardstick slower
    than what the user has. ``dispatch_free``: each Python-called runner less what one call costs
    a Python caller (``s["dispatch"]``; at least a tenth of its time stays)."""
    rows = []
    for name in yardsticks(s):
        t = np.array(s["times"][name], dtype=float)
        d = s["dispatch"].get(name)
        rows.append(np.maximum(t - d, 0.1 * t) if dispatch_free and d else t)
    return np.min(np.vstack(rows), axis=0)


def single_thread_rounds(s: dict) -> int:
    """Rounds in which the one-thread runner was the faster yardstick (0 without one)."""
    one = s["times"].get(SINGLE)
    return int(sum(a < b for a, b in zip(one, s["times"]["baseline"]))) if one else 0


def yardstick_wins(s: dict, clean: list[int], label) -> dict[str, int]:
    """Per runner (by ``label`` of its settings), the clean rounds in which it was the yardstick."""
    names = yardsticks(s)
    runners = s.get("runners") or {}
    times = np.vstack([np.array(s["times"][n], dtype=float)[clean] for n in names])
    wins = np.bincount(np.argmin(times, axis=0), minlength=len(names))
    out: dict[str, int] = {}
    for n, k in zip(names, wins):
        what = label(runners[n]) if n in runners else (label(s["choice"]) if n == "baseline" else n)
        out[what] = out.get(what, 0) + int(k)
    return out


def between_spread(store, problem: Problem) -> dict:
    """How much one kernel's log speedup moves between evaluations on this machine, beyond what
    the rounds of one evaluation show: the pooled standard deviation of the log speedups of every
    candidate of ``problem`` measured more than once here (this version of the problem, not on a
    busy machine), never below ``BETWEEN_FLOOR``; the floor alone until ``BETWEEN_MIN_DOF``
    degrees of freedom are known. Minutes apart on a quiet 2-core machine the same template
    measured 32.2x, 19.8x and 17.3x (rmsnorm), 1.59x, 1.44x and 1.32x (softmax), each interval
    from its own rounds a few percent wide (benchmarks/noise.py)."""
    from swarmfactory.evidence.quality import busy

    if store is None:
        return {"sigma": BETWEEN_FLOOR, "source": "default (no store)"}
    logs: dict[str, list[float]] = {}
    for e in store.measured_figures(problem):
        if e.speedup and e.speedup > 0 and not busy(e.contention):
            logs.setdefault(e.candidate_id, []).append(math.log(e.speedup))
    ss = dof = 0.0
    for xs in logs.values():
        if len(xs) > 1:
            m = sum(xs) / len(xs)
            ss += sum((x - m) ** 2 for x in xs)
            dof += len(xs) - 1
    if dof < BETWEEN_MIN_DOF:
        return {"sigma": BETWEEN_FLOOR, "source": f"default ({int(dof)} repeat(s) here so far)"}
    pooled = math.sqrt(ss / dof)
    return {"sigma": round(max(BETWEEN_FLOOR, pooled), 4),
            "source": f"{int(dof)} repeats of {sum(len(x) > 1 for x in logs.values())} candidates here "
                      f"(pooled {pooled:.3f})"}


@dataclass
class Pooled:
    """Independent evaluations of one kernel, combined (``pool``): ``k`` of them, the geometric
    mean of their figures ``speedup`` and its interval, the between-evaluation spread used
    (``sigma``), the shapes whose pooled interval lies below 1 (``slower``), and what the interval
    must clear (``bar``)."""

    k: int
    speedup: float
    ci_low: float
    ci_high: float
    sigma: float
    bar: float
    slower: list[str] = field(default_factory=list)

    @property
    def clears(self) -> bool:
        """Faster by the verdict's rule: the interval above the bar, no shape significantly slower."""
        return self.ci_low > self.bar and not self.slower

    def text(self) -> str:
        return (f"{self.speedup:.2f}x [{self.ci_low:.2f}, {self.ci_high:.2f}] pooled over {self.k} clean "
                f"measurements (between-evaluation spread {self.sigma:.3f})"
                + (f"; slower on {', '.join(self.slower)}" if self.slower else ""))


def _pooled_interval(figures: list[tuple[float, float, float, float]], sigma_floor: float, z: float = Z95):
    """``figures``: (median, lo, hi, sigma added) per evaluation. Returns (geometric mean, lo, hi,
    sigma used): the mean log figure, its standard error the evaluations' own (within) widths over
    k plus the between spread over sqrt(k); that spread is the largest of the floor, the sigmas
    the evaluations were widened by, and the standard deviation of the figures themselves."""
    logs = [math.log(m) for m, _, _, _ in figures]
    k = len(logs)
    mean = sum(logs) / k
    sigma = max([sigma_floor] + [s for *_, s in figures])
    if k > 1:
        sigma = max(sigma, math.sqrt(sum((x - mean) ** 2 for x in logs) / (k - 1)))
    within_lo = within_hi = 0.0
    for (m, lo, hi, s), lm in zip(figures, logs):
        lo, hi = lo if lo and lo > 0 else m, hi if hi and hi > 0 else m
        b = (z * s) ** 2
        within_lo += max((lm - math.log(lo)) ** 2 - b, 0.0) / z ** 2
        within_hi += max((math.log(hi) - lm) ** 2 - b, 0.0) / z ** 2
    se_lo = math.sqrt(within_lo / k ** 2 + sigma ** 2 / k)
    se_hi = math.sqrt(within_hi / k ** 2 + sigma ** 2 / k)
    return math.exp(mean), math.exp(mean - z * se_lo), math.exp(mean + z * se_hi), sigma


def pool(evaluations: list, extra: int = 0) -> Pooled | None:
    """Independent clean measurements (``faster``/``not_faster`` evaluation rows, not busy, of one
    kernel, problem version and machine, all with the objective of the last) combined: the
    interval of their mean log speedup. Each evaluation's interval already holds the
    between-evaluation spread it was widened by (``evidence["between"]``); that part is taken out
    and added back once over k (a random-effects mean), never below ``BETWEEN_FLOOR`` nor below
    the spread of these figures. Per shape the same: a shape whose pooled interval lies below 1 is
    ``slower`` (under the weighted objective, as in ``decide``). ``extra``: as if that many more
    evaluations had measured the same mean (what one more re-measure could show). None with no
    figure."""
    rows = [e for e in evaluations if e.speedup and e.speedup > 0]
    if not rows:
        return None
    last = rows[-1].evidence or {}
    objective = last.get("objective", "weighted")
    rows = [e for e in rows if (e.evidence or {}).get("objective", "weighted") == objective]
    bar = float(last.get("bar") or 1.0 + MIN_EFFECT)

    def sigma_of(e) -> float:
        return float(((e.evidence or {}).get("between") or {}).get("sigma") or 0.0)

    figures = [(e.speedup, e.ci_low, e.ci_high, sigma_of(e)) for e in rows]
    med, lo, hi, sigma = _pooled_interval(figures + _repeat_mean(figures, extra), BETWEEN_FLOOR)
    slower = []
    if objective == "weighted":
        by_shape: dict[str, list] = {}
        for e in rows:
            s_sigma = sigma_of(e)
            for sh in e.shapes or []:
                if sh.get("speedup") and sh["speedup"] > 0:
                    key = json.dumps(sh.get("shape"), sort_keys=True)
                    by_shape.setdefault(key, []).append((sh["speedup"], sh.get("ci_low"), sh.get("ci_high"), s_sigma))
        for key, figs in by_shape.items():
            m, _, h, _ = _pooled_interval(figs, BETWEEN_FLOOR)
            if h < 1.0:
                slower.append(f"{key}: {m:.2f}x")
    return Pooled(len(rows) + max(extra, 0), med, lo, hi, sigma, bar, slower)


def _repeat_mean(figures: list, extra: int) -> list:
    """``extra`` figures at the geometric mean of ``figures``, each as wide as their mean width."""
    if extra <= 0:
        return []
    k = len(figures)
    g = math.exp(sum(math.log(m) for m, *_ in figures) / k)
    r_lo = math.exp(sum(math.log(m / lo) if lo and lo > 0 else 0.0 for m, lo, _, _ in figures) / k)
    r_hi = math.exp(sum(math.log(hi / m) if hi and hi > 0 else 0.0 for m, _, hi, _ in figures) / k)
    s = max(s for *_, s in figures)
    return [(g, g / r_lo, g * r_hi, s)] * extra


def min_clean_rounds(rounds: int) -> int:
    """Clean rounds a figure needs: half the planned ones, at least 3."""
    return max(3, -(-rounds // 2))


def objective_per_round(ratios: np.ndarray, w: np.ndarray, objective: str) -> np.ndarray:
    """One objective value per round from the (shapes x rounds) ratios."""
    if objective == "worst":
        return ratios.min(axis=0)
    return np.exp((w[:, None] * np.log(ratios)).sum(axis=0))


def contention_evidence(log: RoundsLog) -> dict:
    """What the evidence keeps of the contention a measurement was taken under."""
    clean = bool(log.clean)  # the figure's rounds; with none, every round's
    # the waits other processes caused (a contender's own threads waiting for each other is not contention)
    suffered = max(log.mean("candidate", clean_only=clean, theirs=True),
                   log.mean("baseline", clean_only=clean, theirs=True))
    own = max(log.mean("candidate", clean_only=clean), log.mean("baseline", clean_only=clean))
    return {"suffered": round(suffered, 4), "worst": round(max(log.worst("candidate"), log.worst("baseline")), 4),
            "rounds": log.run, "disturbed_rounds": log.disturbed, "waited_s": round(log.waited_s, 1),
            "source": log.source, "busy": len(log.clean) < min_clean_rounds(log.planned) or
            suffered > contention.BUSY, **log.machine,
            "waits_incl_own": round(own, 4),
            # per round: the share of its timed time the candidate and the baseline waited for a
            # CPU, and the share of the measurement CPUs other processes used
            "per_round": [[None if r.get(k) is None else round(r[k], 3) for k in ("candidate", "baseline")]
                          + [None if log.other(i) is None else round(log.other(i), 3)]
                          for i, r in enumerate(log.suffered)]}


def _yardstick_label(s: dict, baseline_label) -> str:
    """The chosen baseline's label, with its rivals' where they were timed beside it."""
    rivals = [baseline_label(r) for n, r in (s.get("runners") or {}).items() if n.startswith(RIVAL)]
    return " or ".join([baseline_label(s["choice"])] + rivals)


def basis(setups: list[dict], baseline_label) -> dict:
    """The comparison basis, stated."""
    dispatch = [d for s in setups for d in s["dispatch"].values() if d]

    def how(c: dict) -> str:
        return baseline_label(c) + (" (each input set's calls back to back)" if c.get("native")
                                    else " called from Python, each call's dispatch included")

    labels = {how(s["choice"])
              + (", in each round the faster of it and the same on 1 thread" if SINGLE in s["times"] else "")
              + "".join(f", or its rival {how(r)}" for n, r in (s.get("runners") or {}).items() if n.startswith(RIVAL))
              + (" (each round's yardstick: the fastest of them)" if any(n.startswith(RIVAL) for n in s["times"])
                 else "")
              for s in setups}
    return {"candidate": "calls inside the driver's C loop (inputs changed before every call)",
            "baseline": "; ".join(sorted(labels)),
            "dispatch_us": round(min(dispatch) / 1e3, 3) if dispatch else None}
