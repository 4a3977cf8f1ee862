"""Connectors of the stream_dp engine: record schemas, sources and sinks.

* :mod:`connectors.schema` -- :class:`InputRecord` and :func:`parse_record` (untrusted input,
  with reason codes for the dead-letter sink), :class:`ReleaseMessage`, :class:`DeadLetter`.
* :mod:`connectors.sources` -- iterable, JSONL, CSV and Kafka sources with checkpointable
  positions.
* :mod:`connectors.sinks` -- JSONL, stdout, callback and Kafka sinks, and the dead-letter
  wrapper that counts rejects per reason.
* :mod:`connectors.transactions` -- :class:`TransactionalPublisher`: batches published
  atomically with consumer offsets, one fenceable writer per transactional id.
* :mod:`connectors.admin` -- start-up checks of a cluster that end in a one-line diagnosis.
* :mod:`connectors.transport` -- the Kafka client behind all of them, chosen by name:
  ``"kafka-python"`` (the default) or ``"confluent-kafka"`` (librdkafka, the ``confluent``
  extra); every Kafka connector takes ``client=``.
"""

from __future__ import annotations

from .schema import (
    REASONS,
    DeadLetter,
    InputRecord,
    Label,
    RecordError,
    ReleaseMessage,
    conform_features,
    parse_record,
)
from .sinks import (
    CallbackSink,
    DeadLetterSink,
    JsonlSink,
    KafkaSink,
    KafkaSinkError,
    Sink,
    StdoutSink,
    publish_release,
)
from .sources import CsvSource, IterableSource, JsonlSource, KafkaSource, Source, SourceMessage
from .transactions import ProducerFenced, TransactionalPublisher

__all__ = [
    "REASONS",
    "CallbackSink",
    "CsvSource",
    "DeadLetter",
    "DeadLetterSink",
    "InputRecord",
    "IterableSource",
    "JsonlSink",
    "JsonlSource",
    "KafkaSink",
    "KafkaSinkError",
    "KafkaSource",
    "Label",
    "ProducerFenced",
    "RecordError",
    "ReleaseMessage",
    "Sink",
    "Source",
    "SourceMessage",
    "StdoutSink",
    "TransactionalPublisher",
    "conform_features",
    "parse_record",
    "publish_release",
]
