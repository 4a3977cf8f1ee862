"""Output sinks for releases and dead letters: JSONL, stdout, callback and Kafka.

A sink takes already-serialised messages (``bytes``, normally one JSON document) and a key.
:func:`publish_release` and :class:`DeadLetterSink` do the serialisation for the two kinds
of output the engine produces.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from . import clients
from ._retry import Backoff, is_retriable
from ._settings import client_settings
from .clients import DEFAULT_CLIENT
from .schema import DeadLetter, RecordError, ReleaseMessage
from .transport import Client

__all__ = [
    "CallbackSink",
    "DeadLetterSink",
    "JsonlSink",
    "KafkaSink",
    "KafkaSinkError",
    "Sink",
    "StdoutSink",
    "publish_release",
]

log = logging.getLogger(__name__)


@runtime_checkable
class Sink(Protocol):
    """Where the engine writes serialised messages."""

    def send(self, key: str | None, value: bytes) -> None:
        """Queue or write one message."""
        ...

    def flush(self) -> None:
        """Block until every message sent so far is durable/delivered."""
        ...

    def close(self) -> None:
        """Flush and release resources. Idempotent."""
        ...


def _check_value(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"sink values must be bytes, got {type(value).__name__}")


def publish_release(sink: Sink, release: ReleaseMessage) -> None:
    """Send a release, keyed by its model id (so one model's releases stay in order).

    Parameters
    ----------
    sink : Sink
    release : ReleaseMessage

    Examples
    --------
    >>> got = []
    >>> msg = ReleaseMessage(model_id="m", algorithm="a", task="auc", step=1,
    ...                      release_index=0, weights=[0.5], shape=[1], feature_names=["f"],
    ...                      rho_spent=0.1, rho_budget=1.0, epsilon_spent=1.0, delta=1e-6,
    ...                      exhausted=False, time=0.0)
    >>> publish_release(CallbackSink(lambda k, v: got.append(k)), msg)
    >>> got
    ['m']
    """
    sink.send(release.model_id, release.to_json())


class JsonlSink:
    """Append messages to a JSON Lines file, one per line.

    Parameters
    ----------
    path : str or os.PathLike
        Created (with parent directories) if missing; appended to otherwise.
    flush_each : bool, default True
        Flush the file buffer after every message, so a crash loses nothing already sent
        (data still sits in the OS page cache; see ``fsync``).
    fsync : bool, default False
        Also ``os.fsync`` on every :meth:`flush` for durability across power loss.
    file_mode : int, optional
        Permissions for a newly created file, e.g. ``0o600`` for dead letters (they contain
        raw records). Default: ``0o666`` minus the umask.

    Notes
    -----
    The key is not written: each line is exactly the message value. Values containing a
    newline are rejected because they would corrupt the line framing.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "out" / "releases.jsonl"
    >>> with JsonlSink(p) as sink:
    ...     sink.send("m", b'{"a": 1}')
    >>> p.read_text()
    '{"a": 1}\\n'
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        flush_each: bool = True,
        fsync: bool = False,
        file_mode: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.flush_each = flush_each
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(
            self.path,
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o666 if file_mode is None else file_mode,
        )
        self._fh: IO[bytes] | None = os.fdopen(fd, "ab")
        self._lock = threading.Lock()

    def send(self, key: str | None, value: bytes) -> None:
        """Append ``value`` and a newline.

        Parameters
        ----------
        key : str or None
            Ignored.
        value : bytes
            One JSON document without newlines.
        """
        data = _check_value(value)
        if b"\n" in data or b"\r" in data:
            raise ValueError("JSONL values must not contain line breaks")
        with self._lock:
            if self._fh is None:
                raise ValueError(f"JsonlSink {self.path} is closed")
            self._fh.write(data + b"\n")
            if self.flush_each:
                self._fh.flush()

    def flush(self) -> None:
        """Flush buffered lines to the OS (and to disk if ``fsync``)."""
        with self._lock:
            if self._fh is None:
                return
            self._fh.flush()
            if self.fsync:
                os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Flush and close the file. Idempotent."""
        self.flush()
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StdoutSink:
    """Write each message as one line of text to standard output.

    Parameters
    ----------
    stream : text stream, optional
        Default: ``sys.stdout`` as it is at each call (so redirection and test capture work).
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream

    @property
    def stream(self) -> IO[str]:
        """The stream written to."""
        return self._stream if self._stream is not None else sys.stdout

    def send(self, key: str | None, value: bytes) -> None:
        """Print ``value`` (decoded as UTF-8); the key is not printed."""
        self.stream.write(_check_value(value).decode("utf-8", errors="replace") + "\n")

    def flush(self) -> None:
        """Flush the stream."""
        self.stream.flush()

    def close(self) -> None:
        """Flush; standard output itself is left open."""
        self.flush()


class CallbackSink:
    """Hand every message to a function, e.g. to feed a dashboard or a test.

    Parameters
    ----------
    fn : callable
        Called as ``fn(key, value)``. Exceptions propagate to the caller of :meth:`send`.

    Examples
    --------
    >>> seen = []
    >>> CallbackSink(lambda k, v: seen.append((k, v))).send("m", b"{}")
    >>> seen
    [('m', b'{}')]
    """

    def __init__(self, fn: Callable[[str | None, bytes], Any]) -> None:
        self.fn = fn

    def send(self, key: str | None, value: bytes) -> None:
        """Call ``fn(key, value)``."""
        self.fn(key, _check_value(value))

    def flush(self) -> None:
        """Nothing to flush."""

    def close(self) -> None:
        """Nothing to close."""


class KafkaSinkError(RuntimeError):
    """Messages could not be delivered to Kafka within the sink's delivery timeout."""


@dataclass
class _Pending:
    key: bytes | None
    value: bytes
    future: Any


#: Sent messages kept before the first pass that forgets the delivered ones.
_COMPACT_AT = 1024

#: Settings KafkaSink owns: they are what makes delivery idempotent and loss-free.
_PRODUCER_FIXED = frozenset(
    {"bootstrap_servers", "enable_idempotence", "acks", "key_serializer", "value_serializer"}
)


class KafkaSink:
    """Publish messages to a Kafka topic with an idempotent producer.

    Parameters
    ----------
    topic : str
    bootstrap_servers : str or list of str
    delivery_timeout_s : float, default 300.0
        Total time :meth:`send` and :meth:`flush` keep retrying through a broker outage
        before raising :class:`KafkaSinkError`.
    retry_backoff_max_s : float, default 10.0
        Cap of the exponential backoff between retries.
    max_block_ms : int, default 10000
        How long one send may block (metadata, full buffer) before the sink's own retry loop
        takes over.
    producer_config : dict, optional
        Extra producer settings, named as kafka-python's ``KafkaProducer`` names them (e.g.
        ``client_id``, ``compression_type``, ``linger_ms``; on ``confluent-kafka`` also
        librdkafka's dotted names).
    client : str, default "kafka-python"
        The Kafka client: ``"kafka-python"`` or ``"confluent-kafka"``
        (:mod:`connectors.transport`).
    **security
        Passed to the producer (``security_protocol``, ``sasl_mechanism``,
        ``sasl_plain_username``, ``sasl_plain_password``, ``ssl_cafile``, ...).

    Notes
    -----
    ``enable_idempotence=True`` and ``acks="all"`` are enforced: the broker de-duplicates the
    producer's internal retries, so an outage neither loses nor duplicates a message while
    the client is retrying. If a message still fails with a retriable error (its internal
    delivery timeout expired), :meth:`flush` re-sends it until ``delivery_timeout_s``; such an
    outer re-send may reorder it after later messages (consumers order releases by
    ``release_index``). Nothing is dropped silently: what cannot be delivered in time makes
    :meth:`send`, :meth:`flush` or :meth:`close` raise :class:`KafkaSinkError`.

    Examples
    --------
    >>> sink = KafkaSink("releases", "127.0.0.1:9092")       # doctest: +SKIP
    >>> sink.send("model-a", b'{"step": 1}')                 # doctest: +SKIP
    >>> sink.flush()                                         # doctest: +SKIP
    """

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str | Sequence[str],
        *,
        delivery_timeout_s: float = 300.0,
        retry_backoff_max_s: float = 10.0,
        max_block_ms: int = 10_000,
        producer_config: Mapping[str, Any] | None = None,
        client: str | Client = DEFAULT_CLIENT,
        **security: Any,
    ) -> None:
        if not topic:
            raise ValueError("topic is required")
        self.client = clients.client(client)
        extra = client_settings(
            self.client, "KafkaProducer", "KafkaSink", _PRODUCER_FIXED, producer_config, security
        )
        self.topic = topic
        self.delivery_timeout_s = delivery_timeout_s
        self._retry_backoff_max_s = retry_backoff_max_s
        self._config: dict[str, Any] = {
            "max_block_ms": int(max_block_ms),
            # Bound each connect attempt like each send, so the sink's own deadline governs.
            "bootstrap_timeout_ms": int(max_block_ms),
            **extra,
            "bootstrap_servers": bootstrap_servers,
            "enable_idempotence": True,
            "acks": "all",
        }
        self._producer: Any = None
        self._pending: list[_Pending] = []
        self._compact_at = _COMPACT_AT
        self._lock = threading.RLock()
        self._closed = False

    def _ensure_producer(self) -> Any:
        if self._closed:
            raise ValueError("KafkaSink is closed")
        if self._producer is None:
            self._producer = self.client.producer(**self._config)
        return self._producer

    def _backoff(self, what: str) -> Backoff:
        return Backoff(maximum=self._retry_backoff_max_s, logger=log, what=what)

    def _send_with_retry(self, item: _Pending, deadline: float) -> None:
        backoff = self._backoff(f"Kafka send to {self.topic}")
        while True:
            try:
                producer = self._ensure_producer()
                item.future = producer.send(self.topic, value=item.value, key=item.key)
                backoff.succeeded()
                return
            except Exception as err:
                if not is_retriable(err):
                    raise
                if time.monotonic() >= deadline:
                    raise KafkaSinkError(
                        f"could not send to {self.topic} within {self.delivery_timeout_s:.0f} s: "
                        f"{err}"
                    ) from err
                backoff.failed(err, max_sleep=deadline - time.monotonic())

    def send(self, key: str | None, value: bytes) -> None:
        """Queue one message; blocks (retrying) while the broker is unreachable.

        Parameters
        ----------
        key : str or None
            Message key, UTF-8 encoded (the model id for releases).
        value : bytes

        Raises
        ------
        KafkaSinkError
            The message could not even be queued within ``delivery_timeout_s``.
        """
        item = _Pending(key.encode("utf-8") if key is not None else None, _check_value(value), None)
        with self._lock:
            self._send_with_retry(item, time.monotonic() + self.delivery_timeout_s)
            self._pending.append(item)
            if len(self._pending) >= self._compact_at:
                # Forget delivered messages so an unflushed long run does not grow memory;
                # failed ones stay for flush() to re-send. The next pass waits until the list
                # has doubled: when sends outrun delivery, a pass at every send past a fixed
                # size made a long run quadratic (300,000 sends took over 15 minutes).
                self._pending = [p for p in self._pending if not p.future.succeeded()]
                self._compact_at = max(_COMPACT_AT, 2 * len(self._pending))

    def flush(self) -> None:
        """Block until every message sent so far is acknowledged by the broker.

        Raises
        ------
        KafkaSinkError
            Some messages were not delivered within ``delivery_timeout_s``, or failed with a
            non-retriable error. They are not silently dropped.
        """
        with self._lock:
            if not self._pending:
                return
            deadline = time.monotonic() + self.delivery_timeout_s
            backoff = self._backoff(f"Kafka delivery to {self.topic}")
            while True:
                producer = self._ensure_producer()
                try:
                    producer.flush(timeout=max(0.1, deadline - time.monotonic()))
                except Exception as err:
                    if not is_retriable(err):
                        raise
                    # Timed out waiting: inspect futures below; unfinished ones count as failed.
                failed = [p for p in self._pending if not p.future.succeeded()]
                if not failed:
                    self._pending = []
                    self._compact_at = _COMPACT_AT
                    backoff.succeeded()
                    return
                fatal = [
                    p for p in failed if p.future.is_done and not is_retriable(p.future.exception)
                ]
                if fatal:
                    self._pending = failed
                    raise KafkaSinkError(
                        f"{len(fatal)} message(s) to {self.topic} failed permanently: "
                        f"{fatal[0].future.exception}"
                    ) from fatal[0].future.exception
                if time.monotonic() >= deadline:
                    self._pending = failed
                    raise KafkaSinkError(
                        f"{len(failed)} message(s) to {self.topic} not delivered within "
                        f"{self.delivery_timeout_s:.0f} s"
                    )
                backoff.failed(
                    failed[0].future.exception or TimeoutError("delivery pending"),
                    max_sleep=deadline - time.monotonic(),
                )
                # Re-send only what definitely failed; unfinished messages are still in the
                # producer's hands and re-sending them would create duplicates.
                for p in failed:
                    if p.future.is_done:
                        self._send_with_retry(p, deadline)
                self._pending = failed

    def close(self) -> None:
        """Flush, then close the producer. Idempotent.

        Raises
        ------
        KafkaSinkError
            If the final flush fails (the producer is closed anyway).
        """
        with self._lock:
            if self._closed:
                return
            try:
                if self._producer is not None:
                    self.flush()
            finally:
                if self._producer is not None:
                    try:
                        self._producer.close(timeout=10)
                    except Exception as err:  # must not mask a flush error
                        log.warning("error while closing the Kafka producer: %s", err)
                self._producer = None
                self._closed = True

    def __enter__(self) -> KafkaSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DeadLetterSink:
    """Route rejected records to a sink as :class:`~connectors.schema.DeadLetter` JSON.

    Parameters
    ----------
    inner : Sink
        Where dead letters go (a JSONL file with ``file_mode=0o600``, a Kafka topic with
        restricted ACLs, ...). Dead letters contain raw input.

    Attributes
    ----------
    counts : dict of str to int
        Number of dead letters per reason.

    Examples
    --------
    >>> got = []
    >>> dead = DeadLetterSink(CallbackSink(lambda k, v: got.append(k)))
    >>> _ = dead.send_dead("invalid_json", "not JSON", b"{oops", {"line": 3})
    >>> dead.counts, dead.total, got
    ({'invalid_json': 1}, 1, ['invalid_json'])
    """

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self.counts: dict[str, int] = {}

    @property
    def total(self) -> int:
        """Total number of dead letters sent."""
        return sum(self.counts.values())

    def send_dead(
        self,
        reason: str,
        message: str,
        payload: bytes | str | Mapping[str, Any] | None,
        position: Mapping[str, Any] | None = None,
    ) -> DeadLetter:
        """Serialise and send one dead letter (keyed by reason), and count it.

        Parameters
        ----------
        reason : str
            Short code, normally one of :data:`connectors.schema.REASONS`.
        message : str
            Human-readable explanation.
        payload : bytes, str, dict or None
            The raw record as received.
        position : dict, optional
            The source position of the record.

        Returns
        -------
        DeadLetter
            What was sent.
        """
        letter = DeadLetter.from_raw(reason, message, payload, position)
        self.inner.send(reason, letter.to_json())
        # Counted after the send succeeded, so the counter never claims more than was written.
        self.counts[reason] = self.counts.get(reason, 0) + 1
        return letter

    def send_error(
        self,
        error: RecordError,
        payload: bytes | str | Mapping[str, Any] | None,
        position: Mapping[str, Any] | None = None,
    ) -> DeadLetter:
        """Shortcut for ``send_dead(error.reason, error.message, payload, position)``."""
        return self.send_dead(error.reason, error.message, payload, position)

    def flush(self) -> None:
        """Flush the inner sink."""
        self.inner.flush()

    def close(self) -> None:
        """Close the inner sink."""
        self.inner.close()
