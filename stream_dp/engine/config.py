"""The engine's configuration: a TOML file validated by pydantic.

Every field is explicit; an unknown or ill-typed field is an error that names it, so a typo can
never silently fall back to a default that changes the privacy guarantee. Relative paths
(checkpoint, status and file sources/sinks) are relative to the directory of the config file,
so a config and its state stay together wherever the engine is started from.

Example (``deploy/engine.example.toml`` is a complete one)::

    [model]
    algorithm = "OnPairStrC"
    task = "auc"
    epsilon = 1.0
    delta = 1e-5
    alpha = 1.0
    buffer = 256
    features = ["age", "income", "balance"]   # required: the schema is public and fixed

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

    [kafka]
    client = "kafka-python"                    # or "confluent-kafka" (the confluent extra)
    outage_deadline_seconds = 3600             # default: ride out outages of any length

"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from stream_dp.engine.learners import (
    DEFAULT_ALGORITHM,
    ENGINE_ALGORITHMS,
    model_section,
    model_sections,
)

__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "EngineConfig",
    "KafkaConfig",
    "MetricsConfig",
    "ModelConfig",
    "ScaleConfig",
    "check_model",
    "SinkConfig",
    "SourceConfig",
    "StatusConfig",
    "UnitsConfig",
    "load_config",
    "same_cluster",
]


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid (the message names the field)."""


class _Strict(BaseModel):
    # strict: a value of the wrong type is refused, never converted (``epsilon = "4.0"``,
    # ``every_records = true``): what the file says is what the engine runs.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


Security = dict[str, str | int | float | bool]


ModelConfig = model_sections()
"""The ``[model]`` section: the parameters of the learner named by ``algorithm`` (default
``"OnPairStrC"``), generated from its constructor (:mod:`stream_dp.engine.learners`)."""


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

    @field_validator("partitions")
    @classmethod
    def _check_partitions(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(p < 0 for p in value)):
            raise ValueError("partitions must be a non-empty list of partition numbers >= 0")
        return value

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
    max_request_size: int = Field(
        1_048_576,
        ge=1024,
        description="The producer's limit on one request (kafka-python's default, 1 MiB). "
        "The engine refuses a model whose releases could exceed it.",
    )

    @model_validator(mode="after")
    def _needs(self) -> SinkConfig:
        if self.kind == "kafka" and not (self.topic and self.bootstrap_servers):
            raise ValueError("a kafka sink needs topic and bootstrap_servers")
        if self.kind == "jsonl" and not self.path:
            raise ValueError("a jsonl sink needs path")
        return self


class CheckpointConfig(_Strict):
    """The commit cycle: releases become visible when the checkpoint that covers them is written.

    A cycle ends after ``every_records`` input messages, ``every_seconds`` seconds, as soon as
    the input is idle, or when the releases waiting for it reach ``max_pending_bytes``; the
    time a release waits for its cycle is its publication latency.
    """

    path: str
    every_records: int = Field(
        5000,
        ge=1,
        description="End the cycle after this many input messages. Each cycle costs a "
        "checkpoint and a Kafka transaction: 5,000 records are ~0.4 s at the engine's rate with "
        "a release per record, and ran 6-8 % faster than 1,000 (docs/performance.md).",
    )
    every_seconds: float = Field(5.0, gt=0)
    max_pending_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="End the cycle when the releases and dead letters waiting for it reach "
        "this size (they are kept in memory and in the checkpoint).",
    )
    ledger_journal: bool = Field(
        False,
        description="Keep the ledger's sealed chunks in an append-only, checksummed journal "
        "beside the checkpoint (<path>.ledger) instead of in memory and in every checkpoint: "
        "constant memory and O(1) checkpoints for streams that release at every record. A "
        "model that has a journal keeps it whatever this says.",
    )


class StatusConfig(_Strict):
    interval_seconds: float = Field(10.0, gt=0)
    file: str | None = Field(
        None, description="status.json (mode 0600): counters, budget, lag, idle and outage"
    )
    operator_raw_metrics: str | None = Field(
        None,
        description="A separate file (mode 0600) for statistics computed from raw records "
        "(the average penalty). Off by default: they are not differentially private.",
    )


class KafkaConfig(_Strict):
    """How the engine treats the Kafka cluster(s) it uses."""

    client: Literal["kafka-python", "confluent-kafka"] = Field(
        "kafka-python",
        description="The Kafka client every part of the engine talks to Kafka with: "
        '"kafka-python" (pure Python, a core dependency) or "confluent-kafka" (librdkafka, in '
        "C, the confluent extra: its per-message work is ~9 times cheaper, the engine ~1.4 times "
        "faster with a release per record). Same exactly-once "
        'contract and diagnostics on both (docs/performance.md, "Which client").',
    )

    startup_timeout_seconds: float = Field(
        20.0,
        gt=0,
        le=50,
        description="Bound on reaching each cluster at start: past it, the engine exits with a "
        "diagnosis (unreachable address, TLS/SASL mismatch).",
    )
    outage_deadline_seconds: float | None = Field(
        None,
        gt=0,
        description="Stop cleanly (exit code 4) when the broker has been unreachable this long. "
        "Default: ride out outages of any length.",
    )
    create_topics: bool = Field(
        True, description="Create missing release and dead-letter topics (1 partition)."
    )
    attempt_timeout_seconds: float = Field(
        60.0,
        ge=1,
        description="How long one attempt to publish a commit cycle (one Kafka transaction) may "
        "take before it is abandoned and retried with a new producer. Retries go on with "
        "capped backoff until kafka.outage_deadline_seconds (if set).",
    )

    @field_validator("client")
    @classmethod
    def _client_installed(cls, value: str) -> str:
        from connectors.clients import client

        try:
            client(value)
        except ImportError as err:
            if err.name != "confluent_kafka":
                raise
            raise ValueError(str(err)) from None
        return value


class MetricsConfig(_Strict):
    """The Prometheus endpoint (``docs/operations.md``, *Prometheus metrics*; the ``metrics``
    extra). Off unless ``prometheus_port`` is set.

    In per-partition scale-out the instance serves one endpoint for all its partition
    learners; instances on one machine need one port each (``stream-dp run --metrics-port``).
    """

    prometheus_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve /metrics on this TCP port (0: an ephemeral port, logged). Default: "
        "no endpoint. `stream-dp run --metrics-port` overrides it for one instance.",
    )
    host: str = Field(
        "127.0.0.1",
        min_length=1,
        description='Address to bind: "0.0.0.0" serves every interface (a scraper in another '
        "container or on another machine). The endpoint has no authentication.",
    )


class ScaleConfig(_Strict):
    """Scale-out on a Kafka consumer group (``docs/privacy.md``, "Scale-out").

    ``mode = "per-partition"`` runs one learner per input partition (model id
    ``<model_id>/p<k>``, its own noise key, ledger, checkpoint and transactional id); instances
    subscribe to the source's consumer group and Kafka assigns the partitions.
    """

    mode: Literal["single", "per-partition"] = "single"
    privacy_unit_key: bool = Field(
        False,
        description="The producer keys every record by the privacy unit (the person), so all "
        "of one person's records land in one partition and the partition learners compose in "
        "parallel (the guarantee is the maximum over partitions). Otherwise it is the sum.",
    )
    master_secret_file: str | None = Field(
        None,
        description="File holding the master secret (>= 128 random bits, hex; one that fails "
        "the weakness test is refused) from which every partition learner's noise secret and "
        "checkpoint key are derived. Required in per-partition mode unless the environment "
        "variable master_secret_env holds it.",
    )
    master_secret_env: str = Field("STREAM_DP_MASTER_SECRET", min_length=1)
    checkpoint_topic: str | None = Field(
        None,
        description="A compacted Kafka topic (on the release topic's cluster) that receives "
        "every partition learner's checkpoint, keyed by its model id, in the transaction that "
        "publishes the cycle; an instance on an empty state directory resumes from it. Its "
        "messages are sealed under keys derived from the master secret: without the master "
        "they show no record, noise state or model. Let only the instances write to it.",
    )
    status_topic: str | None = Field(
        None,
        description="Compacted Kafka topic (on the release topic's cluster; default "
        "<releases topic>.status, created at start) to which every instance publishes its "
        "status summary -- the content of its status file, no record value and no model -- at "
        "each status report: the heartbeats `stream-dp status` shows beside the consumer "
        "group's assignment.",
        min_length=1,
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="Consumer-group session timeout: how long a silent (killed) instance keeps "
        "its partitions before the group gives them to the others.",
    )


class UnitsConfig(_Strict):
    """Where a unit-level model (``[model] unit_key``) reads each record's privacy unit
    (``docs/units.md``)."""

    source: Literal["record", "message_key"] = Field(
        "record",
        description='"record": the record\'s top-level field named by model.unit_key; '
        '"message_key": the Kafka message key (model.unit_key then only names the unit).',
    )


class EngineConfig(_Strict):
    model: ModelConfig = Field(default_factory=lambda: model_section(DEFAULT_ALGORITHM)())
    source: SourceConfig
    releases: SinkConfig
    dead_letters: SinkConfig
    checkpoint: CheckpointConfig
    status: StatusConfig = Field(default_factory=StatusConfig)
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    units: UnitsConfig = Field(default_factory=UnitsConfig)
    max_message_bytes: int = Field(1_000_000, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _default_algorithm(cls, data: Any) -> Any:
        model = data.get("model") if isinstance(data, dict) else None
        if isinstance(model, dict) and "algorithm" not in model:
            data = {**data, "model": {**model, "algorithm": DEFAULT_ALGORITHM}}
        return data

    @model_validator(mode="after")
    def _engine_needs(self) -> EngineConfig:
        if self.model.features is None:
            raise ValueError(
                "model.features is required: the engine learns on a declared schema (a list "
                "of feature names), never on one taken from the data"
            )
        kafka_sinks = [s for s in (self.releases, self.dead_letters) if s.kind == "kafka"]
        if len(kafka_sinks) == 2 and _cluster(kafka_sinks[0]) != _cluster(kafka_sinks[1]):
            raise ValueError(
                "releases and dead_letters must be on one Kafka cluster (same "
                "bootstrap_servers and security): one transaction covers both"
            )
        if self.scale.mode == "per-partition" and (
            self.source.kind != "kafka" or self.releases.kind != "kafka"
        ):
            raise ValueError(
                'scale.mode = "per-partition" needs a kafka source and a kafka release topic '
                "(partition learners move between instances with the consumer group)"
            )
        if self.scale.checkpoint_topic is not None and self.scale.mode != "per-partition":
            raise ValueError('scale.checkpoint_topic needs scale.mode = "per-partition"')
        if self.units.source == "message_key" and (
            getattr(self.model, "unit_key", None) is None or self.source.kind != "kafka"
        ):
            raise ValueError(
                'units.source = "message_key" needs model.unit_key (the unit\'s name) and a '
                "kafka source"
            )
        return self

    @property
    def units_from_key(self) -> bool:
        """Whether every record's privacy unit is its Kafka message key (a unit-level model)."""
        return self.units.source == "message_key" and self.model.unit_key is not None

    @property
    def transactional_id(self) -> str:
        """The Kafka transactional id of this model's writer: one per model id."""
        return f"stream-dp.{self.model.model_id}"


def _cluster(cfg: SourceConfig | SinkConfig) -> tuple:
    servers = cfg.bootstrap_servers
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",")]
    return tuple(sorted(servers or ())), tuple(sorted(cfg.security.items()))


def same_cluster(a: SourceConfig | SinkConfig, b: SourceConfig | SinkConfig) -> bool:
    """Whether two Kafka sections name the same cluster with the same credentials."""
    return a.kind == b.kind == "kafka" and _cluster(a) == _cluster(b)


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False):
        loc = list(e["loc"])
        if loc[:1] == ["model"] and len(loc) > 1 and loc[1] in ENGINE_ALGORITHMS:
            del loc[1]  # the union's tag: the section already says which algorithm
        where = ".".join(str(p) for p in loc) or "(top level)"
        message = e["msg"].removeprefix("Value error, ")  # a validator's own words
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def _relative_to(raw: dict, base: Path) -> dict:
    """``raw`` with the relative paths of the file-backed sections made relative to ``base``."""
    out = dict(raw)
    for section, key in (
        ("checkpoint", "path"),
        ("scale", "master_secret_file"),
        ("status", "file"),
        ("status", "operator_raw_metrics"),
        ("source", "path"),
        ("releases", "path"),
        ("dead_letters", "path"),
    ):
        body = out.get(section)
        if isinstance(body, dict) and isinstance(body.get(key), str):
            p = Path(body[key]).expanduser()
            if not p.is_absolute():
                out[section] = body = {**body, key: str(base / p)}
    return out


def load_config(path: str | Path) -> EngineConfig:
    """Read and validate a TOML config; raise :class:`ConfigError` naming each bad field.

    Relative paths in it are taken relative to the config file's directory.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "e.toml").write_text('''
    ... [model]
    ... features = ["a", "b"]
    ... [source]
    ... kind = "jsonl"
    ... path = "in.jsonl"
    ... [releases]
    ... kind = "stdout"
    ... [dead_letters]
    ... kind = "stdout"
    ... [checkpoint]
    ... path = "state/m.ckpt"
    ... ''')
    >>> load_config(d / "e.toml").checkpoint.path == str(d / "state" / "m.ckpt")
    True
    """
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
        config = EngineConfig.model_validate(_relative_to(raw, path.resolve().parent))
    except ValidationError as exc:
        raise ConfigError(f"invalid config {path}: {_describe(exc)}") from exc
    check_model(config, path)
    return config


def check_model(config: EngineConfig, path: str | Path = "config") -> None:
    """Construct the configured learner once: its own refusals become :class:`ConfigError`.

    Types and the engine's requirements are checked by pydantic; ranges and choices are
    checked where they are defined, in the learner's constructor.
    """
    import warnings

    model = config.model
    try:
        _check_epsilon(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the engine logs them when it builds the learner
            learner = model.build()
        _check_noise(model, learner)
        _check_metric_work(model, learner)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid config {path}: model: {' '.join(str(exc).split())}") from None


#: A release whose noise is below this share of ``model_radius`` per coordinate is the exact
#: model up to rounding (the unit roundoff of a double): the noise would vanish in the sum.
NOISE_FLOOR = 2.0**-52


def _check_epsilon(model: Any) -> None:
    """ε must convert to a finite ρ (zCDP); past ~1e29 the conversion may find none (and σ,
    which scales like 1/√ρ, would vanish anyway: :func:`_check_noise`)."""
    import math

    from stream_dp.privacy.conversions import rho_from_epsilon

    if not 0 < model.delta < 1:
        return  # the learner refuses it, naming the range
    try:
        rho = rho_from_epsilon(model.epsilon, model.delta, model.conversion)
    except (ValueError, ArithmeticError):
        rho = math.inf
    if not math.isfinite(rho):
        raise ValueError(
            f"epsilon = {model.epsilon:g} is too large: its zCDP budget ρ is not a finite "
            "number the ε → ρ conversion can compute, and the releases' noise would vanish "
            "(a private model needs epsilon of a few units)"
        )


def _check_noise(model: Any, learner: Any) -> None:
    """The noise must not vanish in rounding against what it hides.

    OnPairMF adds its noise to the gradient stream, whose scale is the stream's sensitivity Δ:
    its step size grows with ε, so the released model's noise stays a fixed share of D even
    when the gradients' noise has vanished, and the check is made in gradient units. The other
    learners add it to the model, of norm at most D.
    """
    if hasattr(learner, "mf"):
        sigma, scale = float(learner.mf.sigma), float(learner.mf.sensitivity)
        against = f"a gradient stream of sensitivity Δ = {scale:.3g}"
    else:
        first = learner.T1 + int(learner.release_every)
        if learner.horizon is not None:
            first = min(first, int(learner.horizon))
        plan = learner.noise_plan([first])
        if not plan:
            return
        sigma = plan[0]["sigma"]
        scale = float(learner.model_radius_)  # resolved: None means the radius rule
        against = f"a model of norm model_radius = {scale:g}"
    floor = NOISE_FLOOR * scale
    if not sigma >= floor:
        raise ValueError(
            f"epsilon = {model.epsilon:g} is too large: the noise (σ = {sigma:.3g} per "
            f"coordinate) would vanish in rounding against {against} (below {floor:.3g}): "
            "the release would be the exact, non-private model"
        )


def _check_metric_work(model: Any, learner: Any) -> None:
    """A metric model's step must stay within :data:`MAX_METRIC_WORK` per record."""
    from stream_dp.buffers import make_buffer
    from stream_dp.engine.learners import MAX_METRIC_WORK, metric_work

    if model.task != "metric":
        return
    d = len(model.features)
    if hasattr(learner, "mf"):
        pairs = int(learner.window)
    else:
        pairs = make_buffer(learner.buffer).capacity
        if pairs is None:  # 'all': every record so far
            pairs = int(learner.horizon) if learner.horizon is not None else None
    if pairs is None or metric_work(d, pairs) > MAX_METRIC_WORK:
        held = "every past record (buffer = 'all', no horizon)" if pairs is None else pairs
        cost = "grows without bound" if pairs is None else f"= {metric_work(d, pairs):,}"
        raise ValueError(
            f"a metric model of d = {d} features pairing each record with B = {held} buffered "
            f"ones: its work per record d²·(d + B) {cost}, above the "
            f"engine's bound {MAX_METRIC_WORK:,} (about 0.1-0.25 s of CPU a record; "
            "docs/performance.md): declare fewer features or a smaller buffer"
        )
