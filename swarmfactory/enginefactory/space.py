"""The engine factory's problem and its design space: a search space like a kernel problem's.

``EngineSpace`` is what the evidence store keys an ``engine tune`` run's designs by (one model
file, one serving target: ``name``, ``spec_hash()``) and what the agents search
(``problems/space.py`` ``SearchSpace``): the knobs declared on ``EngineConfig`` (design.py
``knob_table``), those the deployment fixes (``--set``) narrowed to their one value, validity
(the engine accepts the design and it is batch invariant, ``design.batch_invariant``: the only
designs the tune measures besides the default) and render (a setting -> its ``Design``). So the knob,
crossover, random-restart and model-guided agents propose designs as they propose kernels;
``InvariantAgent`` adds the engine's own family, batch-invariant designs drawn at random.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from swarmfactory.agents.base import Agent, Board, Proposal, knob_proposal
from swarmfactory.agents.knobs import ASPECTS, MAX_TRIES
from swarmfactory.engine.config import ConfigError, EngineConfig
from swarmfactory.problems.spec import knob_key

from . import design as D

if TYPE_CHECKING:
    from .tune import TuneConfig


class EngineSpace:
    """Designs of one model file for one serving target (a ``SearchSpace`` of ``Design``\\ s).

    ``base``: the run's config (model, weights, max_seq_len) every design starts from;
    ``champions``: problem -> the kernel-factory champion a ``champion`` knob pins; ``fixed``:
    knob -> the value the deployment fixed."""

    version = 1
    c_signature = "engine design: an EngineConfig (YAML)"
    # what the cost model reads of a kernel problem (knowledge/costmodel.py): an engine design has no
    # C arguments, shapes or roofline, and its family keeps its evidence apart from the kernels'
    family = "engine"
    inputs = outputs = workload = ()
    roofline = None

    def __init__(self, model_path: Path, model_sha256: str, cfg: TuneConfig, base: EngineConfig,
                 champions: Mapping[str, str], fixed: Mapping[str, Any]):
        self.model_path, self.model_sha256, self.cfg = model_path, model_sha256, cfg
        self.base, self.champions, self.fixed = base, dict(champions), dict(fixed)
        self.name = f"engine:{model_path.stem}"
        self.description = (f"serving {model_path.name} ({cfg.weights}): output tok/s at concurrency "
                            f"{','.join(map(str, cfg.concurrency))}, workloads "
                            + ",".join(f"{i}x{o}" for i, o in cfg.workloads))
        self.table = D.knob_table(type(base))
        bad = {n: kf.knob.aspect for n, kf in self.table.items() if kf.knob.aspect not in ASPECTS}
        if bad:
            raise ValueError(f"design knob aspects {bad} are not among the knob agents' {', '.join(ASPECTS)}")
        self.knobs = {n: (self.fixed[n],) if n in self.fixed else kf.values for n, kf in self.table.items()}
        self.knob_defaults = {n: self.fixed.get(n, kf.default) for n, kf in self.table.items()}
        self.knob_aspects = {n: kf.knob.aspect for n, kf in self.table.items()}
        self._built: dict[str, D.Design | ConfigError] = {}

    def spec_hash(self) -> str:
        blob = json.dumps({"model": self.model_sha256, "weights": self.cfg.weights,
                           "concurrency": list(self.cfg.concurrency),
                           "workloads": [list(w) for w in self.cfg.workloads],
                           "ttft_p99_s": self.cfg.ttft_p99_s, "fixed": [list(f) for f in self.cfg.fixed]},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def build(self, knobs: Mapping[str, Any]) -> D.Design:
        """The design of ``knobs`` with the fixed knobs applied (design.py ``build``; ConfigError for
        a combination the engine refuses). Built once per setting: validity and render share it."""
        key = knob_key({**knobs, **self.fixed})
        if key not in self._built:
            try:
                self._built[key] = D.build({**knobs, **self.fixed}, self.base, self.champions)
            except ConfigError as e:
                self._built[key] = e
        out = self._built[key]
        if isinstance(out, ConfigError):
            raise out
        return out

    def valid_knobs(self, knobs: Mapping[str, Any]) -> bool:
        try:
            design = self.build(knobs)
        except ConfigError:
            return False
        return D.batch_invariant(design.knobs, self.base.weights)

    def render(self, knobs: Mapping[str, Any] | None = None) -> D.Design:
        return self.build(knobs or {})


class InvariantAgent(Agent):
    """Batch-invariant designs drawn at random (design.py ``make_invariant`` of a uniform draw):
    the only designs the tune measures, so the search reaches them however the other
    agents fare."""

    name = "invariant"

    def propose(self, board: Board, n: int = 1) -> list[Proposal]:
        rng, out = board.rng, []
        for _ in range(MAX_TRIES):
            if len(out) >= n:
                break
            knobs = D.make_invariant({k: rng.choice(list(v)) for k, v in board.problem.knobs.items()}, rng,
                                     board.problem.base.weights)
            prop = knob_proposal(board, knobs, self.name, "sample", [])
            if prop and all(prop.knobs != o.knobs for o in out):
                out.append(prop)
        return out
