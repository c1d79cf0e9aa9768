"""The title: who is the champion of a problem on a machine, and why it still is.

One place decides it: ``contend``, called after every recorded evaluation, whichever path
recorded it (a run's search and re-measure, ``eval``, a re-verification, another coordinator on
the same hardware id writing to the same store). The champions table is append-only: every step
is a row with its reason, and the latest row is the title as it stands.

The rules (a measurement is *busy* by ``evidence.quality.busy``; unknown contention is not busy):

* A ``faster`` measurement, not busy, whose median speedup is above the champion's confirmed one
  (or with no champion) takes the title once a fresh re-measure (another process, another
  moment) says the same: ``faster``, not busy, above the held figure. The title then stands at
  the re-measure's figure. One measurement is not enough: between two processes minutes apart
  the same code moves by more than one evaluation's rounds show (the engine's own Q8_0 kernel,
  as the template's defaults, measured 1.26x [1.07, 1.50] of itself, then 0.95x [0.80, 1.11]).
  Without a re-measure to call (a caller that has no harness) one measurement decides, as before.
  An ``inconclusive`` or busy measurement never takes it.
* Independent measurements add up (``harness.verdicts.pool``): one evaluation carries the spread
  between evaluations whole (about +-17% on a quiet 2-core machine), so a kernel steadily 1.15x
  faster is ``not_faster`` in each. A clean ``not_faster`` measurement above the bar and the title
  whose pooled evidence, with one more measurement at the same mean, would clear the bar is
  *promising*: it is re-measured afresh, and takes the title if its clean measurements pooled
  clear the bar (interval above it, no shape slower) and the fresh re-measure alone is above the
  bar and the held figure (the measurement that selected it is the lucky one of many; the
  re-measure is not). At most ``POOL_MAX`` measurements of one candidate are spent this way. A
  later measurement of a candidate measured before (an ``eval`` of its source) is such a fresh
  one: above the bar and the title, with the pooled evidence clearing the bar, it takes the title.
* A measurement of the champion itself (a run's end re-measure; an ``eval`` of its source):
  ``faster`` and not busy *confirms* it at that figure, and so does a clean ``not_faster`` one
  above the bar while its clean measurements pooled still clear it; ``inconclusive``, ``verified``,
  ``needs_device`` or busy leaves the title, not confirmed (a row says so and since when it was
  last confirmed); anything else (``not_faster``, a rejection) demotes it at once, and the best
  retained candidates (by their best ``faster`` figure, not busy) are re-measured afresh, at most
  ``SUCCESSORS`` of them: the first ``faster`` one (not busy) takes the title, else there is none.
* Re-verification when the validation set grows: a champion that fails is dethroned and the same
  succession by fresh re-measure follows.

A champion's *confirmation* is its latest ``faster`` measurement that holds the title (the
evaluation that crowned it, or its latest confirming re-measure): when, and under what
contention, it was last shown to be faster (``confirmation``). The engine takes a champion only
if that was not busy (``busy_refusal``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from swarmfactory.contention import BUSY
from swarmfactory.evidence.quality import busy, describe
from swarmfactory.evidence.rows import CandidateRow, Champion, Evaluation
from swarmfactory.harness.verdicts import Pooled, pool
from swarmfactory.outcome import CORRECT, MEASURED, NO_CLAIM, Outcome

SUCCESSORS = 3   # retained candidates re-measured, best first, after a demotion
POOL_MAX = 4     # clean measurements of one candidate, at most, before a promising one is not re-measured

# A fresh re-measure of a recorded candidate: measures it (verifying it on today's cases first),
# records the verdict (purpose "remeasure") and returns the evaluation's id.
Remeasure = Callable[[CandidateRow], int]


@dataclass
class Decision:
    """What a call did to the title: ``change`` a line for the log (None: nothing changed
    hands), ``crowned`` the candidate that took the title from another (or from none)."""

    change: str | None = None
    crowned: str | None = None


def claims_title(ev: Evaluation) -> bool:
    """A measurement that may take (or confirm) the title: ``faster``, with a figure, not busy."""
    return ev.outcome == Outcome.FASTER and bool(ev.speedup) and not busy(ev.evidence)


def clean_measurement(ev: Evaluation | None) -> bool:
    """A figure that may be pooled: ``faster`` or ``not_faster``, with a figure, not busy."""
    return ev is not None and ev.outcome in MEASURED and bool(ev.speedup) and not busy(ev.evidence)


def measurements(store, problem, candidate_id: str) -> list[Evaluation]:
    """``candidate_id``'s clean measurements of this version of ``problem`` on the store's hardware."""
    spec = problem.spec_hash()
    return [e for e in store.evaluations(problem=problem.name, candidate_id=candidate_id, this_hardware=True)
            if e.problem_spec == spec and clean_measurement(e)]


def pooled(store, problem, candidate_id: str, extra: int = 0) -> Pooled | None:
    """``candidate_id``'s clean measurements here, pooled (``harness.verdicts.pool``); None with none."""
    return pool(measurements(store, problem, candidate_id), extra)


def promising(evs: list[Evaluation], ev: Evaluation, held: float | None) -> Pooled | None:
    """The pooled evidence (``evs``: the candidate's clean measurements, ``ev`` the latest) of a
    clean ``not_faster`` measurement worth a fresh re-measure (the rules above), else None."""
    if not clean_measurement(ev) or ev.outcome == Outcome.FASTER:
        return None
    now = pool(evs)
    if now is None or now.k >= POOL_MAX or ev.speedup <= max(held or 0.0, now.bar) or now.speedup <= (held or 0.0):
        return None
    ahead = pool(evs, extra=1)
    return now if ahead.clears else None


def speedup_text(ev: Evaluation) -> str:
    """``1.12x [0.95, 1.53]`` (the interval where there is one)."""
    ci = f" [{ev.ci_low:.2f}, {ev.ci_high:.2f}]" if ev.ci_low is not None and ev.ci_high is not None else ""
    return f"{ev.speedup:.2f}x{ci}"


def figure(ev: Evaluation) -> str:
    """``not_faster 1.12x [0.95, 1.53]``, ``inconclusive``, ``wrong: <detail>``."""
    if ev.speedup is not None:
        return f"{ev.outcome} {speedup_text(ev)}"
    if ev.outcome in CORRECT:
        return ev.outcome.value
    return f"{ev.outcome}: {str(ev.detail or '')[:200]}"


def _when(ev: Evaluation) -> str:
    t = ev.created_at
    return t.strftime("%Y-%m-%d %H:%M:%S UTC") if hasattr(t, "strftime") else str(t or "?")[:19]


def _by(ev: Evaluation) -> str:
    return "re-measure" if ev.purpose == "remeasure" else f"{ev.purpose} evaluation {ev.id}"


def contend(store, problem, evaluation_id: int, run_id: str | None = None,
            remeasure: Remeasure | None = None) -> Decision:
    """Let recorded evaluation ``evaluation_id`` compete for the title of ``problem`` on the
    store's hardware (the rules above). ``remeasure`` confirms a challenger before it is crowned
    and re-measures successors after a demotion (without it one measurement crowns, and a demoted
    champion has no successor). Evaluations of another problem version or another machine change
    nothing."""
    ev = store.evaluation(evaluation_id)
    if (ev is None or ev.problem != problem.name or ev.problem_spec != problem.spec_hash()
            or ev.hardware_id != store.hardware["id"]):
        return Decision()
    champ = store.champion(problem)
    cid = ev.candidate_id
    if champ is not None and champ.candidate_id == cid:
        return _judge_champion(store, problem, champ, ev, run_id, remeasure)
    held = (champ.speedup or 0.0) if champ else None
    cand = store.candidate(cid)
    before = f"{held:.2f}x" if held is not None else "none"
    by = f"{cand.agent}/{cand.operator}" if cand else "?/?"
    close = None
    if not claims_title(ev):
        # a later measurement of a candidate measured before is itself the fresh one
        evs = measurements(store, problem, cid) if clean_measurement(ev) else []
        both = pool(evs)
        if both is not None and both.k > 1 and both.clears and ev.speedup > max(both.bar, held or 0.0):
            reason = f"{ev.speedup:.2f}x > {before} by {by} ({_by(ev)}: {speedup_text(ev)}, and {both.text()}, " \
                     f"{describe(ev.evidence)})"
            store.set_champion(problem, cid, ev.id, ev.speedup, run_id, reason)
            return Decision(f"{cid} takes the title: {reason}", cid)
        close = promising(evs, ev, held) if remeasure is not None else None
        if close is None:
            return Decision()
    if held is not None and ev.speedup <= held:
        return Decision()
    if remeasure is None or cand is None:
        reason = f"{ev.speedup:.2f}x > {before} by {by} ({_by(ev)}, {describe(ev.evidence)})"
        store.set_champion(problem, cid, ev.id, ev.speedup, run_id, reason)
        return Decision(f"{cid} takes the title: {reason}", cid)
    again = store.evaluation(remeasure(cand))
    above = again is not None and clean_measurement(again) and (held is None or again.speedup > held)
    if above and claims_title(again):
        how = f"confirmed by a fresh re-measure: {speedup_text(again)}"
    else:
        both = pooled(store, problem, cid) if above else None
        if not (both is not None and both.clears and again.speedup > both.bar):
            said = f"; pooled {both.text()}" if both is not None else ""
            return Decision(f"{cid} not crowned: {speedup_text(ev)} at {_by(ev)}"
                            f"{' (promising: ' + close.text() + ')' if close else ''}, then "
                            f"{figure(again) if again else 'nothing'} at a fresh re-measure{said} (title {before})")
        how = f"a fresh re-measure {speedup_text(again)}, and {both.text()}"
    reason = (f"{again.speedup:.2f}x > {before} by {by} ({_by(ev)}: {speedup_text(ev)}; {how}, "
              f"{describe(again.evidence)})")
    store.set_champion(problem, cid, again.id, again.speedup, run_id, reason)
    return Decision(f"{cid} takes the title: {reason}", cid)


def _judge_champion(store, problem, champ: Champion, ev: Evaluation, run_id, remeasure) -> Decision:
    cid = ev.candidate_id
    if claims_title(ev):
        store.set_champion(problem, cid, ev.id, ev.speedup, run_id,
                           f"re-measured: {speedup_text(ev)}, confirmed ({_by(ev)}, {describe(ev.evidence)})")
        return Decision(f"champion {cid} confirmed: {figure(ev)}")
    both = pooled(store, problem, cid) if clean_measurement(ev) else None
    if both is not None and both.clears and ev.speedup > both.bar:
        store.set_champion(problem, cid, ev.id, ev.speedup, run_id,
                           f"re-measured: {speedup_text(ev)}, confirmed by {both.text()} ({_by(ev)}, "
                           f"{describe(ev.evidence)})")
        return Decision(f"champion {cid} confirmed: {figure(ev)}; {both.text()}")
    measured_busy = ev.outcome in MEASURED and busy(ev.evidence)
    if ev.outcome in NO_CLAIM or measured_busy:
        what = f"{ev.outcome} on a busy machine" if measured_busy else ev.outcome.value
        last = confirmation(store, problem, cid)
        since = (f"last confirmed {_when(last)} (evaluation {last.id}, {describe(last.evidence)})"
                 if last else "never confirmed by a measurement here")
        store.set_champion(problem, cid, champ.evaluation_id, champ.speedup, run_id,
                           f"re-measured: {what} ({describe(ev.evidence)}): title kept, not confirmed; {since}")
        return Decision(f"champion {cid} keeps the title, not confirmed: {what}; {since}")
    held = f"{champ.speedup:.2f}x" if champ.speedup else "?"
    store.set_champion(problem, None, ev.id, None, run_id,
                       f"demoted {cid} at {_by(ev)}: {figure(ev)} (held at {held})")
    return succeed(store, problem, remeasure, run_id, cid, f"champion {cid} demoted: {figure(ev)}")


def retained(store, problem) -> list[tuple[str, float]]:
    """Candidates that may succeed a demoted champion, best first, with their best ``faster``
    figure (not busy) here, or their pooled one: their latest evaluation here is correct, and
    their latest measurement (not busy) is ``faster``, or their clean measurements pooled clear
    the bar (``pool``; one a later measurement found not faster is not retried)."""
    spec = problem.spec_hash()
    latest: dict[str, Evaluation] = {}
    measured: dict[str, list[Evaluation]] = {}
    best: dict[str, float] = {}
    for e in store.evaluations(problem=problem.name, this_hardware=True):
        if e.problem_spec != spec:
            continue
        latest[e.candidate_id] = e
        if clean_measurement(e):
            measured.setdefault(e.candidate_id, []).append(e)
            if e.outcome == Outcome.FASTER:
                best[e.candidate_id] = max(best.get(e.candidate_id, 0.0), e.speedup)
    keep = []
    for cid, evs in measured.items():
        if latest[cid].outcome not in CORRECT:
            continue
        if evs[-1].outcome == Outcome.FASTER:
            keep.append((cid, best[cid]))
        elif len(evs) > 1 and evs[-1].speedup > (together := pool(evs)).bar and together.clears:
            keep.append((cid, together.speedup))
    return sorted(keep, key=lambda r: r[1], reverse=True)


def succeed(store, problem, remeasure: Remeasure | None, run_id, demoted: str, change: str) -> Decision:
    """After ``demoted`` lost the title: fresh re-measures of the best retained candidates, the
    first ``faster`` one (not busy) taking the title; each try is a champions row."""
    if remeasure is None:
        return Decision(f"{change}; no successor re-measured: no champion")
    tried = 0
    for cid, best in retained(store, problem):
        if cid == demoted:
            continue
        if tried >= SUCCESSORS:
            break
        cand = store.candidate(cid)
        if cand is None:
            continue
        tried += 1
        ev = store.evaluation(remeasure(cand))
        if ev is not None and claims_title(ev):
            reason = (f"replaces demoted {demoted}: re-measured {speedup_text(ev)} ({describe(ev.evidence)}); "
                      f"best before {best:.2f}x")
            store.set_champion(problem, cid, ev.id, ev.speedup, run_id, reason)
            return Decision(f"{change}; {cid} ({ev.speedup:.2f}x at a fresh re-measure) takes its place", cid)
        store.set_champion(problem, None, ev.id if ev else None, None, run_id,
                           f"successor {cid} not crowned: re-measured "
                           f"{figure(ev) if ev else 'nothing'}; best before {best:.2f}x")
    none = f"none of the next {tried} retained candidates passed a fresh re-measure" if tried else \
        "no retained candidate to re-measure"
    return Decision(f"{change}; {none}: no champion")


def confirmation(store, problem, candidate_id: str) -> Evaluation | None:
    """The evaluation that last confirmed ``candidate_id`` as champion of ``problem`` here: the
    ``faster`` evaluation of its latest champions row that names one; for rows that name none
    (stores from before), its latest ``faster`` evaluation here. None if it has none."""
    spec = problem.spec_hash()
    rows = [r for r in store.champion_history(problem.name)
            if r.problem_spec == spec and r.candidate_id == candidate_id]
    seen = set()
    for r in reversed(rows):
        eid = r.evaluation_id
        if not eid or eid in seen:
            continue
        seen.add(eid)
        ev = store.evaluation(eid)
        # a row naming its candidate names the measurement that crowned or confirmed it: ``faster``,
        # or (by the pooled rules) ``not_faster`` above the bar
        if ev is not None and ev.candidate_id == candidate_id and ev.outcome in MEASURED:
            return ev
    evs = [e for e in store.evaluations(problem=problem.name, candidate_id=candidate_id, this_hardware=True)
           if e.problem_spec == spec and e.outcome == Outcome.FASTER]
    return evs[-1] if evs else None


def busy_refusal(store, problem, candidate_id: str) -> str | None:
    """Why the engine may not take ``candidate_id`` as a champion of ``problem`` here, or None:
    its confirmation was measured on a busy machine."""
    ev = confirmation(store, problem, candidate_id)
    if ev is None or not busy(ev.evidence):
        return None
    return (f"candidate {candidate_id} of {problem.name} was last confirmed on a busy machine "
            f"({describe(ev.evidence)}; evaluation {ev.id}, {_when(ev)}): a champion is taken only when "
            f"confirmed with the timed code waiting for a CPU at most {BUSY:.0%} of the time; a re-measure "
            f"on a quieter machine confirms it (the end of `swarmfactory run --problems {problem.name}`)")


def rank_by_best(pairs) -> list[tuple[str, float]]:
    """(candidate id, speedup) pairs -> each candidate once with its best speedup, best first;
    pairs without a speedup are left out. The order in which retained candidates are re-verified
    and hunted."""
    best: dict[str, float] = {}
    for cid, speedup in pairs:
        if speedup:
            best[cid] = max(best.get(cid, 0.0), speedup)
    return sorted(best.items(), key=lambda r: r[1], reverse=True)


def reverify_and_succeed(store, harness, problem, cases, vversion: str, ranked: list[tuple[str, float]],
                         run_id: str | None = None, check_all: bool = False,
                         remeasure: Remeasure | None = None, fill_vacant: bool = False) -> dict:
    """``ranked``: (candidate id, best speedup), best first. Re-verifies in that order (all of them
    with ``check_all``, else up to the first that passes, the champion included); every failure
    is recorded (purpose ``reverify``). A champion that fails is dethroned and succeeded by fresh
    re-measure (``succeed``); with ``fill_vacant``, so is a title left vacant by an earlier
    demotion (the engine's audit dethrones without a successor). Returns {"rows", "champion",
    "change"}."""
    champ = store.champion(problem)
    champ_id = champ.candidate_id if champ else None
    order = ([(champ_id, champ.speedup or 0.0)] if champ_id else []) + [r for r in ranked if r[0] != champ_id]
    rows, first_pass = [], None
    for cid, speedup in order:
        cand = store.candidate(cid)
        prep = harness.prepare(problem, cand.source, cases, problem.backend_of(cand))
        row = {"candidate_id": cid, "agent": cand.agent, "speedup": speedup,
               "passes": prep.rejected is None, "outcome": None, "detail": None, "evaluation_id": None}
        if prep.rejected is not None:
            verdict = harness.rejected_verdict(prep)
            row["evaluation_id"] = store.record_verdict(problem, cand, verdict, run_id, vversion, "reverify")
            row.update(outcome=verdict.outcome.value, detail=verdict.detail)
        elif first_pass is None:
            first_pass = row
        rows.append(row)
        if first_pass is not None and not check_all:
            break
    change = None
    if champ_id and not rows[0]["passes"]:
        store.set_champion(problem, None, rows[0]["evaluation_id"], None, run_id,
                           f"dethroned {champ_id}: {rows[0]['outcome']} on validation set {vversion}")
        change = succeed(store, problem, remeasure, run_id, champ_id, f"champion {champ_id} dethroned").change
    elif champ_id is None and fill_vacant:
        history = [r for r in store.champion_history(problem.name) if r.problem_spec == problem.spec_hash()]
        last = next((r.candidate_id for r in reversed(history) if r.candidate_id), None)
        if last is not None:  # vacant since ``last`` lost it
            change = succeed(store, problem, remeasure, run_id, last, f"the title was vacant since {last} lost it").change
    current = store.champion(problem)
    return {"rows": rows, "champion": current.candidate_id if current else None, "change": change}
