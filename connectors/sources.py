"""Input sources: in-memory iterables, JSONL and CSV files, and Kafka topics.

Every source yields :class:`SourceMessage` objects holding the *raw* bytes of one record and
its position, so all input flows through one validation path
(:func:`connectors.schema.parse_record`) and bad records reach the dead-letter sink with the
position they came from.

Positions and checkpoints
-------------------------
``positions()`` returns where to resume: the *next* record to read, counting every message
already handed out as consumed. A consumer loop is therefore::

    while (batch := source.poll(max_records=500, timeout_s=0.5)) is not None:
        for msg in batch:
            process(msg)                   # learn, or dead-letter
        if time_to_checkpoint:
            save_checkpoint(learner, source.positions())   # atomically
            source.commit()                # after the checkpoint is durable

(iterating the source yields the same messages one by one) and on restart
``source.seek(checkpoint_positions)`` before reading. The checkpoint is the source of truth; a
Kafka commit makes the consumer group's lag visible and records what was published.

File and iterable sources use ``{"line": n}`` (0-based index of the next record: physical
line for JSONL, data row for CSV, item for iterables). Kafka uses
``{"<topic>:<partition>": next_offset, ...}``.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from . import clients
from ._retry import Backoff, is_retriable
from ._settings import client_settings
from .clients import DEFAULT_CLIENT
from .transport import Client, GroupOffsets

__all__ = [
    "CsvSource",
    "IterableSource",
    "JsonlSource",
    "KafkaSource",
    "Source",
    "SourceMessage",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SourceMessage:
    """One raw record and where it came from.

    Parameters
    ----------
    value : bytes
        The raw payload (normally UTF-8 JSON), not yet validated.
    position : dict
        JSON-serialisable position of *this* record, e.g. ``{"line": 3}`` or
        ``{"topic": "t", "partition": 0, "offset": 41}``.
    key : bytes, optional
        The Kafka message key, if any.
    """

    value: bytes
    position: dict[str, Any]
    key: bytes | None = field(default=None)


@runtime_checkable
class Source(Protocol):
    """What the engine needs from an input stream.

    Iterating yields :class:`SourceMessage` objects. A source is a cursor: iterating again
    continues where the previous iteration stopped.
    """

    def __iter__(self) -> Iterator[SourceMessage]: ...

    def poll(self, max_records: int = 500, timeout_s: float = 0.0) -> list[SourceMessage] | None:
        """Up to ``max_records`` messages (``[]`` if none came within ``timeout_s``), or None
        once the source has ended. Returned messages count as consumed."""
        ...

    def positions(self) -> dict[str, Any]:
        """Positions of the next records to read (for checkpoints)."""
        ...

    def seek(self, positions: Mapping[str, Any]) -> None:
        """Resume from positions previously returned by :meth:`positions`."""
        ...

    def commit(self, positions: Mapping[str, Any] | None = None) -> bool:
        """Record progress upstream (Kafka consumer group); no-op for files."""
        ...

    def close(self) -> None:
        """Release resources. Idempotent."""
        ...


def _line_position(positions: Mapping[str, Any]) -> int:
    line = positions.get("line") if isinstance(positions, Mapping) else None
    if isinstance(line, bool) or not isinstance(line, int) or line < 0:
        raise ValueError(f"expected positions like {{'line': n}} with n >= 0, got {positions!r}")
    return line


class _CursorSource:
    """Shared cursor logic for sources whose positions are record indices.

    Subclasses implement :meth:`_records`, a fresh iterator over the whole input in which
    each item is the raw bytes of one record or ``None`` for a position that holds no record
    (a blank line): such positions are counted but not yielded, so indices stay stable.
    """

    _rewindable = True

    def __init__(self) -> None:
        self._it: Iterator[bytes | None] | None = None
        self._pos = 0  # index of the next item the current underlying iterator will produce
        self._next = 0  # index of the next record to yield (what positions() reports)
        self._closed = False

    def _records(self) -> Iterator[bytes | None]:
        raise NotImplementedError

    def _reopen(self) -> None:
        if self._it is not None and not self._rewindable:
            raise ValueError(
                f"cannot seek back to line {self._next}: the underlying iterator is one-shot "
                f"and already at {self._pos}"
            )
        self._drop_iterator()
        self._it = self._records()
        self._pos = 0

    def _drop_iterator(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()  # closes the file held by a generator
        self._it = None

    def _read_one(self) -> SourceMessage | None:
        if self._closed:
            raise ValueError(f"{type(self).__name__} is closed")
        if self._it is None or self._pos > self._next:
            self._reopen()
        assert self._it is not None
        for value in self._it:
            index = self._pos
            self._pos += 1
            if index < self._next:
                continue  # skipping forward to a seek target
            self._next = self._pos
            if value is not None:
                return SourceMessage(value=value, position={"line": index})
        return None

    def __iter__(self) -> Iterator[SourceMessage]:
        # Reading one message per step (rather than looping inside one generator over
        # self._it) lets seek() take effect between any two messages.
        while (msg := self._read_one()) is not None:
            yield msg

    def poll(self, max_records: int = 500, timeout_s: float = 0.0) -> list[SourceMessage] | None:
        """Return up to ``max_records`` next messages, or None once the input is exhausted.

        Parameters
        ----------
        max_records : int, default 500
        timeout_s : float, default 0.0
            Unused: a file never waits.

        Returns
        -------
        list of SourceMessage or None
            Every message returned counts as consumed (:meth:`positions` moves past it).
        """
        out: list[SourceMessage] = []
        while len(out) < max_records and (msg := self._read_one()) is not None:
            out.append(msg)
        return out or None

    def positions(self) -> dict[str, Any]:
        """Return ``{"line": n}``, the index of the next record to read.

        Returns
        -------
        dict
        """
        return {"line": self._next}

    def seek(self, positions: Mapping[str, Any]) -> None:
        """Continue from ``positions["line"]`` (as returned by :meth:`positions`).

        Parameters
        ----------
        positions : dict
            ``{"line": n}``.

        Raises
        ------
        ValueError
            Malformed positions, or seeking backwards in a one-shot iterator.
        """
        target = _line_position(positions)
        if target < self._pos and self._it is not None and not self._rewindable:
            raise ValueError(
                f"cannot seek back to line {target}: the underlying iterator is one-shot"
            )
        self._next = target

    def commit(self, positions: Mapping[str, Any] | None = None) -> bool:
        """Do nothing: files have no upstream progress to record.

        Returns
        -------
        bool
            Always True.
        """
        if positions is not None:
            _line_position(positions)
        return True

    def close(self) -> None:
        """Close the underlying file or iterator. Idempotent."""
        self._drop_iterator()
        self._closed = True

    def __enter__(self) -> _CursorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_default(obj: Any) -> Any:
    # NumPy scalars and arrays are common in in-process records; json cannot encode them.
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _to_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, bytearray | memoryview):
        return bytes(item)
    if isinstance(item, str):
        return item.encode("utf-8", "surrogatepass")
    try:
        # allow_nan: NaN must reach the validator (and be rejected as "non_finite") rather
        # than blow up here.
        return json.dumps(item, default=_json_default, allow_nan=True).encode("utf-8")
    except (TypeError, ValueError) as err:
        # Unencodable items still flow on and are dead-lettered as "invalid_json".
        return f"<unserialisable {type(item).__name__}: {err}>".encode()


class IterableSource(_CursorSource):
    """Records from any iterable of dicts, JSON strings or bytes.

    Parameters
    ----------
    items : iterable
        Dicts are encoded as JSON; str and bytes are taken as raw payloads. Re-iterable
        collections (lists, tuples) support seeking backwards; one-shot iterators and
        generators only support seeking forwards.

    Examples
    --------
    >>> src = IterableSource([{"x": [1.0], "y": 1}, b'{"x": [2.0], "y": 0}'])
    >>> [m.position for m in src]
    [{'line': 0}, {'line': 1}]
    >>> src.positions()
    {'line': 2}
    """

    def __init__(self, items: Iterable[Any]) -> None:
        super().__init__()
        self._items = items
        # An iterator returns itself from iter(); iterating it twice would silently resume
        # instead of rewinding.
        self._rewindable = iter(items) is not items

    def _records(self) -> Iterator[bytes | None]:
        return (_to_bytes(item) for item in self._items)


class JsonlSource(_CursorSource):
    """Records from a JSON Lines file, one JSON object per line.

    Parameters
    ----------
    path : str or os.PathLike
        The file. Blank lines are skipped but still counted, so ``{"line": n}`` always names
        the n-th physical line (0-based).

    Raises
    ------
    FileNotFoundError
        At construction, if the file does not exist.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "in.jsonl"
    >>> _ = p.write_text('{"x": [1], "y": 1}\\n\\n{"x": [2], "y": 0}\\n')
    >>> [m.position["line"] for m in JsonlSource(p)]
    [0, 2]
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"JSONL input {self.path} does not exist")

    def _records(self) -> Iterator[bytes | None]:
        with self.path.open("rb") as fh:
            for line in fh:
                line = line.strip()
                yield line or None


def _number_or_text(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        # Left as text so validation rejects it as "wrong_type" with the column name.
        return text


def _label(text: str | None) -> int | float | str | None:
    if text is None or not text.strip():
        return None
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


class CsvSource(_CursorSource):
    """Records from a CSV file with a header row.

    Each data row becomes ``{"x": {column: value, ...}, "y": label}`` encoded as JSON bytes,
    so CSV input goes through exactly the same validation as JSON input. Feature cells are
    parsed as floats; cells that are not numbers stay strings and are rejected downstream
    (``wrong_type``), as are short rows (missing cells become null). Labels are parsed as
    int, then float, else kept as text; an empty label cell means ``missing_label``.

    Parameters
    ----------
    path : str or os.PathLike
    label_column : str
    feature_columns : sequence of str, optional
        Default: every column except the label, key and timestamp columns.
    key_column, ts_column : str, optional
        Columns copied to the record's ``key`` and ``ts``.
    delimiter : str, default ","
    encoding : str, default "utf-8"
        Undecodable bytes are replaced (and then usually rejected as non-numeric) instead
        of stopping the stream.

    Raises
    ------
    FileNotFoundError, ValueError
        At construction: missing file, empty file, or columns absent from the header.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "in.csv"
    >>> _ = p.write_text("a,b,label\\n1,2,1\\n3,4,0\\n")
    >>> next(iter(CsvSource(p, "label"))).value
    b'{"x": {"a": 1.0, "b": 2.0}, "y": 1}'
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        label_column: str,
        feature_columns: Sequence[str] | None = None,
        *,
        key_column: str | None = None,
        ts_column: str | None = None,
        delimiter: str = ",",
        encoding: str = "utf-8",
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.delimiter = delimiter
        self.encoding = encoding
        if not self.path.is_file():
            raise FileNotFoundError(f"CSV input {self.path} does not exist")
        with self._open() as fh:
            header = next(csv.reader(fh, delimiter=delimiter), None)
        if not header:
            raise ValueError(f"CSV input {self.path} has no header row")
        special = [c for c in (label_column, key_column, ts_column) if c is not None]
        if feature_columns is None:
            feature_columns = [c for c in header if c not in special]
        missing = [c for c in [*special, *feature_columns] if c not in header]
        if missing:
            raise ValueError(f"CSV input {self.path} lacks column(s) {missing}; has {header}")
        if not feature_columns:
            raise ValueError(f"CSV input {self.path} has no feature columns")
        self.label_column = label_column
        self.feature_columns = list(feature_columns)
        self.key_column = key_column
        self.ts_column = ts_column

    def _open(self) -> Any:
        # newline="" is what the csv module requires for quoted fields with line breaks.
        return self.path.open("r", newline="", encoding=self.encoding, errors="replace")

    def _row_to_json(self, row: dict[str | None, Any]) -> bytes:
        x: dict[str, Any] = {}
        for name in self.feature_columns:
            cell = row.get(name)
            x[name] = None if cell is None else _number_or_text(cell)
        if row.get(None):
            # A row longer than the header: keep the surplus so validation rejects the row.
            x["__extra_cells__"] = row[None]
        record: dict[str, Any] = {"x": x, "y": _label(row.get(self.label_column))}
        if self.key_column is not None:
            record["key"] = row.get(self.key_column)
        if self.ts_column is not None:
            ts = row.get(self.ts_column)
            record["ts"] = _number_or_text(ts) if ts else None
        return json.dumps(record, allow_nan=True).encode("utf-8")

    def _records(self) -> Iterator[bytes | None]:
        with self._open() as fh:
            for row in csv.DictReader(fh, delimiter=self.delimiter):
                yield self._row_to_json(row)


# --------------------------------------------------------------------------------------------
# Kafka
# --------------------------------------------------------------------------------------------

#: Settings KafkaSource owns; letting callers override them would break offset tracking.
_CONSUMER_FIXED = frozenset(
    {
        "bootstrap_servers",
        "group_id",
        "enable_auto_commit",
        "key_deserializer",
        "value_deserializer",
        "consumer_timeout_ms",
        "auto_offset_reset",
        "isolation_level",
    }
)

#: Prefix of the offset-commit metadata KafkaSource writes (``stream-dp/1 <tag>``).
COMMIT_METADATA_PREFIX = "stream-dp/1 "


def _close_in_background(consumer: Any) -> None:
    """Close a consumer that was replaced, without waiting: its closing may wait as long as a
    call of it that never ends."""
    threading.Thread(target=consumer.close, name="stream-dp-kafka-close", daemon=True).start()


def _parse_kafka_positions(positions: Mapping[str, Any]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for key, offset in positions.items():
        topic, sep, part = str(key).rpartition(":")
        if not sep or not topic or not part.isdigit():
            raise ValueError(f"expected positions keyed 'topic:partition', got key {key!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset for {key!r} must be an int >= 0, got {offset!r}")
        out[(topic, int(part))] = offset
    return out


class KafkaSource:
    """Records from a Kafka topic, with manual offset commits.

    Parameters
    ----------
    topic : str
    bootstrap_servers : str or list of str
    group_id : str
        Consumer group under which offsets are committed (and read back on start when no
        explicit :meth:`seek` is given). Do not share it with ``subscribe()``-based consumers.
    partitions : sequence of int, optional
        Partitions to read. Default: all partitions of the topic, re-checked every
        ``partition_refresh_s`` so partitions added later are picked up.
    max_idle_seconds : float, optional
        End the iteration after this long without a record (including time spent waiting
        out a broker outage). Default: never end; for batch jobs and tests.
    poll_timeout_ms : int, default 500
        How long one ``poll`` waits for data; also bounds how quickly :meth:`stop` acts.
    max_poll_records : int, default 500
    retry_backoff_max_s : float, default 10.0
        Cap of the exponential backoff while the broker is unreachable.
    commit_timeout_s : float, default 30.0
        How long :meth:`commit` keeps retrying before giving up (returning False).
    partition_refresh_s : float, default 60.0
    request_timeout_s : float, default 10.0
        Bound on one metadata request (start offsets, committed offsets, end offsets).
    consumer_config : dict, optional
        Extra consumer settings, named as kafka-python's ``KafkaConsumer`` names them (e.g.
        ``client_id``, ``fetch_max_bytes``; on ``confluent-kafka`` also librdkafka's dotted
        names).
    client : str, default "kafka-python"
        The Kafka client: ``"kafka-python"`` or ``"confluent-kafka"``
        (:mod:`connectors.transport`). The behaviour described here is the same on both.
    **security
        Passed to the consumer: ``security_protocol``, ``sasl_mechanism``,
        ``sasl_plain_username``, ``sasl_plain_password``, ``ssl_cafile``, ``ssl_certfile``,
        ``ssl_keyfile``, ``ssl_password``, ``ssl_check_hostname``, ...

    Notes
    -----
    **Assignment, not subscription.** The source uses the consumer's ``assign()`` (manual
    assignment) and the group only as an offset store. Group-managed ``subscribe()`` would let
    the broker move a partition to another engine instance at any rebalance, while this
    instance's learner (and its checkpoint) has already learned from that partition's data.
    Manual assignment also means no heartbeats, so a slow learning step can never get the
    consumer evicted (``max_poll_interval_ms``).

    **Start position** of each partition: an explicit :meth:`seek` (the checkpoint) if given,
    else the group's committed offset, else the earliest offset, resolved when the partition
    is assigned (so :meth:`positions` names every assigned partition).

    **Skipped records are reported.** When a position is no longer in the log (deleted by
    retention, or the topic was deleted and recreated), the source continues from the
    earliest offset and logs a WARNING with the number of records that were skipped; the
    total is in :attr:`skipped_records`. Kafka's silent ``auto_offset_reset`` is off.

    **Committed input only.** The consumer reads ``read_committed``: records of aborted
    transactions are never learned from.

    **Broker outages** are absorbed: ``KafkaTimeoutError``, connection errors, "no brokers
    available" and other retriable errors raised while connecting, discovering partitions or
    polling are logged and retried with capped exponential backoff; polling simply returns
    nothing meanwhile, and :attr:`unreachable_since` says since when the broker has not
    answered. Either client reconnects by itself and the fetch positions survive, so nothing
    is lost or repeated. Non-retriable errors (authentication, authorisation, configuration)
    are raised.

    **A commit without an answer** (confluent-kafka: librdkafka can keep a synchronous commit
    going without end after a broker restart) is a failed commit, never a success. Once it has
    outlived its bound while the cluster answers, the group's offsets are committed and read
    through a new consumer; the reading consumer and its positions stay as they are. If the
    old commit lands after all, the newest offsets are committed again after it.

    Values that are ``None`` (tombstones) are delivered as empty payloads so they are
    dead-lettered and counted rather than silently dropped.

    Examples
    --------
    >>> src = KafkaSource("events", "127.0.0.1:9092", "stream-dp",
    ...                   max_idle_seconds=5)                       # doctest: +SKIP
    >>> for msg in src:                                             # doctest: +SKIP
    ...     handle(msg.value)
    >>> src.commit()                                                # doctest: +SKIP
    """

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str | Sequence[str],
        group_id: str,
        *,
        partitions: Sequence[int] | None = None,
        max_idle_seconds: float | None = None,
        poll_timeout_ms: int = 500,
        max_poll_records: int = 500,
        retry_backoff_max_s: float = 10.0,
        commit_timeout_s: float = 30.0,
        partition_refresh_s: float = 60.0,
        request_timeout_s: float = 10.0,
        consumer_config: Mapping[str, Any] | None = None,
        client: str | Client = DEFAULT_CLIENT,
        **security: Any,
    ) -> None:
        if not topic or ":" in topic:
            raise ValueError(f"invalid topic name {topic!r}")
        if not group_id:
            raise ValueError("group_id is required (offsets are committed under it)")
        self.client = clients.client(client)
        extra = client_settings(
            self.client, "KafkaConsumer", "KafkaSource", _CONSUMER_FIXED, consumer_config, security
        )
        self.topic = topic
        self.group_id = group_id
        self.max_idle_seconds = max_idle_seconds
        self.poll_timeout_ms = int(poll_timeout_ms)
        self.max_poll_records = int(max_poll_records)
        self.commit_timeout_s = commit_timeout_s
        self.partition_refresh_s = partition_refresh_s
        self.request_timeout_ms = int(request_timeout_s * 1000)
        self._retry_backoff_max_s = retry_backoff_max_s
        self._static_partitions = sorted(set(partitions)) if partitions is not None else None
        self._config: dict[str, Any] = {
            "max_poll_records": self.max_poll_records,
            # kafka-python's 30 s default would let one failed connect attempt outlast
            # max_idle_seconds; the retry loop around it provides the patience instead.
            "bootstrap_timeout_ms": 10_000,
            # Reconnect within seconds of a broker's return, not kafka-python's 30 s.
            "reconnect_backoff_max_ms": 5000,
            # A broker answers one connection's requests in order, so a request of this
            # consumer's own (the topic's partitions, its end offsets for the lag: at start-up,
            # at every status report and at the end) waits behind a fetch long-polling an idle
            # partition. At the clients' default of 500 ms that was half a second each time, a
            # third of a 60,000-record run's start-up on confluent-kafka (docs/performance.md).
            # Idle, this is ten fetches a second.
            "fetch_max_wait_ms": 100,
            **extra,
            "bootstrap_servers": bootstrap_servers,
            "group_id": group_id,
            "enable_auto_commit": False,
            # Never move a position silently: out-of-range positions raise, and _fetch
            # reports what was skipped before continuing at the earliest offset.
            "auto_offset_reset": "none",
            "isolation_level": "read_committed",
        }
        self._consumer: Any = None
        #: The consumer of the group's offsets once the reading one is wedged (see
        #: :meth:`_offsets_consumer`); None while the reading one serves.
        self._committer: Any = None
        self._committer_lock = threading.Lock()
        #: One commit at a time, so that a commit sent again (:meth:`_late_commit`) never
        #: overtakes a newer one.
        self._commit_lock = threading.Lock()
        #: The offsets of the last :meth:`commit` asked for: the newest publication record.
        self._latest: dict[Any, Any] | None = None
        self._group_metadata: Any = None
        self._assigned: list[Any] = []
        self._last_refresh = -float("inf")
        self._next: dict[tuple[str, int], int] = {}
        self._pending_seek: dict[tuple[str, int], int] = {}
        self._seek_generation = 0
        self._stop = threading.Event()
        self._closed = False
        self._backoff = Backoff(
            maximum=retry_backoff_max_s, logger=log, what=f"Kafka consume from {topic}"
        )
        self._idle_start: float | None = None
        #: Records skipped because their offsets had left the log before they were read.
        self.skipped_records = 0
        #: ``time.time()`` since which the broker has not answered (None while it answers).
        self.unreachable_since: float | None = None

    # -- connection management --------------------------------------------------------------

    def _ensure_consumer(self) -> Any:
        if self._closed:
            raise ValueError("KafkaSource is closed")
        if self._consumer is None:
            self._consumer = self._new_consumer()
            # Never joined (assigned partitions): its group metadata does not change, and is
            # read here once rather than from the publication thread (consumers are not
            # thread-safe).
            self._group_metadata = self._consumer.group_metadata()
            self._assigned = []
            self._last_refresh = -float("inf")
        return self._consumer

    def _new_consumer(self) -> Any:
        consumer = self.client.consumer(**self._config)
        if hasattr(consumer, "on_late_commit"):  # confluent-kafka
            # Weakly: no cycle between the source and its consumers, so a source dropped
            # without close() goes at once (a collected cycle would close the consumer on
            # whichever thread collects it).
            late = weakref.WeakMethod(self._late_commit)

            def report(offsets: dict[Any, Any]) -> None:
                method = late()
                if method is not None:
                    method(offsets)

            consumer.on_late_commit = report
        return consumer

    def _offsets_consumer(self) -> Any:
        """The consumer that commits and reads the group's offsets: the reading one, or,
        once a commit on it never ended (confluent-kafka, librdkafka issue #3740), another
        one that only does that. The reading consumer and its positions are left as they
        are: no record is read again or skipped. A wedged committer is replaced in turn,
        and closed in the background (its closing may wait as long as its commit).
        """
        reader = self._ensure_consumer()
        with self._committer_lock:
            current = self._committer or reader
            if not getattr(current, "wedged", False):
                return current
            old, self._committer = self._committer, self._new_consumer()
            log.warning(
                "topic %s: an offset commit had no answer while the cluster answered (librdkafka "
                "issue #3740); the group's offsets now go through a new consumer",
                self.topic,
            )
        if old is not None:
            _close_in_background(old)
        return self._committer

    def _replace_reader(self) -> None:
        """Read through a new consumer (confluent-kafka: the old one's metadata requests fail
        while the cluster answers). Its positions are this source's (:meth:`positions`): it
        resumes each partition at the record after the last one returned, so no record is
        read again or skipped. The old one is closed in the background."""
        old, self._consumer = self._consumer, None
        log.warning(
            "topic %s: the consumer's metadata requests fail while the cluster answers; "
            "reading on through a new consumer from the same positions",
            self.topic,
        )
        if old is not None and old is not self._committer:
            _close_in_background(old)

    def _late_commit(self, offsets: dict[Any, Any]) -> None:
        """A commit given up on has succeeded after all: commit the newest offsets again if
        it was older, so that the group's record never goes back (a consumer's background
        thread calls this)."""
        with self._commit_lock:
            latest = self._latest
            if latest is None or latest == offsets or self._closed:
                return
            try:
                self._offsets_consumer().commit(offsets=latest, timeout_ms=self.request_timeout_ms)
            except Exception as err:  # noqa: BLE001 - the next commit() covers it
                log.warning(
                    "topic %s: an older commit was answered late; committing the newest offsets "
                    "again failed (%s): the next commit covers them",
                    self.topic,
                    err,
                )

    def _ensure_assigned(self) -> bool:
        """Assign partitions (first call, or periodic refresh); False while none exist."""
        from kafka import TopicPartition

        consumer = self._ensure_consumer()
        now = time.monotonic()
        if self._assigned and (
            self._static_partitions is not None
            or now - self._last_refresh < self.partition_refresh_s
        ):
            return True
        if self._static_partitions is not None:
            parts = self._static_partitions
        else:
            parts = sorted(consumer.partitions_for_topic(self.topic) or ())
        self._last_refresh = now
        if not parts:
            return False
        wanted = [TopicPartition(self.topic, p) for p in parts]
        if wanted != self._assigned:
            if self._assigned:
                log.info("topic %s: now reading partitions %s", self.topic, parts)
            targets = {**self._next, **self._pending_seek}
            unknown = [tp for tp in wanted if (tp.topic, tp.partition) not in targets]
            targets.update(self._start_offsets(unknown))
            consumer.assign(wanted)
            self._assigned = wanted
            # Re-apply what we know: positions of records already yielded (fetched-ahead data
            # was discarded), any seek requested before the assignment existed, and the
            # resolved start of every other partition, so positions() names them all.
            for tp in wanted:
                offset = targets[(tp.topic, tp.partition)]
                consumer.seek(tp, offset)
                self._next[(tp.topic, tp.partition)] = offset
            self._pending_seek.clear()
        return True

    def _start_offsets(self, partitions: Sequence[Any]) -> dict[tuple[str, int], int]:
        """The group's committed offset of each partition, else its earliest offset."""
        if not partitions:
            return {}
        consumer = self._consumer
        out: dict[tuple[str, int], int] = {}
        missing = []
        for tp in partitions:
            committed = self._offsets_consumer().committed(tp, timeout_ms=self.request_timeout_ms)
            if committed is None:
                missing.append(tp)
            else:
                out[(tp.topic, tp.partition)] = int(committed)
        if missing:
            begin = consumer.beginning_offsets(missing, timeout_ms=self.request_timeout_ms)
            for tp, offset in begin.items():
                out[(tp.topic, tp.partition)] = int(offset)
        return out

    def _skip_out_of_range(self, positions: Mapping[Any, int]) -> None:
        """Continue at the earliest offset where a position has left the log, saying so."""
        from kafka import TopicPartition

        consumer = self._consumer
        tps = [TopicPartition(tp.topic, tp.partition) for tp in positions]
        begin = consumer.beginning_offsets(tps, timeout_ms=self.request_timeout_ms)
        end = consumer.end_offsets(tps, timeout_ms=self.request_timeout_ms)
        for tp in tps:
            offset, first, last = int(positions[tp]), int(begin[tp]), int(end[tp])
            if offset < first:
                self.skipped_records += first - offset
                log.warning(
                    "topic %s partition %d: offsets %d to %d were deleted before they were read "
                    "(retention or deleted records): %d record(s) skipped, continuing at %d",
                    tp.topic, tp.partition, offset, first - 1, first - offset, first,
                )  # fmt: skip
            else:
                log.warning(
                    "topic %s partition %d: position %d is beyond the end of the log (%d); the "
                    "topic was deleted and recreated or truncated. Continuing at its earliest "
                    "offset %d; records of the old topic that were not read are lost",
                    tp.topic, tp.partition, offset, last, first,
                )  # fmt: skip
            consumer.seek(tp, first)
            self._next[(tp.topic, tp.partition)] = first

    # -- fetching ------------------------------------------------------------------------

    def _fetch(self, max_records: int, timeout_ms: int) -> list[Any] | None:
        """Raw consumer records (not yet marked consumed), ``[]`` if none, None when idle
        for ``max_idle_seconds``."""
        from kafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError

        # Idleness is the time spent in fetches that brought nothing, back to back: the time
        # the caller spends on the records between fetches is not idle.
        now = time.monotonic()
        if self._idle_start is None:
            self._idle_start = now
        idle_left = (
            None
            if self.max_idle_seconds is None
            else self.max_idle_seconds - (now - self._idle_start)
        )
        if idle_left is not None and idle_left <= 0:
            log.debug("topic %s idle for %.1f s; ending", self.topic, self.max_idle_seconds)
            self._idle_start = None
            return None
        try:
            if self._ensure_assigned():
                batch = self._consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
            else:
                # Topic not created yet: wait without busy-looping, then look again.
                batch = {}
                self._last_refresh = -float("inf")
                self._stop.wait(timeout_ms / 1000)
            self._backoff.succeeded()
        except OffsetOutOfRangeError as err:
            self._skip_out_of_range(err.args[0] if err.args else {})
            return []
        except NoOffsetForPartitionError as err:
            # The client dropped a position (e.g. after detecting log truncation): resolve
            # it as at assignment.
            parts = list(err.args[0]) if err.args and isinstance(err.args[0], Iterable) else []
            for (topic, part), offset in self._start_offsets(parts).items():
                self.seek({f"{topic}:{part}": offset})
            return []
        except Exception as err:
            if not is_retriable(err):
                raise
            if self.unreachable_since is None:
                self.unreachable_since = time.time()
            if getattr(self._consumer, "stale", False):
                self._replace_reader()
            # Short sleeps: the caller's loop (status, signals, deadlines) must keep turning.
            cap = max(timeout_ms / 1000, 0.25) * 4
            self._backoff.failed(err, max_sleep=cap if idle_left is None else min(cap, idle_left))
            return []
        if not batch:
            # Either client polls quietly through an outage: an empty poll proves nothing
            # about the broker (lag() asks it), records do.
            return []
        self._idle_start = None
        self.unreachable_since = None
        return [rec for tp in sorted(batch) for rec in batch[tp]]

    @staticmethod
    def _message(rec: Any) -> SourceMessage:
        return SourceMessage(
            value=rec.value if rec.value is not None else b"",
            position={"topic": rec.topic, "partition": rec.partition, "offset": rec.offset},
            key=rec.key,
        )

    def poll(self, max_records: int = 500, timeout_s: float = 0.5) -> list[SourceMessage] | None:
        """Return the next records (``[]`` if none arrive within ``timeout_s``).

        Parameters
        ----------
        max_records : int, default 500
        timeout_s : float, default 0.5

        Returns
        -------
        list of SourceMessage or None
            None only after ``max_idle_seconds`` without a record. Every message returned
            counts as consumed (:meth:`positions` moves past it).
        """
        records = self._fetch(min(max_records, self.max_poll_records), int(timeout_s * 1000))
        if records is None:
            return None
        for rec in records:
            self._next[(rec.topic, rec.partition)] = rec.offset + 1
        return [self._message(rec) for rec in records]

    def __iter__(self) -> Iterator[SourceMessage]:
        self._idle_start = None
        while True:
            if self._stop.is_set():
                self._stop.clear()  # the next iteration starts afresh
                return
            records = self._fetch(self.max_poll_records, self.poll_timeout_ms)
            if records is None:
                return
            generation = self._seek_generation
            done = 0
            try:
                for rec in records:
                    if self._seek_generation != generation or self._stop.is_set():
                        break
                    self._next[(rec.topic, rec.partition)] = rec.offset + 1
                    done += 1
                    yield self._message(rec)
            finally:
                # Stopped, or the caller abandoned the iterator, mid-batch: move the fetch
                # position back to the first record not yielded, or the next iteration would
                # silently skip the rest of the batch. After a seek() the position is already
                # where the caller wants it.
                if done < len(records) and self._seek_generation == generation:
                    self._rewind(records[done:])

    def _rewind(self, rest: Sequence[Any]) -> None:
        from kafka import TopicPartition

        if self._consumer is None:
            return
        first: dict[tuple[str, int], int] = {}
        for rec in rest:
            first.setdefault((rec.topic, rec.partition), rec.offset)
        for (topic, part), offset in first.items():
            self._consumer.seek(TopicPartition(topic, part), offset)

    def stop(self) -> None:
        """Ask a running iteration to end after the current record (thread-safe)."""
        self._stop.set()

    # -- positions --------------------------------------------------------------------------

    def positions(self) -> dict[str, Any]:
        """Return ``{"topic:partition": next_offset}`` for every partition whose position is known.

        That is every assigned partition (its start is resolved on assignment) plus any
        partition passed to :meth:`seek`.

        Returns
        -------
        dict
        """
        merged = {**self._next, **self._pending_seek}
        return {f"{t}:{p}": off for (t, p), off in sorted(merged.items())}

    def start(self) -> dict[str, Any]:
        """Connect, assign and resolve the start of every partition; return :meth:`positions`.

        Raises
        ------
        kafka.errors.KafkaError
            The broker did not answer (no retry here: callers probing at start-up want the
            error).
        """
        self._ensure_assigned()
        return self.positions()

    def seek(self, positions: Mapping[str, Any]) -> None:
        """Resume from checkpoint positions.

        Parameters
        ----------
        positions : dict
            ``{"topic:partition": next_offset}`` as returned by :meth:`positions`. Entries for
            other topics are ignored (with a warning), so one checkpoint may cover several
            sources.

        Raises
        ------
        ValueError
            Malformed positions.
        """
        from kafka import TopicPartition

        parsed = _parse_kafka_positions(positions)
        assigned = set(self._assigned)
        for (topic, part), offset in parsed.items():
            if topic != self.topic:
                log.warning(
                    "ignoring position for topic %s (this source reads %s)", topic, self.topic
                )
                continue
            if self._static_partitions is not None and part not in self._static_partitions:
                log.warning("ignoring position for unassigned partition %s:%d", topic, part)
                continue
            tp = TopicPartition(topic, part)
            if self._consumer is not None and tp in assigned:
                self._consumer.seek(tp, offset)
            else:
                self._pending_seek[(topic, part)] = offset
            self._next[(topic, part)] = offset
        self._seek_generation += 1

    def offsets(self, positions: Mapping[str, Any] | None = None, tag: str = "") -> GroupOffsets:
        """Positions as ``{TopicPartition: OffsetAndMetadata}``, for a commit or a transaction.

        Parameters
        ----------
        positions : dict, optional
            Default :meth:`positions`.
        tag : str, optional
            Stored as commit metadata (``stream-dp/1 <tag>``) and read back by
            :meth:`committed`.

        Returns
        -------
        GroupOffsets
            With the consumer's group metadata, for a transactional commit (KIP-447).
        """
        offsets = self._offsets(positions, tag)
        if offsets and self._consumer is None:
            self._ensure_consumer()
        return GroupOffsets(offsets, group_metadata=self._group_metadata if offsets else None)

    def _offsets(self, positions: Mapping[str, Any] | None, tag: str) -> dict[Any, Any]:
        from kafka import OffsetAndMetadata, TopicPartition

        parsed = _parse_kafka_positions(positions if positions is not None else self.positions())
        meta = COMMIT_METADATA_PREFIX + tag if tag else ""
        return {
            TopicPartition(t, p): OffsetAndMetadata(off, meta, -1) for (t, p), off in parsed.items()
        }

    def commit(self, positions: Mapping[str, Any] | None = None, tag: str = "") -> bool:
        """Commit offsets to the consumer group.

        Parameters
        ----------
        positions : dict, optional
            ``{"topic:partition": next_offset}``; default :meth:`positions`.
        tag : str, optional
            Commit metadata, read back by :meth:`committed`.

        Returns
        -------
        bool
            True once committed; False if the broker stayed unreachable for
            ``commit_timeout_s`` (logged). A later commit covers the same offsets, and the
            checkpoint, not the commit, is what a restart relies on.

        Raises
        ------
        kafka.errors.KafkaError
            Non-retriable failures (e.g. not authorised for the group).
        """
        offsets = self._offsets(positions, tag)
        if not offsets:
            return True
        self._latest = offsets
        backoff = Backoff(
            maximum=self._retry_backoff_max_s, logger=log, what=f"Kafka commit for {self.topic}"
        )
        deadline = time.monotonic() + self.commit_timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                with self._commit_lock:
                    self._offsets_consumer().commit(
                        offsets=offsets, timeout_ms=max(1000, int(left * 1000))
                    )
                backoff.succeeded()
                return True
            except Exception as err:
                if not is_retriable(err):
                    raise
                if time.monotonic() >= deadline:
                    log.warning(
                        "could not commit offsets for %s within %.0f s (%s); will retry at the "
                        "next commit",
                        self.topic,
                        self.commit_timeout_s,
                        err,
                    )
                    return False
                backoff.failed(err, max_sleep=deadline - time.monotonic())

    def committed(self, timeout_s: float | None = None) -> dict[str, tuple[int, str | None]]:
        """The group's committed offsets for this topic, with the tags they were committed with.

        Parameters
        ----------
        timeout_s : float, optional
            Bound on each request; default ``request_timeout_s``.

        Returns
        -------
        dict
            ``{"topic:partition": (offset, tag)}`` for every partition of the topic that has
            a committed offset; ``tag`` is None when the commit was not made by a
            :class:`KafkaSource` (another tool, or no metadata).

        Raises
        ------
        kafka.errors.KafkaError
            The broker did not answer within ``request_timeout_s``.
        """
        from kafka import TopicPartition

        consumer = self._offsets_consumer()
        timeout_ms = self.request_timeout_ms if timeout_s is None else int(timeout_s * 1000)
        if self._static_partitions is not None:
            parts = self._static_partitions
        else:
            parts = sorted(consumer.partitions_for_topic(self.topic) or ())
        out: dict[str, tuple[int, str | None]] = {}
        for p in parts:
            meta = consumer.committed(
                TopicPartition(self.topic, p), metadata=True, timeout_ms=timeout_ms
            )
            if meta is None:
                continue
            text = meta.metadata or ""
            tag = (
                text[len(COMMIT_METADATA_PREFIX) :]
                if text.startswith(COMMIT_METADATA_PREFIX)
                else None
            )
            out[f"{self.topic}:{p}"] = (int(meta.offset), tag)
        return out

    def lag(self, timeout_s: float | None = None) -> int | None:
        """Records on the broker not yet consumed, summed over assigned partitions (for status).

        The sum of :meth:`lags`; None when any partition's lag is unknown.
        """
        lags = self.lags(timeout_s)
        return None if lags is None else sum(lags.values())

    def lags(self, timeout_s: float | None = None) -> dict[int, int] | None:
        """Records on the broker not yet consumed, per assigned partition: its end offset (the
        high-water mark, or the last stable offset under ``read_committed``) minus the
        position of the next record to learn.

        Asks the broker for end offsets (one short request, bounded by ``timeout_s``, default
        ``request_timeout_s``); returns None when the broker is unreachable (then
        :attr:`unreachable_since` is set) or nothing is assigned yet. Never raises.
        """
        from kafka.errors import KafkaError

        if self._consumer is None or not self._assigned:
            return None
        timeout_ms = self.request_timeout_ms if timeout_s is None else int(timeout_s * 1000)
        try:
            ends = self._consumer.end_offsets(list(self._assigned), timeout_ms=timeout_ms)
        except (KafkaError, OSError, ValueError):
            if self.unreachable_since is None:
                self.unreachable_since = time.time()
            return None
        self.unreachable_since = None
        out: dict[int, int] = {}
        for tp, end in ends.items():
            nxt = self._next.get((tp.topic, tp.partition))
            if nxt is None or end is None:
                return None
            out[tp.partition] = max(int(end) - int(nxt), 0)
        return out

    @property
    def partitions_held(self) -> int:
        """Partitions of the topic this source reads now (0 before the first poll)."""
        return len(self._assigned)

    def close(self) -> None:
        """Close the consumer (nothing is committed implicitly). Idempotent."""
        self._stop.set()
        self._closed = True
        for consumer in (self._committer, self._consumer):
            if consumer is None:
                continue
            try:
                consumer.close(autocommit=False)
            except Exception as err:  # closing must not mask the caller's own error
                log.warning("error while closing the Kafka consumer: %s", err)
        self._consumer = self._committer = None

    def __enter__(self) -> KafkaSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
