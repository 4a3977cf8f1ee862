"""One partition of a group-managed consumer, seen as an engine source.

In per-partition scale-out (:mod:`stream_dp.engine.scaleout`) one consumer per instance
*subscribes* to the input topic and Kafka's group protocol assigns the partitions. Each
assigned partition feeds its own learner, whose commit cycle needs what a
:class:`connectors.sources.KafkaSource` gives the single-learner engine -- positions, seeks, the
group's committed offsets and their tags, offsets for a transaction -- but for that partition
alone. :class:`PartitionSource` is that view; the instance's loop polls the shared consumer and
hands each partition's records to its learner.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from connectors.sources import COMMIT_METADATA_PREFIX, SourceMessage, _parse_kafka_positions
from connectors.transport import GroupOffsets

__all__ = ["PartitionSource"]


class PartitionSource:
    """Positions, offsets and commits of one assigned partition of a shared consumer.

    Parameters
    ----------
    consumer : connectors.transport.Consumer
        Subscribed to ``topic`` in ``group_id``; this partition is assigned to it. Either
        client's (a ``kafka.KafkaConsumer``, or ``connectors.clients.client(name).consumer``).
    topic : str
    partition : int
    group_id : str
    request_timeout_s : float, default 10.0
    lock : threading.Lock, optional
        Held around every call to ``consumer``. The partitions of one consumer share it, so
        their learners can start in parallel threads (kafka-python's consumer is not
        thread-safe).

    Notes
    -----
    The position is the offset after the last record handed to the learner (:meth:`advance`),
    not the consumer's fetch position: records fetched but not yet learned are not consumed.

    Examples
    --------
    >>> src = PartitionSource(consumer, "events", 3, "stream-dp")   # doctest: +SKIP
    >>> src.seek({"events:3": 120}); src.positions()                 # doctest: +SKIP
    {'events:3': 120}
    """

    def __init__(
        self,
        consumer: Any,
        topic: str,
        partition: int,
        group_id: str,
        *,
        request_timeout_s: float = 10.0,
        lock: Any = None,
    ) -> None:
        from kafka import TopicPartition

        self.consumer = consumer
        self._lock = threading.Lock() if lock is None else lock
        self.topic, self.partition, self.group_id = topic, int(partition), group_id
        self.tp = TopicPartition(topic, self.partition)
        self.key = f"{topic}:{self.partition}"
        self.request_timeout_ms = int(request_timeout_s * 1000)
        self.next: int | None = None
        #: Records skipped because they had left the log (the consumer reports none here).
        self.skipped_records = 0
        #: Outages are watched by the instance's shared consumer, not per partition.
        self.unreachable_since: float | None = None
        #: The consumer's group membership when this partition's records were last read
        #: (KIP-447): taken on the thread that polls, as the consumer is not thread-safe and
        #: offsets are asked for on the publication thread.
        self._group_metadata: Any = None

    # -- positions ---------------------------------------------------------------------------
    def positions(self) -> dict[str, int]:
        return {} if self.next is None else {self.key: self.next}

    def start(self) -> dict[str, int]:
        """Where a new learner of this partition starts: the group's commit, else the earliest."""
        with self._lock:
            committed = self.consumer.committed(self.tp, timeout_ms=self.request_timeout_ms)
            if committed is None:
                begin = self.consumer.beginning_offsets(
                    [self.tp], timeout_ms=self.request_timeout_ms
                )
                committed = begin[self.tp]
            self._group_metadata = self.consumer.group_metadata()
        self.seek({self.key: int(committed)})
        return self.positions()

    def seek(self, positions: Mapping[str, Any]) -> None:
        """Resume at the checkpoint's position of this partition (others are ignored).

        A learner that resumes seeks before it reads anything, and may publish the cycle its
        previous owner left (offsets included) before its first poll: the group metadata is
        taken here too, on the thread that drives the consumer.
        """
        for (topic, part), offset in _parse_kafka_positions(positions).items():
            if (topic, part) == (self.topic, self.partition):
                with self._lock:
                    self.consumer.seek(self.tp, offset)
                    self._group_metadata = self.consumer.group_metadata()
                self.next = offset

    def messages(self, records: list[Any]) -> list[SourceMessage]:
        """The records to learn, as engine messages; the position moves past them.

        Called on the thread that polls the consumer, right after the poll.
        """
        with self._lock:
            self._group_metadata = self.consumer.group_metadata()
        out = []
        for rec in records:
            if self.next is not None and rec.offset < self.next:
                continue  # fetched before a seek back to the checkpoint's position
            out.append(
                SourceMessage(
                    value=rec.value if rec.value is not None else b"",
                    position={"topic": rec.topic, "partition": rec.partition, "offset": rec.offset},
                    key=rec.key,
                )
            )
            self.next = rec.offset + 1
        return out

    # -- the consumer group's record ---------------------------------------------------------
    def offsets(self, positions: Mapping[str, Any] | None = None, tag: str = "") -> GroupOffsets:
        """This partition's position as ``{TopicPartition: OffsetAndMetadata}``, with the
        consumer's group metadata of when its records were read (its generation: KIP-447
        fencing of a member the group has moved on from)."""
        offsets = self._offsets(positions, tag)
        if not offsets:
            return GroupOffsets()
        return GroupOffsets(offsets, group_metadata=self._group_metadata)

    def _offsets(self, positions: Mapping[str, Any] | None, tag: str) -> dict[Any, Any]:
        from kafka import OffsetAndMetadata

        parsed = _parse_kafka_positions(positions if positions is not None else self.positions())
        offset = parsed.get((self.topic, self.partition))
        if offset is None:
            return {}
        meta = COMMIT_METADATA_PREFIX + tag if tag else ""
        return {self.tp: OffsetAndMetadata(offset, meta, -1)}

    def committed(self, timeout_s: float | None = None) -> dict[str, tuple[int, str | None]]:
        """The group's committed offset of this partition and its tag (``{}`` if none)."""
        timeout_ms = self.request_timeout_ms if timeout_s is None else int(timeout_s * 1000)
        with self._lock:
            meta = self.consumer.committed(self.tp, metadata=True, timeout_ms=timeout_ms)
        if meta is None:
            return {}
        text = meta.metadata or ""
        prefix = COMMIT_METADATA_PREFIX
        tag = text[len(prefix) :] if text.startswith(prefix) else None
        return {self.key: (int(meta.offset), tag)}

    def commit(self, positions: Mapping[str, Any] | None = None, tag: str = "") -> bool:
        """Commit outside a transaction (release topic on another cluster)."""
        offsets = self._offsets(positions, tag)
        if offsets:
            with self._lock:
                self.consumer.commit(offsets=offsets)
        return True

    def lag(self, timeout_s: float | None = None) -> int | None:
        """Records of this partition on the broker not yet learned (None if unknown)."""
        lags = self.lags(timeout_s)
        return None if lags is None else lags[self.partition]

    def lags(self, timeout_s: float | None = None) -> dict[int, int] | None:
        """:meth:`lag` keyed by the partition, as :meth:`connectors.sources.KafkaSource.lags`."""
        if self.next is None:
            return None
        timeout_ms = self.request_timeout_ms if timeout_s is None else int(timeout_s * 1000)
        try:
            with self._lock:
                end = self.consumer.end_offsets([self.tp], timeout_ms=timeout_ms)[self.tp]
        except Exception:  # noqa: BLE001 - status only (and impossible inside a rebalance)
            return None
        return {self.partition: max(int(end) - self.next, 0)}

    def close(self) -> None:
        """Nothing to close: the consumer belongs to the instance."""
