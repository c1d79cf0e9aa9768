"""What the knob agents search: a space of knob settings, each rendered into the thing evaluated.

A kernel ``Problem`` (spec.py) is one: its knobs are its template's, a setting renders to C (or
Triton) source. The engine factory's designs are another (``enginefactory/space.py``): the knobs
are declared on ``EngineConfig``'s fields and a setting renders to an engine design. The knob,
crossover, random-restart and model-guided agents (``agents/``) read only this protocol, so they
propose for either factory, and the evidence store keys what they find by ``name`` and
``spec_hash()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class SearchSpace(Protocol[T_co]):
    """A named space of knob settings and what each renders to.

    - ``name``, ``spec_hash()``: what the store keys the space's evidence by (a new hash: the
      evidence of the old one does not apply).
    - ``knobs``: knob -> its allowed values, in order; ``knob_defaults``: the setting a search
      starts from (one of those values per knob).
    - ``knob_aspects``: knob -> the aspect the knob agents move it along (``agents/knobs.py``
      ``ASPECTS``).
    - ``valid_knobs(setting)``: whether a setting may be proposed at all (beyond its values being
      allowed: a constraint between knobs).
    - ``render(setting)``: the thing evaluated for a valid setting, the defaults filling the knobs
      it leaves out.
    """

    name: str
    knobs: Mapping[str, Sequence[Any]]
    knob_defaults: Mapping[str, Any]
    knob_aspects: Mapping[str, str]

    def spec_hash(self) -> str: ...

    def valid_knobs(self, knobs: Mapping[str, Any]) -> bool: ...

    def render(self, knobs: Mapping[str, Any] | None = None) -> T_co: ...
