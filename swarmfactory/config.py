"""Typed run configuration: a frozen pydantic model, loadable from YAML, unknown keys rejected.

Command-line flags override file values. Environment: ``SWARMFACTORY_STORE`` sets the default
store; ``SWARMFACTORY_CACHE`` the build cache directory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class ConfigError(ValueError):
    """A run, engine or design config could not be built; the message says which key and why."""


def parse_duration(text: str | int | float | None) -> float | None:
    """'90s', '10m', '1.5h', '2h30m' or plain seconds -> seconds."""
    if text is None or text == "":
        return None
    if isinstance(text, (int, float)):
        return float(text)
    s = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", s)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != s.replace(" ", ""):
        raise ConfigError(f"bad duration {text!r}; use e.g. 90s, 10m, 1h")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    problems: list[str] = Field(default_factory=lambda: ["all"])
    agents: list[str] = Field(default_factory=lambda: ["default"])
    budget: int | None = Field(None, ge=1, description="evaluations (new measurements) in this run")
    time_s: float | None = Field(None, gt=0, description="wall-clock budget in seconds")
    parallel: int = Field(2, ge=1, le=64, description="evaluations in flight (one measures at a time)")
    rounds: int = Field(20, ge=3)
    min_effect: float = Field(0.03, ge=0)
    objective: Literal["weighted", "geomean", "worst"] = Field(
        "weighted", description="what `faster` means across the workload shapes (harness/verdicts.py)")
    compile_baselines: bool = True
    remeasure_champions: bool = True
    seed: int = 0
    llm: list[str] = Field(default_factory=list, description="endpoints: local, openai:MODEL, or a /v1 URL")
    llm_model: str | None = None
    llm_cost_cap: float = Field(5.0, ge=0, description="USD per paid endpoint per run (hard cap)")
    llm_concurrency: int = Field(1, ge=1, le=64)
    llm_timeout_s: float = Field(180.0, gt=0)
    llm_max_tokens: int = Field(1500, ge=16, description="completion tokens per request")
    executor: Literal["local", "ray"] = Field("local", description="where evaluations run")
    ray_address: str | None = Field(None, description="Ray cluster address (auto, HOST:PORT); "
                                                       "none: a local Ray cluster on this machine")
    ray_hardware: str | None = Field(None, description="hardware id of the Ray nodes to measure on "
                                                        "(default: the class of most nodes)")
    lease_s: float = Field(120.0, gt=0, description="seconds an evaluation's lease lives unless renewed")

    @field_validator("problems", "agents", "llm", mode="before")
    @classmethod
    def _split(cls, v):
        return [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else v

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> "RunConfig":
        import yaml

        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config {p} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config {p} must be a mapping of keys to values")
        if "time" in data:
            data["time_s"] = parse_duration(data.pop("time"))
        return cls.build(**{**data, **{k: v for k, v in overrides.items() if v is not None}})

    @classmethod
    def build(cls, **values) -> "RunConfig":
        try:
            return cls(**values)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(x) for x in first["loc"]) or "config"
            if first["type"] == "extra_forbidden":
                raise ConfigError(f"unknown config key {loc!r}; known: {', '.join(cls.model_fields)}") from None
            raise ConfigError(f"bad value for {loc!r}: {first['msg']}") from None
