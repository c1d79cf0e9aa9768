"""Agents by name: in-tree roles plus the ``swarmfactory.agents`` entry-point group."""

from __future__ import annotations

from importlib.metadata import entry_points

from swarmfactory.agents.base import Agent, Board, Entry, Proposal

__all__ = ["Agent", "Board", "Entry", "Proposal", "make_agents", "AGENT_SETS"]

AGENT_SETS = {
    "default": ["seed", "knob-blocking", "knob-vectorisation", "knob-threading", "knob-unrolling",
                "knob-algorithm", "crossover", "model-guided", "random-restart"],
}


def _make(name: str) -> Agent:
    from swarmfactory.agents.crossover import CrossoverAgent
    from swarmfactory.agents.knobs import ASPECTS, KnobAgent, RandomRestartAgent, SeedAgent
    from swarmfactory.agents.model_guided import ModelGuidedAgent

    if name == "seed":
        return SeedAgent()
    if name.startswith("knob-") and name[5:] in ASPECTS:
        return KnobAgent(name[5:])
    if name == "crossover":
        return CrossoverAgent()
    if name == "model-guided":
        return ModelGuidedAgent()
    if name == "random-restart":
        return RandomRestartAgent()
    eps = {ep.name: ep for ep in entry_points(group="swarmfactory.agents")}
    if name in eps:
        return eps[name].load()()
    known = sorted(set(AGENT_SETS) | set(AGENT_SETS["default"]) | set(eps) | {"adversary", "llm"})
    raise ValueError(f"unknown agent {name!r}; known: {', '.join(known)}")


def make_agents(spec: str | list[str]) -> list[Agent]:
    """``default``, agent names, or a comma-separated mix; duplicates removed, order kept."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    out, seen = [], set()
    for raw in (n.strip() for n in names):
        if not raw or raw in ("adversary", "llm"):  # built by the coordinator (cases; endpoints)
            continue
        for name in AGENT_SETS.get(raw, [raw]):
            if name not in seen:
                seen.add(name)
                out.append(_make(name))
    return out
