"""Atomic publication to Kafka: one transactional producer, one transaction per batch.

:class:`TransactionalPublisher` sends a batch of messages (to one or more topics of one
cluster) and, optionally, consumer-group offsets in a single Kafka transaction: a
``read_committed`` consumer sees all of the batch or none of it, and the offsets move if and
only if the batch is visible. Its ``transactional_id`` is stable across restarts, which gives
two guarantees Kafka enforces on the broker:

* **fencing** -- when a second producer with the same id starts (:meth:`start`), the broker
  aborts the first one's open transaction and refuses everything it sends afterwards; the
  first one's next call raises :class:`ProducerFenced`;
* **recovery** -- a restarted producer's :meth:`start` completes or aborts whatever the
  previous process left open before anything new is sent.

Outages of any length are ridden out: every failed attempt discards the producer (its
transaction is aborted by the next :meth:`start`) and the whole batch is sent again after a
capped exponential backoff. The caller's ``on_retry`` hook is called between attempts; it
decides when to give up (a deadline, a stop signal) by raising.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import clients
from ._retry import Backoff, bounded_call
from ._settings import client_settings
from .clients import DEFAULT_CLIENT
from .transport import Client

__all__ = [
    "FENCING_ERRORS",
    "GROUP_FENCING_ERRORS",
    "ProducerFenced",
    "TransactionalPublisher",
    "is_authorization_error",
]

log = logging.getLogger(__name__)

#: An attempt this old is unusual: from then on, whether the cluster answers is asked.
STALL_CHECK_S = 10.0
#: How often it is asked.
STALL_PROBE_EVERY_S = 5.0
#: How long an attempt may still go on once the cluster answers before it is abandoned.
STALL_GRACE_S = 10.0

#: Errors (``kafka.errors`` names, on both clients) that mean another producer with our
#: transactional id took over.
FENCING_ERRORS = (
    "ProducerFencedError",
    "InvalidProducerEpochError",
    "TransactionCoordinatorFencedError",
)

#: Errors that mean the consumer group moved on without the consumer whose offsets these are
#: (KIP-447: its generation or member id is stale, its partitions belong to another member).
#: kafka-python reports them as a ``CommitFailedError`` of the transaction's offset commit.
GROUP_FENCING_ERRORS = (
    "IllegalGenerationError",
    "UnknownMemberIdError",
    "FencedInstanceIdError",
    "CommitFailedError",
)

#: Settings the publisher owns: they are what makes a batch atomic and fenceable.
_PRODUCER_FIXED = frozenset(
    {
        "bootstrap_servers",
        "transactional_id",
        "enable_idempotence",
        "acks",
        "key_serializer",
        "value_serializer",
    }
)


class ProducerFenced(RuntimeError):
    """Another producer with the same transactional id started: this one must stop."""


def _carried(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it carries: its cause and context, and errors among its args.

    kafka-python reports a transaction that failed earlier in a generic ``KafkaError``:
    "Cannot perform send because at least one previous transactional or idempotent request
    has failed with errors." with the error as its second argument, or "... we are in an
    error state: <error>" with the error only in the message.
    """
    found: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(found) < 16:
        e = todo.pop()
        if e is None or any(e is f for f in found):
            continue
        found.append(e)
        todo += [e.__cause__, e.__context__]
        todo += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
    return found


def _fenced_by(exc: BaseException, names: tuple[str, ...]) -> bool:
    """Whether ``exc`` is, or carries, an error named in ``names``.

    A generic ``KafkaError`` whose message names one counts: missing a fencing would let this
    producer register again and fence the instance that fenced it, so that both publish.
    """
    for e in _carried(exc):
        if type(e).__name__ in names:
            return True
        if type(e).__name__ == "KafkaError" and any(n in str(e) for n in names):
            return True
    return False


def _is_fencing(exc: BaseException) -> bool:
    return _fenced_by(exc, FENCING_ERRORS)


class TransactionalPublisher:
    """Publish batches atomically with one transactional producer.

    Parameters
    ----------
    bootstrap_servers : str or list of str
    transactional_id : str
        Stable identity of the writer: one per model, the same after every restart.
    attempt_timeout_s : float, default 60.0
        How long one attempt (start, or send + offsets + commit) may take before it is
        abandoned and retried with a new producer.
    retry_backoff_max_s : float, default 10.0
        Cap of the backoff between attempts.
    producer_config : dict, optional
        Extra producer settings, named as kafka-python's ``KafkaProducer`` names them
        (``max_request_size``, ``request_timeout_ms``, ...).
    client : str, default "kafka-python"
        The Kafka client: ``"kafka-python"`` or ``"confluent-kafka"``
        (:mod:`connectors.transport`). Offsets committed in a transaction must come from a
        source on the same client (their group metadata is the client's own).
    **security
        Passed to the producer (``security_protocol``, ``ssl_cafile``, ...).

    Examples
    --------
    >>> pub = TransactionalPublisher("127.0.0.1:9092", "stream-dp.m")  # doctest: +SKIP
    >>> pub.start()                                                    # doctest: +SKIP
    >>> pub.publish([("releases", b"m", b"{...}")])                   # doctest: +SKIP
    """

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        transactional_id: str,
        *,
        attempt_timeout_s: float = 60.0,
        retry_backoff_max_s: float = 10.0,
        producer_config: Mapping[str, Any] | None = None,
        client: str | Client = DEFAULT_CLIENT,
        **security: Any,
    ) -> None:
        if not transactional_id:
            raise ValueError("transactional_id is required")
        self.client = clients.client(client)
        extra = client_settings(
            self.client,
            "KafkaProducer",
            "TransactionalPublisher",
            _PRODUCER_FIXED,
            producer_config,
            security,
        )
        self.transactional_id = transactional_id
        self.attempt_timeout_s = attempt_timeout_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self._config: dict[str, Any] = {
            "max_block_ms": 10_000,
            "bootstrap_timeout_ms": 10_000,
            **extra,
            "bootstrap_servers": bootstrap_servers,
            "transactional_id": transactional_id,
        }
        self._producer: Any = None
        self._ready = False
        self._generation = 0  # bumped when a producer is discarded (and its attempt with it)
        # Abandoned attempts finish in their worker threads, after the caller moved on.
        self._state_lock = threading.Lock()
        self._closed = False
        #: ``time.time()`` since which attempts have been failing (None after a success).
        self.failing_since: float | None = None

    # -- one attempt, bounded --------------------------------------------------------------

    def _bounded(self, fn: Callable[[], Any], on_wait: Callable[[], None] | None) -> Any:
        """Run ``fn`` in a worker thread; return its result, raise its error, or time out.

        kafka-python's transactional calls wait without a bound while the broker is away
        (librdkafka's, up to their timeouts).
        Waiting here instead keeps the caller's hook running (status, deadline, signals),
        and an attempt that takes too long is abandoned: its producer is discarded, and the
        next producer's ``init_transactions`` aborts whatever it left open.
        """
        watch = _StallWatch(self)

        def waiting() -> None:
            if on_wait is not None:
                on_wait()
            watch.check()

        return bounded_call(
            fn,
            self.attempt_timeout_s,
            f"no answer within {self.attempt_timeout_s:.0f} s (attempt abandoned)",
            on_wait=waiting,
            thread_name="stream-dp-txn",
        )

    def _new_producer(self) -> Any:
        generation = self._discard()
        producer = self.client.producer(**self._config)
        if hasattr(producer, "txn_timeout_s"):  # librdkafka: end each call with its attempt
            producer.txn_timeout_s = min(producer.txn_timeout_s, self.attempt_timeout_s)
        with self._state_lock:
            if generation != self._generation:  # this attempt was abandoned meanwhile
                _close_quietly(producer)
                raise RuntimeError("abandoned")
            self._producer = producer
        producer.init_transactions()
        with self._state_lock:
            # An attempt abandoned during init_transactions must not mark a later (or no)
            # producer ready: its own producer was discarded with its generation.
            if generation != self._generation:
                raise RuntimeError("abandoned")
            self._ready = True
        return producer

    def _ready_producer(self) -> Any:
        with self._state_lock:
            if self._ready:
                return self._producer
        return self._new_producer()

    def _discard(self) -> int:
        """Drop the producer (its attempt with it); return the new generation."""
        with self._state_lock:
            self._generation += 1
            producer, self._producer, self._ready = self._producer, None, False
            generation = self._generation
        if producer is not None:
            _close_quietly(producer)
        return generation

    def _retry(
        self,
        attempt: Callable[[], Any],
        what: str,
        on_retry: Callable[[BaseException], None] | None,
        on_wait: Callable[[], None] | None,
        done: Callable[[], bool] | None = None,
    ) -> Any:
        from kafka.errors import KafkaError

        if self._closed:
            raise ValueError("TransactionalPublisher is closed")
        backoff = Backoff(maximum=self.retry_backoff_max_s, logger=log, what=what)
        while True:
            began = time.time()
            try:
                result = self._bounded(attempt, on_wait)
                backoff.succeeded()
                self.failing_since = None
                return result
            except Exception as err:
                if _is_fencing(err):
                    self._discard()
                    raise ProducerFenced(
                        f"another producer with transactional id {self.transactional_id!r} "
                        "has started (a second instance of this model): this one is fenced"
                    ) from err
                if _fenced_by(err, GROUP_FENCING_ERRORS):
                    self._discard()
                    raise ProducerFenced(
                        f"the consumer group refused the offsets of transactional id "
                        f"{self.transactional_id!r}: its consumer is no longer the group's "
                        f"member of that generation (its partitions moved on): this one is "
                        f"fenced ({err})"
                    ) from err
                retriable = bool(getattr(err, "retriable", False)) or isinstance(
                    err, ConnectionError | TimeoutError
                )
                # Abortable transaction states, a closed or half-initialised producer: start
                # over with a new one. Configuration and authorisation errors are final.
                final = isinstance(err, KafkaError) and not retriable and _is_final(err)
                self._discard()
                if final or not isinstance(err, KafkaError | OSError):
                    raise
                if self.failing_since is None:
                    self.failing_since = began  # the broker stopped answering this attempt
                if on_retry is not None:
                    on_retry(err)  # may raise: the caller gives up
                backoff.failed(err, max_sleep=self.retry_backoff_max_s)
                if done is not None and done():
                    # The failed attempt's commit reached the broker before the error did.
                    self.failing_since = None
                    return None

    # -- API ---------------------------------------------------------------------------------

    def start(
        self,
        on_retry: Callable[[BaseException], None] | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        """Register as the writer of this transactional id (fencing older ones).

        Completes or aborts any transaction a previous holder of the id left open, so what a
        ``read_committed`` consumer can ever see is settled when this returns.

        Raises
        ------
        ProducerFenced
            Another producer started with the same id meanwhile.
        kafka.errors.KafkaError
            Non-retriable failures (e.g. not authorised for the transactional id).
        """
        if not self._ready:
            self._retry(self._new_producer, "Kafka transactions init", on_retry, on_wait)

    def publish(
        self,
        messages: Sequence[tuple[str, bytes | None, bytes]],
        offsets: Mapping[Any, Any] | None = None,
        group_id: str | None = None,
        *,
        on_retry: Callable[[BaseException], None] | None = None,
        on_wait: Callable[[], None] | None = None,
        already_committed: Callable[[], bool] | None = None,
    ) -> None:
        """Send ``messages`` (and commit ``offsets`` for ``group_id``) in one transaction.

        Parameters
        ----------
        messages : sequence of (topic, key, value)
        offsets : dict, optional
            ``{TopicPartition: OffsetAndMetadata}`` committed with the batch. A
            :class:`~connectors.transport.GroupOffsets` (what a source's ``offsets()``
            returns) carries the consumer's group metadata, which the commit then sends
            (KIP-447: the broker refuses offsets of a consumer the group has moved on from);
            confluent-kafka requires it.
        group_id : str, optional
            The consumer group of ``offsets``.
        on_retry : callable, optional
            Called with the error before each retry; raise to give up.
        on_wait : callable, optional
            Called about twice a second while an attempt is in progress; raise to give up.
        already_committed : callable, optional
            Asked after a failed attempt whether its commit took effect nonetheless (the
            error may have been lost on the way back); True ends the retries.

        Raises
        ------
        ProducerFenced
            Another instance took over, or the consumer group moved on from the consumer of
            ``offsets``; nothing of this batch is visible.
        kafka.errors.KafkaError
            Non-retriable failures (message too large, not authorised, ...).
        """
        if offsets and not group_id:
            raise ValueError("offsets need their group_id")
        group = getattr(offsets, "group_metadata", None) or group_id
        if offsets and getattr(group, "group_id", group_id) != group_id:
            raise ValueError(f"offsets of group {group.group_id!r} given for group {group_id!r}")
        pins = self.client.pins_partitions

        def attempt() -> None:
            producer = self._ready_producer()
            producer.begin_transaction()
            if pins:
                where = _KeyPartitions(producer)
                futures = [
                    producer.send(t, value=v, key=k, partition=where(t, k)) for t, k, v in messages
                ]
            else:
                futures = [producer.send(t, value=v, key=k) for t, k, v in messages]
            if offsets:
                producer.send_offsets_to_transaction(dict(offsets), group)
            # Every send is settled before the commit: kafka-python fails a batch whose
            # delivery timed out (a long outage) without making the transaction abortable, so
            # a commit after it would commit the offsets without the records. A failed send
            # ends the attempt uncommitted; the next producer's init_transactions aborts it.
            producer.flush()
            for f in futures:
                if f.failed():
                    raise f.exception
            producer.commit_transaction()

        self._retry(attempt, "Kafka transaction", on_retry, on_wait, already_committed)

    def close(self) -> None:
        """Close the producer (an open transaction is aborted by the next writer). Idempotent."""
        self._discard()
        self._closed = True

    def __enter__(self) -> TransactionalPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _KeyPartitions:
    """The partition kafka-python's default partitioner gives each (topic, key), worked out
    once per batch.

    A batch repeats one key per model thousands of times; hashing it (pure-Python murmur2) and
    sorting the topic's partitions for every message cost several µs a message
    (``docs/performance.md``, "Kafka end to end"). The rule is the default partitioner's, so
    every message lands where an unpinned send would put it; keyless messages stay unpinned
    (``None``: kafka-python's sticky choice).
    """

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self._known: dict[tuple[str, bytes], int] = {}

    def __call__(self, topic: str, key: bytes | None) -> int | None:
        if key is None:
            return None
        try:
            return self._known[topic, key]
        except KeyError:
            from kafka.partitioner.default import murmur2

            partitions = sorted(self._producer.partitions_for(topic))
            where = partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]
            self._known[topic, key] = where
            return where


class _StallWatch:
    """Abandons an attempt that goes on although the cluster answers.

    librdkafka can keep a transactional call waiting without end for a coordinator it lost in
    a broker restart (issue #5456), until the attempt's bound (``attempt_timeout_s``, a
    minute by default). A producer that can tell (``cluster_answers``: a new handle's
    metadata request is answered) is asked once an attempt has lasted
    :data:`STALL_CHECK_S`; once it answers, the attempt has :data:`STALL_GRACE_S` more, then
    is abandoned like one past its bound (retried with a new producer). While the cluster is
    away nothing is abandoned early: an outage is waited out by one attempt.
    """

    def __init__(self, publisher: TransactionalPublisher) -> None:
        self.publisher = publisher
        self.began = time.monotonic()
        self.next_probe = self.began + STALL_CHECK_S
        self.answered_at: float | None = None

    def check(self) -> None:
        now = time.monotonic()
        if self.answered_at is not None:
            if now - self.answered_at >= STALL_GRACE_S:
                from kafka.errors import KafkaTimeoutError

                raise KafkaTimeoutError(
                    f"no answer for {now - self.began:.0f} s while the cluster answers for "
                    f"{now - self.answered_at:.0f} s (attempt abandoned)"
                )
            return
        if now < self.next_probe:
            return
        self.next_probe = now + STALL_PROBE_EVERY_S
        answers = getattr(self.publisher._producer, "cluster_answers", None)
        if answers is not None and answers():
            self.answered_at = time.monotonic()


def _close_quietly(producer: Any) -> None:
    """Close a producer that is being dropped, without waiting for a broker that is away."""
    try:
        producer.close(timeout=1)
    except Exception as err:  # noqa: BLE001 - a broken producer is being dropped anyway
        log.debug("closing a discarded producer: %s", err)
        # close() gave up flushing before stopping its sender thread: stop it now, or it
        # retries for ever in the background.
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()


# By class name, over the error's MRO: kafka-python's classes and the ones connectors/_confluent.py
# maps librdkafka's codes to carry these names.
_AUTHORIZATION_ERRORS = frozenset(
    {
        "AuthorizationError",
        "ClusterAuthorizationFailedError",
        "TopicAuthorizationFailedError",
        "GroupAuthorizationFailedError",
        "TransactionalIdAuthorizationFailedError",
    }
)
_FINAL_ERRORS = _AUTHORIZATION_ERRORS | {
    "AuthenticationFailedError",
    "KafkaConfigurationError",
    "MessageSizeTooLargeError",
    "RecordTooLargeError",
    "UnsupportedVersionError",
    "UnsupportedForMessageFormatError",
    "InvalidTopicError",
    "IncompatibleBrokerVersion",
}


def _error_names(err: BaseException) -> set[str]:
    return {t.__name__ for t in type(err).__mro__}


def is_authorization_error(err: BaseException) -> bool:
    """The cluster refused the principal a permission (topic, group, transactional id, ...)."""
    return bool(_error_names(err) & _AUTHORIZATION_ERRORS)


def _is_final(err: BaseException) -> bool:
    """Errors no retry can fix: configuration, authorisation, size and protocol-version ones."""
    return bool(_error_names(err) & _FINAL_ERRORS)
