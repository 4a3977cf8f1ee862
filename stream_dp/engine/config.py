"""The engine's configuration: a TOML file validated by pydantic.

Every field is explicit; an unknown or ill-typed field is an error that names it, so a typo can
never silently fall back to a default that changes the privacy guarantee.

Example (``deploy/engine.example.toml`` is a complete one)::

    [model]
    algorithm = "OnPairStrC"
    task = "auc"
    epsilon = 1.0
    delta = 1e-5
    alpha = 1.0
    buffer = 256

    [source]
    kind = "kafka"
    topic = "records"
    bootstrap_servers = "127.0.0.1:9092"
    group_id = "stream-dp"

    [releases]
    kind = "kafka"
    topic = "releases"
    bootstrap_servers = "127.0.0.1:9092"

    [dead_letters]
    kind = "kafka"
    topic = "records-dead"
    bootstrap_servers = "127.0.0.1:9092"

    [checkpoint]
    path = "state/model.ckpt"

"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "ConfigError",
    "ModelConfig",
    "SourceConfig",
    "SinkConfig",
    "CheckpointConfig",
    "StatusConfig",
    "EngineConfig",
    "load_config",
]


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid (the message names the field)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Security = dict[str, str | int | float | bool]


class ModelConfig(_Strict):
    """The learner. Only private learners can be run by the engine: it publishes what it learns."""

    algorithm: Literal["OnPairStrC", "OnPairC"] = "OnPairStrC"
    task: Literal["auc", "metric"] = "auc"
    epsilon: float = Field(1.0, gt=0, allow_inf_nan=False)
    delta: float = Field(1e-5, gt=0, lt=1)
    horizon: int | None = Field(None, gt=0)
    alpha: float | None = Field(None, gt=0, allow_inf_nan=False)
    data_radius: float = Field(1.0, gt=0, allow_inf_nan=False)
    model_radius: float = Field(1.0, gt=0, allow_inf_nan=False)
    buffer: int | str = 256
    conversion: Literal["tight", "paper"] = "tight"
    release_every: int = Field(1, ge=1)
    smoothing_window: int = Field(1, ge=1)
    predict_with: Literal["release", "smoothed"] = "release"
    warmup: int | None = Field(None, ge=1)
    sensitivity: Literal["certified", "paper"] = "certified"
    anytime_p: float = Field(1.1, gt=1)
    features: list[str] | None = None
    model_id: str = Field("stream-dp", min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    seed: int | None = Field(
        None,
        ge=0,
        description="Noise secret. Leave unset in production: drawn from the OS on the first "
        "start and kept in the checkpoint. A value needs reproducible = true.",
    )
    reproducible: bool = Field(
        False, description="Accept an explicit seed: the run and its releases are NOT private."
    )

    def learner_kwargs(self) -> dict[str, Any]:
        kw = self.model_dump(exclude={"algorithm"})
        if kw["features"] is not None:
            kw["features"] = tuple(kw["features"])
        if kw["alpha"] is None and self.algorithm == "OnPairStrC":
            kw.pop("alpha")  # the learner's documented default
        return kw


class SourceConfig(_Strict):
    kind: Literal["kafka", "jsonl", "csv"]
    path: str | None = None
    label_column: str | None = None
    feature_columns: list[str] | None = None
    topic: str | None = None
    bootstrap_servers: str | list[str] | None = None
    group_id: str | None = None
    partitions: list[int] | None = None
    max_idle_seconds: float | None = Field(
        None, gt=0, description="End the run after this long without a record (batch jobs)."
    )
    security: Security = Field(default_factory=dict)

    @model_validator(mode="after")
    def _needs(self) -> SourceConfig:
        if self.kind == "kafka":
            missing = [
                f for f in ("topic", "bootstrap_servers", "group_id") if not getattr(self, f)
            ]
            if missing:
                raise ValueError(f"a kafka source needs {', '.join(missing)}")
        elif not self.path:
            raise ValueError(f"a {self.kind} source needs path")
        if self.kind == "csv" and not self.label_column:
            raise ValueError("a csv source needs label_column")
        return self


class SinkConfig(_Strict):
    kind: Literal["kafka", "jsonl", "stdout"]
    path: str | None = None
    topic: str | None = None
    bootstrap_servers: str | list[str] | None = None
    security: Security = Field(default_factory=dict)

    @model_validator(mode="after")
    def _needs(self) -> SinkConfig:
        if self.kind == "kafka" and not (self.topic and self.bootstrap_servers):
            raise ValueError("a kafka sink needs topic and bootstrap_servers")
        if self.kind == "jsonl" and not self.path:
            raise ValueError("a jsonl sink needs path")
        return self


class CheckpointConfig(_Strict):
    path: str
    every_records: int = Field(1000, ge=1)
    every_seconds: float = Field(30.0, gt=0)
    ledger_journal: bool = Field(
        False,
        description="Keep the ledger's sealed chunks in an append-only, checksummed journal "
        "beside the checkpoint (<path>.ledger) instead of in memory and in every checkpoint: "
        "constant memory and O(1) checkpoints for streams that release at every record. A "
        "model that has a journal keeps it whatever this says.",
    )


class StatusConfig(_Strict):
    interval_seconds: float = Field(10.0, gt=0)
    file: str | None = None


class EngineConfig(_Strict):
    model: ModelConfig = Field(default_factory=ModelConfig)
    source: SourceConfig
    releases: SinkConfig
    dead_letters: SinkConfig
    checkpoint: CheckpointConfig
    status: StatusConfig = Field(default_factory=StatusConfig)
    max_message_bytes: int = Field(1_000_000, ge=1)


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}")
    return "\n".join(lines)


def load_config(path: str | Path) -> EngineConfig:
    """Read and validate a TOML config; raise :class:`ConfigError` naming each bad field."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    try:
        return EngineConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"invalid config {path}:\n{_describe(exc)}") from exc
