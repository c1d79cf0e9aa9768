"""Agents by name: in-tree roles plus the ``swarmfactory.agents`` entry-point group."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from swarmfactory.agents.base import Agent, Board, Entry, Proposal
from swarmfactory.agents.knobs import ASPECTS

__all__ = ["Agent", "Board", "Entry", "Proposal", "make_agents", "agent_names", "AGENT_SETS"]

AGENT_SETS = {
    "default": ["seed", "knob-blocking", "knob-vectorisation", "knob-threading", "knob-unrolling",
                "knob-algorithm", "crossover", "model-guided", "hypothesis-test", "random-restart"],
}


# In-tree agents by name: "module:Class" plus constructor arguments (imported when asked for).
_IN_TREE: dict[str, tuple[str, tuple]] = {
    "seed": ("swarmfactory.agents.knobs:SeedAgent", ()),
    **{f"knob-{aspect}": ("swarmfactory.agents.knobs:KnobAgent", (aspect,))
       for aspect in ASPECTS},
    "crossover": ("swarmfactory.agents.crossover:CrossoverAgent", ()),
    "model-guided": ("swarmfactory.agents.model_guided:ModelGuidedAgent", ()),
    "hypothesis-test": ("swarmfactory.agents.hypothesis:HypothesisAgent", ()),
    "ranking-copy": ("swarmfactory.agents.ranking_copy:RankingCopyAgent", ()),
    "random-restart": ("swarmfactory.agents.knobs:RandomRestartAgent", ()),
}
BUILT_BY_COORDINATOR = ("adversary", "llm")  # the case hunter (not an agent) and the LLM agents (endpoints)


def agent_names() -> list[str]:
    return sorted(set(AGENT_SETS) | set(_IN_TREE) | {ep.name for ep in entry_points(group="swarmfactory.agents")}
                  | set(BUILT_BY_COORDINATOR))


def _make(name: str) -> Agent:
    if name in _IN_TREE:
        target, args = _IN_TREE[name]
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)(*args)
    eps = {ep.name: ep for ep in entry_points(group="swarmfactory.agents")}
    if name in eps:
        return eps[name].load()()
    raise ValueError(f"unknown agent {name!r}; known: {', '.join(agent_names())}")


def make_agents(spec: str | list[str]) -> list[Agent]:
    """``default``, agent names, or a comma-separated mix; duplicates removed, order kept."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    out, seen = [], set()
    for raw in (n.strip() for n in names):
        if not raw or raw in BUILT_BY_COORDINATOR:
            continue
        for name in AGENT_SETS.get(raw, [raw]):
            if name not in seen:
                seen.add(name)
                out.append(_make(name))
    return out
