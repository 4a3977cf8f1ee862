"""Where a commit cycle's messages go: the sinks, the transactional publisher, and the record of
what was published.

:class:`Outputs` is the engine's publisher. It publishes one cycle's messages -- releases, dead
letters and, with a checkpoint topic, the cycle's checkpoint -- to Kafka topics in one
transaction with the source offsets (when source and topics share a cluster), or to plain sinks
(files, stdout, callbacks); then it records the cycle as published: in the consumer group's
commit tags, or in the state directory's ``<checkpoint>.published`` for a file source. The
record is what a restart reads to know whether the checkpoint's cycle still has to be published
(:mod:`stream_dp.engine.commit`). :meth:`Outputs.open` builds the outputs a configuration
describes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stream_dp.engine.config import ConfigError, EngineConfig, same_cluster
from stream_dp.engine.state import Published, StateDir

__all__ = [
    "CHECKPOINTS",
    "CHECKPOINT_MESSAGE_BYTES",
    "DEAD_LETTERS",
    "RELEASES",
    "Outputs",
    "PublicationRecord",
]

log = logging.getLogger("stream_dp.engine")

RELEASES = "releases"
DEAD_LETTERS = "dead_letters"
#: The checkpoint that holds a cycle, published with it when a checkpoint topic is configured.
CHECKPOINTS = "checkpoints"

#: Limit on one checkpoint in the checkpoint topic (its ``max.message.bytes``).
CHECKPOINT_MESSAGE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class PublicationRecord:
    """What the publication record says: the last published cycle, or someone else's commit."""

    published: Published | None
    foreign: str | None = None


class Outputs:
    """Where the outbox goes, and the record of what was published.

    Parameters
    ----------
    sinks : dict
        For ``"releases"`` and ``"dead_letters"``: a topic name (``str``, published through
        ``publisher``) or a :class:`connectors.sinks.Sink`.
    publisher : connectors.transactions.TransactionalPublisher, optional
        Required when a sink is a topic.
    source : optional
        The :class:`connectors.sources.KafkaSource`, whose consumer group then keeps the
        publication record; None for a file source (``state`` keeps it).
    offsets_in_transaction : bool
        The source and the topics share a cluster: offsets commit in the transaction.
    state : StateDir
    """

    def __init__(
        self,
        sinks: dict[str, Any],
        *,
        publisher: Any = None,
        source: Any = None,
        offsets_in_transaction: bool = False,
        state: StateDir,
    ) -> None:
        self.sinks = sinks
        self.publisher = publisher
        self.source = source
        self.offsets_in_transaction = offsets_in_transaction and publisher is not None
        self.state = state
        if publisher is None and any(isinstance(s, str) for s in sinks.values()):
            raise ValueError("a topic sink needs a publisher")

    # -- the publication record ----------------------------------------------------------------
    def record(self, timeout_s: float | None = None) -> PublicationRecord:
        """The last published cycle: from the consumer group's commit tags, or the state dir.

        Raises
        ------
        kafka.errors.KafkaError
            The group's offsets cannot be read (broker unreachable) within ``timeout_s``.
        """
        if self.source is None:
            return PublicationRecord(self.state.read_published())
        committed = self.source.committed(timeout_s)
        if not committed:
            return PublicationRecord(None)
        tags = {key: Published.parse(tag) for key, (_, tag) in committed.items()}
        if any(p is None for p in tags.values()):
            return PublicationRecord(
                None,
                f"consumer group {self.source.group_id!r} has offsets for topic "
                f"{self.source.topic!r} committed by another consumer",
            )
        runs = {p.run_id for p in tags.values() if p is not None}
        if len(runs) > 1:
            return PublicationRecord(
                None, f"consumer group {self.source.group_id!r} holds commits of runs {runs}"
            )
        return PublicationRecord(max(tags.values(), key=lambda p: p.seq))

    # -- publishing ------------------------------------------------------------------------------
    def start(self, **hooks: Callable) -> None:
        """Become the writer (fences an older instance of the model); settle its transactions."""
        if self.publisher is not None:
            self.publisher.start(**hooks)

    def publish(
        self,
        messages: Sequence[tuple[str, str | None, bytes]],
        positions: dict,
        published: Published,
        *,
        on_retry: Callable[[BaseException], None] | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        """Publish one cycle's messages, then record the cycle as published.

        Retries through outages (the hooks decide when to give up by raising). Plain sinks
        are written first and may receive a cycle twice after a crash, identically.
        """
        topics: list[tuple[str, bytes | None, bytes]] = []
        for stream, key, value in messages:
            sink = self.sinks[stream]
            if isinstance(sink, str):
                topics.append((sink, None if key is None else key.encode("utf-8"), value))
            else:
                sink.send(key, value)
        for sink in {id(s): s for s in self.sinks.values() if not isinstance(s, str)}.values():
            sink.flush()
        if self.publisher is not None:
            offsets = None
            if self.offsets_in_transaction:
                offsets = self.source.offsets(positions, published.tag)

            def done() -> bool:
                # An error can be lost on its way back after the commit took effect: the
                # consumer group's tag says whether it did.
                if not self.offsets_in_transaction:
                    return False
                try:
                    return self.record(timeout_s=2.0).published == published
                except Exception:  # noqa: BLE001 - unknown counts as not yet
                    return False

            self.publisher.publish(
                topics,
                offsets,
                self.source.group_id if offsets else None,
                on_retry=on_retry,
                on_wait=on_wait,
                already_committed=done,
            )
        if self.source is not None and not self.offsets_in_transaction:
            while not self.source.commit(positions, published.tag):
                if on_retry is not None:
                    on_retry(TimeoutError("offset commit"))
        if self.source is None:
            self.state.write_published(published)

    def close(self) -> None:
        """Close the sinks and the publisher; report, never raise (the run's error matters)."""
        parts = [s for s in self.sinks.values() if not isinstance(s, str)]
        for part in [*{id(p): p for p in parts}.values(), self.publisher]:
            if part is None:
                continue
            try:
                part.close()
            except Exception:  # noqa: BLE001 - closing must not mask the real error
                log.exception("error while closing %r", part)

    @classmethod
    def open(
        cls, config: EngineConfig, source: Any, state: StateDir, given: dict[str, Any]
    ) -> Outputs:
        """The outputs ``config`` describes, publishing the cycles of ``source``.

        ``given`` maps ``"releases"`` and ``"dead_letters"`` to a sink the caller passed instead
        of the configured one (None: the configured one). Kafka topics share one transactional
        publisher (the model's transactional id); a Kafka source on the same cluster commits
        its offsets in the publisher's transactions. A Kafka source whose outputs are all files
        commits them through a publisher of its own cluster, for the fencing; releases to a
        file beside dead letters on another cluster than a Kafka source's are refused
        (:class:`~stream_dp.engine.config.ConfigError`): nothing would fence them.
        """
        from connectors.partition import PartitionSource
        from connectors.sources import KafkaSource
        from stream_dp.engine.builders import build_sink

        kafka_source = source if isinstance(source, KafkaSource | PartitionSource) else None
        dead = config.dead_letters
        if (
            kafka_source is not None
            and not (given.get(RELEASES) is None and config.releases.kind == "kafka")
            and given.get(DEAD_LETTERS) is None
            and dead.kind == "kafka"
            and not same_cluster(config.source, dead)
        ):
            # The transactions would be on the dead letters' cluster, the record (the group's
            # offsets) outside them: a second instance of the model started at the same moment
            # would be neither fenced before it writes releases nor seen by this one.
            raise ConfigError(
                "releases to a file (or a sink passed in) with dead_letters on a Kafka cluster "
                "other than the source's cannot be fenced against a second instance of the "
                "model: put dead_letters on the source's cluster (same bootstrap_servers and "
                "security) or in a file"
            )
        sinks: dict[str, Any] = {}
        topic_cfg = None
        for stream, sink_cfg in ((RELEASES, config.releases), (DEAD_LETTERS, config.dead_letters)):
            if given.get(stream) is not None:
                sinks[stream] = given[stream]
            elif sink_cfg.kind == "kafka":
                sinks[stream] = sink_cfg.topic
                topic_cfg = sink_cfg
            else:
                sinks[stream] = build_sink(
                    sink_cfg, private=stream == DEAD_LETTERS, client=config.kafka.client
                )
        if config.scale.checkpoint_topic is not None:
            sinks[CHECKPOINTS] = config.scale.checkpoint_topic
        if topic_cfg is None and kafka_source is not None:
            # Files only, yet the model's transactional id commits the offsets: the broker then
            # fences a second instance of the model, as it does for topics; without it two
            # instances started at the same moment would both learn and release.
            topic_cfg = config.source
        publisher = None if topic_cfg is None else _publisher(config, topic_cfg)
        return cls(
            sinks,
            publisher=publisher,
            source=kafka_source,
            offsets_in_transaction=kafka_source is not None
            and topic_cfg is not None
            and same_cluster(config.source, topic_cfg),
            state=state,
        )

    def to_topic(self, stream: str) -> bool:
        """Whether ``stream``'s messages go to a Kafka topic (through the publisher)."""
        return isinstance(self.sinks.get(stream), str)


def _publisher(config: EngineConfig, topic_cfg: Any) -> Any:
    """The model's transactional publisher, for the topics of ``topic_cfg``'s cluster."""
    from connectors._settings import release_compression
    from connectors.transactions import TransactionalPublisher

    attempt = config.kafka.attempt_timeout_seconds
    return TransactionalPublisher(
        topic_cfg.bootstrap_servers,
        config.transactional_id,
        attempt_timeout_s=attempt,
        client=config.kafka.client,
        producer_config={
            "max_request_size": max(
                config.releases.max_request_size,
                CHECKPOINT_MESSAGE_BYTES if config.scale.checkpoint_topic else 0,
            ),
            "request_timeout_ms": int(min(30.0, attempt / 2) * 1000),
            "delivery_timeout_ms": int(attempt * 1000),
            # Back within seconds of the broker's return, not kafka-python's 30 s.
            "reconnect_backoff_max_ms": 5000,
            # A cycle's messages are sent in one burst and flushed by the commit: large
            # batches (fewer requests, fewer wake-ups of the producer's I/O thread) cost no
            # latency (docs/performance.md, "Kafka end to end").
            "batch_size": 256 * 1024,
            "linger_ms": 5,
            "compression_type": release_compression(),
            # kafka-python waits retry_backoff_ms (default 100) before each retry of a
            # coordinator lookup, and finding the transaction and group coordinators takes a
            # retry or two: 20 ms (the backoff the Java client uses for a transaction still
            # completing) cut init_transactions from ~0.2 s to ~0.05 s, and a learner's start
            # with it. Reconnects keep their own backoff.
            "retry_backoff_ms": 20,
        },
        **topic_cfg.security,
    )
