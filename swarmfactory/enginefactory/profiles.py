"""Profiles: the best verified engine design per model file and machine.

A profile is the champion of an engine problem (``engine:<model>``) in the evidence store, with
the evaluation that made it champion: ``Store.profiles`` reads them as rows (``evidence.rows.Profile``)
keyed by the model file's sha256, the CPU (model, features as masked, cores: the store's hardware
id) and the torch and C compiler versions it was tuned and verified with. One applies where those
are this model file's, machine's and toolchain's and its figures were not measured on a busy
machine (``evidence/quality.py``; not recorded counts as not busy), and its pinned kernels still
pass here. ``engine serve`` serves the most recent matching profile and says which; when the only
profiles are for another model, CPU or toolchain it says that and keeps the calibrated defaults.
A design that has not passed on this machine is never served from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from swarmfactory.evidence import rows


@dataclass(frozen=True, slots=True)
class Profile(rows.Profile):
    """A profile row with what only the engine factory can check: the kernels its design pins."""

    def pinned_kernels(self) -> dict[str, str]:
        """problem -> candidate id of the kernel-factory kernels this design runs (its linear ops'
        ``champion:q4_1_matmul@ID``, its native decoder's ``champion:q4_1_packed_matvec@ID``)."""
        import yaml

        from swarmfactory.engine.config import EngineConfig

        from .design import pins

        return pins(EngineConfig.from_dict(yaml.safe_load(self.config_yaml) or {}))

    def kernel_check(self, store) -> tuple[str | None, str | None]:
        """(why the profile may not be served here, a note) about its design and pinned kernels: a
        design this engine's config no longer reads, or a kernel that no longer passes the harness
        here (or was confirmed on a busy machine), blocks it; a kernel champion that has moved on
        since is a note (the profile still runs the kernel it was verified with; ``engine tune``
        verifies and measures the same design on the new champion)."""
        import yaml

        from swarmfactory.champions import current, refusal
        from swarmfactory.problems import load_problem

        try:
            pinned = self.pinned_kernels()
        except (ValueError, yaml.YAMLError) as e:  # recorded by an older engine: skipped, never a crash
            return f"has a design this engine no longer reads ({str(e).splitlines()[0]})", None
        notes = []
        for name, pin in sorted(pinned.items()):
            why = refusal(store, load_problem(name), pin)
            if why:
                return f"runs champion:{name}@{pin}: {why}", None
            now = current(store, name)
            if now != pin:
                notes.append(f"its {name} kernel {pin[:12]} is no longer the champion here "
                             f"({'now ' + now[:12] if now else 'none now'}; swarmfactory engine tune re-verifies)")
        return None, "; ".join(notes) or None


def all_profiles(store, model_sha256: str | None = None) -> list[Profile]:
    """Every engine profile in the store (of the model file ``model_sha256`` where given), on any
    hardware, newest first (``Store.profiles``)."""
    return [Profile(**row.as_dict()) for row in store.profiles(model_sha256=model_sha256)]


def current_tools() -> dict:
    from swarmfactory.tools import tool_versions

    return tool_versions()


def choose(store, model_path: Path) -> tuple[Profile | None, str]:
    """The profile ``engine serve`` should use for ``model_path`` here, and a line saying why."""
    from .verify import model_digest

    digest = model_digest(model_path)
    tools = current_tools()
    hw = store.hardware["id"]
    reasons = []
    for p in all_profiles(store, digest):  # another model file's never applies, nor says why not
        why = p.mismatch(digest, hw, tools)
        note = None
        if why is None:
            why, note = p.kernel_check(store)
        if why is None:
            return p, (f"profile {p.id[:12]} (engine tune run {p.run_id}, {p.speedup or 1:.2f}x the default design "
                       f"there): {p.description}" + (f" - note: {note}" if note else ""))
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
