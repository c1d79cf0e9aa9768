"""Champion succession: when the validation set grows, re-verify; a champion that fails is
dethroned and the best candidate that passes today's cases takes its place."""

from __future__ import annotations


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
                         run_id: str | None = None, check_all: bool = False) -> dict:
    """``ranked``: (candidate id, best speedup), best first. Re-verifies in that order (all of them
    with ``check_all``, else up to the first that passes, the champion included); every failure
    is recorded (purpose ``reverify``). Returns {"rows", "champion", "change"}."""
    champ = store.champion(problem)
    champ_id = champ["candidate_id"] if champ else None
    order = ([(champ_id, champ["speedup"] or 0.0)] if champ_id else []) + [r for r in ranked if r[0] != champ_id]
    rows, first_pass = [], None
    for cid, speedup in order:
        cand = store.candidate(cid)
        prep = harness.prepare(problem, cand["source"], cases)
        row = {"candidate_id": cid, "agent": cand["agent"], "speedup": speedup,
               "passes": prep.rejected is None, "outcome": None, "detail": None}
        if prep.rejected is not None:
            verdict = harness.rejected_verdict(prep)
            store.record_verdict(problem, cand, verdict, run_id, vversion, "reverify")
            row.update(outcome=verdict.outcome.value, detail=verdict.detail)
        elif first_pass is None:
            first_pass = row
        rows.append(row)
        if first_pass is not None and not check_all:
            break
    change = None
    if champ_id and not rows[0]["passes"]:
        store.set_champion(problem, None, None, None, run_id,
                           f"dethroned {champ_id}: {rows[0]['outcome']} on validation set {vversion}")
        change = f"champion {champ_id} dethroned"
        if first_pass:
            store.set_champion(problem, first_pass["candidate_id"], None, first_pass["speedup"], run_id,
                               f"replaces dethroned {champ_id}: passes validation set {vversion}")
            change += f"; {first_pass['candidate_id']} ({first_pass['speedup']:.2f}x) takes its place"
    current = store.champion(problem)
    return {"rows": rows, "champion": current["candidate_id"] if current else None, "change": change}
