"""Connectors of the stream_dp engine: record schemas, sources and sinks.

* :mod:`connectors.schema` -- :class:`InputRecord` and :func:`parse_record` (untrusted input,
  with reason codes for the dead-letter sink), :class:`ReleaseMessage`, :class:`DeadLetter`.
* :mod:`connectors.sources` -- iterable, JSONL, CSV and Kafka sources with checkpointable
  positions.
* :mod:`connectors.sinks` -- JSONL, stdout, callback and Kafka sinks, and the dead-letter
  wrapper that counts rejects per reason.
"""

from __future__ import annotations

from .schema import (
    REASONS,
    DeadLetter,
    InputRecord,
    Label,
    RecordError,
    ReleaseMessage,
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
    "RecordError",
    "ReleaseMessage",
    "Sink",
    "Source",
    "SourceMessage",
    "StdoutSink",
    "parse_record",
    "publish_release",
]
