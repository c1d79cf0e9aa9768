"""Profiles: the best verified engine design per model file and machine.

A profile is the champion of an engine problem (``engine:<model>``) in the evidence store, with
the evaluation that made it champion. It matches when the model file's sha256, the CPU (model,
features as masked, cores: the store's hardware id) and the torch and C compiler versions are the
ones it was tuned and verified with, and its figures were not measured on a busy machine
(``evidence/quality.py``; not recorded counts as not busy). ``engine serve`` serves the most
recent matching profile and says which; when the only profiles are for another model, CPU or
toolchain it says that and keeps the calibrated defaults. A design that has not passed on this machine is never served from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TOOL_KEYS = ("torch", "cc_version")


@dataclass
class Profile:
    id: str                 # the design's content hash
    problem: str
    run_id: str | None
    created_at: object
    speedup: float | None   # fitness over the default design's, in the run that tuned it
    reason: str
    config_yaml: str
    knobs: dict
    hardware_id: str
    hardware: dict
    tools: dict
    model_sha256: str
    serving: dict
    description: str
    contention: dict | None = None   # what its serving figures were measured under (None: not recorded)

    def mismatch(self, model_sha256: str, hardware_id: str, tools: dict) -> str | None:
        """Why this profile does not apply here, or None."""
        from swarmfactory.evidence.quality import busy, describe

        if busy(self.contention):
            return (f"its serving figures were measured on a busy machine ({describe(self.contention)}): "
                    "swarmfactory engine tune again on a quieter machine")
        if self.model_sha256 != model_sha256:
            return "tuned for another model file"
        if self.hardware_id != hardware_id:
            return f"tuned on another CPU ({self.hardware.get('model', '?')}, {self.hardware.get('cpus', '?')} CPUs)"
        for k in TOOL_KEYS:
            if self.tools.get(k) != tools.get(k):
                return f"tuned with {k} {self.tools.get(k)} (now {tools.get(k)})"
        return None

    def pinned_kernels(self) -> dict[str, str]:
        """problem -> candidate id of the kernel-factory kernels this design runs (its linear ops'
        ``champion:q4_1_matmul@ID``, its native decoder's ``champion:q4_1_packed_matvec@ID``)."""
        import yaml

        from swarmfactory.engine.config import EngineConfig

        from .design import pins

        return pins(EngineConfig.from_dict(yaml.safe_load(self.config_yaml) or {}))

    def kernel_check(self, store) -> tuple[str | None, str | None]:
        """(why the profile may not be served here, a note) about its pinned kernels: a kernel
        that no longer passes the harness here (or was confirmed on a busy machine) blocks it; a
        kernel champion that has moved on
        since is a note (the profile still runs the kernel it was verified with; ``engine tune``
        verifies and measures the same design on the new champion)."""
        from swarmfactory.engine.native_seam import current_champion, passed_here
        from swarmfactory.problems import load_problem

        notes = []
        for name, pin in sorted(self.pinned_kernels().items()):
            why = passed_here(store, load_problem(name), pin)
            if why:
                return f"runs champion:{name}@{pin}: {why}", None
            now = current_champion(name, store)
            if now != pin:
                notes.append(f"its {name} kernel {pin[:12]} is no longer the champion here "
                             f"({'now ' + now[:12] if now else 'none now'}; swarmfactory engine tune re-verifies)")
        return None, "; ".join(notes) or None


def all_profiles(store) -> list[Profile]:
    """Every engine profile in the store, on any hardware, newest first (one per problem, spec
    and hardware: the latest champion row)."""
    from sqlalchemy import select

    from swarmfactory.evidence import quality
    from swarmfactory.evidence import schema as S

    rows = store._rows(select(S.champions).where(S.champions.c.problem.like("engine:%"))
                       .order_by(S.champions.c.id.desc()))
    seen, out = set(), []
    for row in rows:
        key = (row["problem"], row["problem_spec"], row["hardware_id"])
        if key in seen or not row["candidate_id"]:
            continue
        seen.add(key)
        ev = store.evaluation(row["evaluation_id"]) if row["evaluation_id"] else None
        cand = store.candidate(row["candidate_id"])
        if ev is None or cand is None or ev["outcome"] not in ("faster", "not_faster"):
            continue
        evidence = ev["evidence"] or {}
        out.append(Profile(id=cand["id"], problem=row["problem"], run_id=row["run_id"],
                           created_at=row["created_at"], speedup=row["speedup"], reason=row["reason"],
                           config_yaml=cand["source"], knobs=cand["knobs"] or {}, hardware_id=row["hardware_id"],
                           hardware=ev["hardware"] or {}, tools=ev["tools"] or {},
                           model_sha256=evidence.get("model_sha256", ""), serving=evidence.get("serving", {}),
                           description=evidence.get("design", ""), contention=quality.contention(evidence)))
    return out


def current_tools() -> dict:
    from swarmfactory.tools import tool_versions

    return tool_versions()


def choose(store, model_path: Path) -> tuple[Profile | None, str]:
    """The profile ``engine serve`` should use for ``model_path`` here, and a line saying why."""
    from .verify import model_digest

    digest = model_digest(model_path)
    profiles = all_profiles(store)
    tools = current_tools()
    hw = store.hardware["id"]
    reasons = []
    for p in profiles:
        why = p.mismatch(digest, hw, tools)
        note = None
        if why is None:
            why, note = p.kernel_check(store)
        if why is None:
            return p, (f"profile {p.id[:12]} (engine tune run {p.run_id}, {p.speedup or 1:.2f}x the default design "
                       f"there): {p.description}" + (f" - note: {note}" if note else ""))
        if p.model_sha256 == digest:
            reasons.append(f"profile {p.id[:12]} {why}")
    if reasons:
        return None, "no profile for this machine: " + "; ".join(reasons[:3]) + \
            " - calibrated defaults (swarmfactory engine tune makes one here)"
    return None, "no tuned profile for this model: calibrated defaults (swarmfactory engine tune makes one)"


def find(store, profile_id: str) -> Profile:
    matches = [p for p in all_profiles(store) if p.id.startswith(profile_id)]
    if not matches:
        raise LookupError(f"no engine profile {profile_id!r} in {store.shown} (list them: swarmfactory engine profiles)")
    if len({p.id for p in matches}) > 1:
        raise LookupError(f"profile id {profile_id!r} is ambiguous; give more characters")
    return matches[0]
