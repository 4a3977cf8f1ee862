"""The learner, source and sinks a configuration describes."""

from __future__ import annotations

from connectors.clients import DEFAULT_CLIENT
from stream_dp.engine.config import EngineConfig, SinkConfig, SourceConfig

__all__ = ["build_learner", "build_sink", "build_source"]


def build_learner(config: EngineConfig):
    """The private learner described by ``config.model``."""
    return config.model.build()


def build_source(cfg: SourceConfig, *, client: str = DEFAULT_CLIENT):
    """The source ``cfg`` describes; a Kafka one reads with ``client`` (``kafka.client``)."""
    from connectors.sources import CsvSource, JsonlSource, KafkaSource

    if cfg.kind == "kafka":
        return KafkaSource(
            cfg.topic,
            cfg.bootstrap_servers,
            cfg.group_id,
            partitions=cfg.partitions,
            max_idle_seconds=cfg.max_idle_seconds,
            client=client,
            **cfg.security,
        )
    if cfg.kind == "jsonl":
        return JsonlSource(cfg.path)
    return CsvSource(cfg.path, cfg.label_column, cfg.feature_columns)


def build_sink(cfg: SinkConfig, *, private: bool = False, client: str = DEFAULT_CLIENT):
    """A plain sink; ``private`` files (dead letters: raw records) are created mode 0600, a
    Kafka one writes with ``client`` (``kafka.client``)."""
    from connectors.sinks import JsonlSink, KafkaSink, StdoutSink

    if cfg.kind == "kafka":
        return KafkaSink(cfg.topic, cfg.bootstrap_servers, client=client, **cfg.security)
    if cfg.kind == "jsonl":
        return JsonlSink(cfg.path, file_mode=0o600 if private else None)
    return StdoutSink()
