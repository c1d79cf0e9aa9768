"""Peak resident memory of a command's whole process tree, and of its largest process.

Runs the command, samples every process under it (children, their children, ... found through
/proc by parent pid) every ``--every`` seconds, and prints the peak of the tree's summed resident
memory, the peak of any single process (with its command line), and the most processes alive at
once. Memory is the proportional set size (PSS: a page shared by n processes counts 1/n in each,
so a forked child or workers sharing torch's libraries are not counted twice); where the kernel
does not give it, the resident size.

    .venv/bin/python benchmarks/memory.py [--every 0.5] [--json out.json] -- COMMAND ...

e.g. ``benchmarks/memory.py -- make demo``, ``benchmarks/memory.py -- .venv/bin/swarmfactory run
--problems all --budget 100 --store /tmp/m.db``, ``benchmarks/memory.py -- make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def _pss(pid: str) -> int:
    """Proportional set size: resident pages, a page shared by n processes counted 1/n in each
    (a forked child, or workers sharing a library, are not counted twice); resident size where
    the kernel does not give it."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, PSS bytes, short command) of every live process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X"):
                continue
            rss = _pss(entry)
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
            out[int(entry)] = (int(fields[1]), rss, cmd)
        except (OSError, IndexError, ValueError):
            continue
    return out


def tree(root: int, table: dict) -> list[int]:
    found, frontier = [root] if root in table else [], {root}
    while frontier:
        frontier = {p for p, (pp, _, _) in table.items() if pp in frontier and p not in found}
        found.extend(frontier)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=0.5)
    ap.add_argument("--json", default=None)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give a command after --")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    peak = {"tree_bytes": 0, "process_bytes": 0, "process": "", "processes": 0, "at_s": 0.0}
    try:
        while proc.poll() is None:
            table = _table()
            pids = tree(proc.pid, table)
            total = sum(table[p][1] for p in pids)
            if total > peak["tree_bytes"]:
                peak.update(tree_bytes=total, at_s=round(time.monotonic() - t0, 1),
                            at_peak=sorted(([round(table[p][1] / (1 << 20)), table[p][2]] for p in pids),
                                           reverse=True))
            for p in pids:
                if table[p][1] > peak["process_bytes"]:
                    peak.update(process_bytes=table[p][1], process=table[p][2])
            peak["processes"] = max(peak["processes"], len(pids))
            time.sleep(a.every)
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
    rc = proc.wait()
    peak.update(command=" ".join(cmd), exit_code=rc, seconds=round(time.monotonic() - t0, 1))
    gib = 1 << 30
    print(f"\n{peak['command']}: exit {rc} after {peak['seconds']:.0f} s\n"
          f"  peak of the whole tree: {peak['tree_bytes'] / gib:.2f} GiB (at {peak['at_s']:.0f} s)\n"
          f"  peak of one process:    {peak['process_bytes'] / gib:.2f} GiB ({peak['process']})\n"
          f"  most processes at once: {peak['processes']}\n"
          f"  at the peak (MiB):\n" + "".join(f"    {mib:6d}  {c}\n" for mib, c in peak.get("at_peak", [])[:12]),
          file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(peak, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
