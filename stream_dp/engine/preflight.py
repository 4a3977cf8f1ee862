"""Checks made before the first record: release size, Kafka reachability, topics.

Each check ends in a one-line diagnosis naming the setting to fix. They run at ``--dry-run``
(release size only: no network) and at every start (all of them, each bounded in time), so a
misconfigured deployment fails within ``kafka.startup_timeout_seconds`` per cluster instead of
looking like an idle stream.
"""

from __future__ import annotations

import logging
from typing import Any

from connectors.schema import release_message_bytes
from stream_dp.engine.config import EngineConfig, SinkConfig, SourceConfig, same_cluster
from stream_dp.online.units import unit_relation
from stream_dp.privacy.contribution import MAX_EVENTS, MAX_STEP

__all__ = ["ReleaseTooLarge", "check_kafka", "release_size"]

log = logging.getLogger("stream_dp.engine")

#: Bytes Kafka adds around one record's key and value (v2 record batch header and record
#: framing), with margin; kafka-python compares the total with ``max_request_size``.
RECORD_OVERHEAD = 128


class ReleaseTooLarge(ValueError):
    """A release of this model could exceed what the release sink accepts."""


def release_size(config: EngineConfig) -> tuple[int, int | None]:
    """An upper bound on one release record's size, and the release sink's limit (or None).

    Raises
    ------
    ReleaseTooLarge
        The bound exceeds the limit; the message names both and what to change.
    """
    m = config.model
    features = list(m.features or ())
    unit = getattr(m, "unit_key", None)
    # A unit-level model's releases carry its relation: sized with the largest k and b.
    relation = None if unit is None else unit_relation(unit, MAX_EVENTS, MAX_STEP)
    value = release_message_bytes(m.task, features, m.model_id, m.variant_name(), relation)
    sink = config.releases
    if sink.kind != "kafka":
        return value, None
    size = value + len(m.model_id.encode()) + RECORD_OVERHEAD
    if size > sink.max_request_size:
        d = len(features)
        weights = f"d = {d} weights" if m.task == "auc" else f"d² = {d * d} weights (d = {d})"
        raise ReleaseTooLarge(
            f"a release of model {m.model_id!r} takes up to {size:,} bytes ({m.task}: {weights}, "
            f"8 bytes each in base64) but the release topic accepts {sink.max_request_size:,} "
            "(releases.max_request_size); declare fewer features, or raise "
            "releases.max_request_size and the topic's max.message.bytes"
        )
    return size, sink.max_request_size


def _connect(cfg: SourceConfig | SinkConfig, what: str, timeout: float, client: str) -> Any:
    from connectors.admin import connect

    return connect(
        cfg.bootstrap_servers, timeout_s=timeout, what=what, client=client, **cfg.security
    )


def check_kafka(config: EngineConfig, release_bytes: int) -> None:
    """Reach every configured cluster, check the input topic, create or check the output ones.

    Logs one line per cluster saying what it found. Raises
    :class:`connectors.admin.KafkaProblem` (unreachable, TLS/SASL mismatch, missing input
    topic or partition, an output topic that cannot be created) or :class:`ReleaseTooLarge`
    (the release topic's ``max.message.bytes`` is below a release).
    """
    from connectors.admin import (
        KafkaProblem,
        ensure_topic,
        topic_max_message_bytes,
        topic_partitions,
    )

    timeout = config.kafka.startup_timeout_seconds
    src, rel, dead = config.source, config.releases, config.dead_letters
    sections: list[tuple[str, SourceConfig | SinkConfig]] = [
        (name, cfg) for name, cfg in (("source", src), ("releases", rel), ("dead_letters", dead))
        if cfg.kind == "kafka"
    ]  # fmt: skip
    clusters: list[list[tuple[str, SourceConfig | SinkConfig]]] = []
    for name, cfg in sections:
        for group in clusters:
            if same_cluster(group[0][1], cfg):
                group.append((name, cfg))
                break
        else:
            clusters.append([(name, cfg)])
    for group in clusters:
        first = group[0][1]
        admin = _connect(first, f"{group[0][0]}.bootstrap_servers", timeout, config.kafka.client)
        try:
            found = []
            for name, cfg in group:
                if name == "source":
                    n = topic_partitions(admin, [cfg.topic])[cfg.topic]
                    if n is None:
                        raise KafkaProblem(
                            f"input topic {cfg.topic!r} does not exist on {cfg.bootstrap_servers} "
                            "(source.topic): create it, or produce to it, before starting"
                        )
                    missing = sorted(set(cfg.partitions or ()) - set(range(n)))
                    if missing:
                        raise KafkaProblem(
                            f"input topic {cfg.topic!r} has partitions 0 to {n - 1}; "
                            f"source.partitions names {missing}"
                        )
                    found.append(f"input {cfg.topic!r} ({n} partition{'s' * (n != 1)})")
                    continue
                n = topic_partitions(admin, [cfg.topic])[cfg.topic]
                if n is None:
                    if not config.kafka.create_topics:
                        raise KafkaProblem(
                            f"{name} topic {cfg.topic!r} does not exist and kafka.create_topics "
                            "is false"
                        )
                    ensure_topic(admin, cfg.topic, partitions=1)
                    state = "created, 1 partition"
                else:
                    state = f"{n} partition{'s' * (n != 1)}"
                if name == "releases":
                    limit = topic_max_message_bytes(admin, cfg.topic)
                    if limit is not None and release_bytes > limit:
                        raise ReleaseTooLarge(
                            f"a release takes up to {release_bytes:,} bytes but topic "
                            f"{cfg.topic!r} accepts {limit:,} (its max.message.bytes); raise "
                            "it, or declare fewer features"
                        )
                found.append(f"{name.replace('_', ' ')} {cfg.topic!r} ({state})")
            log.info("Kafka at %s: %s", first.bootstrap_servers, ", ".join(found))
        finally:
            admin.close()
