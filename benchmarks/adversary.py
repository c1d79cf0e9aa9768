"""How many wrong kernels the seed cases catch, and how many more the adversary agent finds.

Every kernel in tests/planted/<problem>/*.c is wrong on some shapes or value distributions; its
header says how (``/* planted: <kind> -- description */``). These were written next to the
hunter; tests/hostile/<problem>/*.c (``--dir tests/hostile``) were written independently of it
and of the seed validation set (``/* expect: wrong — description */``). For each one this script checks
whether the problem's bundled seed cases alone reject it (static checks, build, verification;
nothing is timed), and if they do not, lets ``Adversary`` hunt for a breaking case: up to
``--turns`` turns of ``--cases`` new cases each, stopping at the first turn that finds one.
"Cases run until caught" counts the adversary cases verified up to and including the first
failure (all of the earlier turns, then this turn's cases smallest first, as verification orders
them).

A found case is also run against the problem's default template kernel: a case that breaks the
template too is suspect (the case, not the planted bug, is what is wrong); it is listed after the
table and does not count as catching the bug.

    .venv/bin/python benchmarks/adversary.py [--dir tests/hostile] [--turns 5] [--cases 24] [--seed 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from swarmfactory.adversary import Adversary, case_from_key
from swarmfactory.harness.evaluate import Harness, HarnessConfig
from swarmfactory.harness.verify import order_cases
from swarmfactory.problems import load_problem

PLANTED = Path(__file__).resolve().parents[1] / "tests" / "planted"


def planted_kind(source: str) -> str:
    m = re.search(r"planted:\s*(.+?)\s+--", source) or re.search(r"expect:\s*\w+\s*[-\u2014]+\s*([^.;:\n*]{1,60})", source)
    return m.group(1).strip() if m else "?"


def hunt(harness: Harness, problem, name: str, source: str, turns: int, cases: int, seed: int) -> dict:
    """The adversary's turns against one kernel, until the first finding that is not suspect.

    A finding is suspect when the problem's default template kernel fails the same case: then
    the case (a distribution the tolerance was not made for, a shape the reference mishandles)
    is what is wrong, not the planted bug. Suspect findings are counted and the hunt goes on."""
    agent = Adversary(cases_per_turn=cases)
    rng = random.Random(seed)
    known = {c.key() for c in problem.seed_cases()}
    tried, suspect, template = 0, [], problem.render()
    for turn in range(1, turns + 1):
        before = set(known)
        findings = agent.hunt(harness, problem, [{"id": name, "source": source}], [], rng, known)
        proposed = order_cases([case_from_key(k) for k in known - before])  # propose_cases adds to `known`
        for f in findings:
            rej = harness.prepare(problem, template, [f.case]).rejected
            if rej is not None:
                suspect.append({"case": f.case.key(), "detail": f.detail, "template": rej.detail})
                continue
            # verification runs the cases smallest first and stops at the first failure
            ran = 1 + next(i for i, c in enumerate(proposed) if c.key() == f.case.key())
            return {"caught": True, "turns": turn, "tried": tried + ran, "case": f.case.key(),
                    "detail": f.detail, "findings": len(findings), "suspect": suspect}
        tried += len(proposed)
    return {"caught": False, "turns": turns, "tried": tried, "suspect": suspect}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=5, help="adversary turns per kernel (default 5)")
    ap.add_argument("--cases", type=int, default=24, help="cases per turn (default 24)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the adversary's random choices")
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this path")
    ap.add_argument("--dir", default=str(PLANTED), help="folder of <problem>/*.c wrong kernels "
                    "(default tests/planted; tests/hostile holds independently written ones)")
    args = ap.parse_args(argv)
    console = Console(width=220)
    kernels = sorted(Path(args.dir).glob("*/*.c"))
    if not kernels:
        console.print(f"no kernels under {args.dir}")
        return 1
    harness = Harness(HarnessConfig(compile_baselines=False))
    rows = []
    try:
        for path in kernels:
            problem = load_problem(path.parent.name)
            source = path.read_text()
            t0 = time.monotonic()
            prep = harness.prepare(problem, source)
            row = {"problem": problem.name, "kernel": path.stem, "kind": planted_kind(source),
                   "seed_cases": len(problem.seed_cases()), "by_seeds": prep.rejected is not None}
            if prep.rejected is not None:
                row.update(caught=True, turns=0, tried=0, case=prep.rejected.evidence.get("case"),
                           detail=f"{prep.rejected.outcome.value}: {prep.rejected.detail}")
            else:
                with console.status(f"{problem.name}/{path.stem}: adversary hunting..."):
                    row.update(hunt(harness, problem, path.stem, source, args.turns, args.cases, args.seed))
            row["seconds"] = time.monotonic() - t0
            rows.append(row)
    finally:
        harness.close()

    t = Table(title=f"wrong kernels in {args.dir}: seed cases vs seed + adversary ({args.turns} turns x {args.cases} cases, seed {args.seed})")
    for col in ("problem", "kernel", "planted kind", "caught by seeds", "caught by seeds+adversary",
                "cases run until caught", "first breaking case", "suspect findings", "s"):
        t.add_column(col, justify="right" if col in ("cases run until caught", "s") else "left")
    for r in rows:
        if r["by_seeds"]:
            tried = "0 (seed)"
        elif r["caught"]:
            tried = f"{r['tried']} (turn {r['turns']})"
        else:
            tried = f"- ({r['tried']} tried)"
        case = "-"
        if r.get("case"):
            c = json.loads(r["case"])
            order = list(load_problem(r["problem"]).workload[0])
            case = " ".join(f"{d}={c['shape'][d]}" for d in order) + f" {c['dist']}"
        t.add_row(r["problem"], r["kernel"], r["kind"], "yes" if r["by_seeds"] else "no",
                  "yes" if r["caught"] else "no", tried, case, str(len(r.get("suspect", []))),
                  f"{r['seconds']:.0f}")
    console.print(t)
    for r in rows:
        for sc in r.get("suspect", []):
            c = json.loads(sc["case"])
            console.print(f"suspect finding against {r['problem']}/{r['kernel']} on {c['shape']} {c['dist']}: "
                          f"the template kernel fails it too ({sc['template'][:160]})")
    n = len(rows)
    seeds = sum(r["by_seeds"] for r in rows)
    both = sum(r["caught"] for r in rows)
    suspect = sum(len(r.get("suspect", [])) for r in rows)
    console.print(f"seed cases alone: {seeds} of {n} planted bugs; seed + adversary: {both} of {n}"
                  + (f" (not counting {suspect} suspect findings that also break the template kernel)"
                     if suspect else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
