"""The confluent-kafka client (private): librdkafka behind the connectors' interface.

Adapts ``confluent_kafka``'s consumer, producer and admin client to the calls
:mod:`connectors.transport` names (kafka-python's), so the connectors' logic is written once:

* **Settings** are translated from kafka-python's names to librdkafka's (:data:`_COMMON`,
  :data:`_CONSUMER`, :data:`_PRODUCER`); librdkafka's own dotted names pass through.
* **Errors** become the ``kafka.errors`` class of the same meaning (:func:`kafka_error`):
  fencing is ``ProducerFencedError``, an offset that left the log ``OffsetOutOfRangeError``,
  a timeout ``KafkaTimeoutError``, and so on, keeping librdkafka's message.
* **Behaviour** the connectors rely on is kept: a first send to a topic waits for its
  metadata at most ``max_block_ms`` (kafka-python's rule, which makes an unreachable broker an
  error at :meth:`send` rather than a silent queue), ``seek`` works on a partition assigned a
  moment ago, a commit is bounded by its ``timeout_ms`` (and every other call that waits for
  the broker by its own timeout, even where librdkafka overruns it), and keyed messages are
  partitioned by murmur2 like kafka-python and the Java client (librdkafka's default is
  CRC32), so a model's releases land on the same partition whichever client wrote them.
* **Logging** goes to the ``kafka.librdkafka`` logger at the severity that logger lets
  through, instead of librdkafka's own lines on stderr.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from ._retry import Backoff, bounded_call
from .transport import Client, GroupDescription, GroupMember

__all__ = ["ConfluentClient", "kafka_error"]

#: librdkafka's lines and errors, under the logger that quiets kafka-python too.
rdkafka_log = logging.getLogger("kafka.librdkafka")

#: How long closing a consumer may wait for the broker before it is left to finish alone.
CLOSE_WAIT_S = 5.0

#: How far past its own timeout a librdkafka call may go before it is given up on.
OVERRUN_S = 5.0

#: The bound on the metadata request that tells an outage from a call that never ends.
PROBE_S = 2.0

#: How often a reader whose metadata requests fail asks whether the cluster answers others.
STALE_PROBE_EVERY_S = 10.0


# -- settings --------------------------------------------------------------------------------


def _servers(value: Any) -> str:
    return value if isinstance(value, str) else ",".join(str(s) for s in value)


def _same(name: str) -> Callable[[Any], dict[str, Any]]:
    return lambda value: {name: value}


def _ms_to(name: str) -> Callable[[Any], dict[str, Any]]:
    return lambda value: {name: int(value)}


def _dropped(value: Any) -> dict[str, Any]:
    return {}


#: kafka-python setting -> librdkafka properties, for every client.
_COMMON: dict[str, Callable[[Any], dict[str, Any]]] = {
    "bootstrap_servers": lambda v: {"bootstrap.servers": _servers(v)},
    "client_id": _same("client.id"),
    "security_protocol": lambda v: {"security.protocol": str(v).lower()},
    "ssl_cafile": _same("ssl.ca.location"),
    "ssl_certfile": _same("ssl.certificate.location"),
    "ssl_keyfile": _same("ssl.key.location"),
    "ssl_password": _same("ssl.key.password"),
    "ssl_crlfile": _same("ssl.crl.location"),
    "ssl_ciphers": _same("ssl.cipher.suites"),
    "ssl_check_hostname": lambda v: {
        "ssl.endpoint.identification.algorithm": "https" if v else "none"
    },
    "sasl_mechanism": _same("sasl.mechanism"),
    "sasl_plain_username": _same("sasl.username"),
    "sasl_plain_password": _same("sasl.password"),
    "sasl_kerberos_service_name": _same("sasl.kerberos.service.name"),
    "reconnect_backoff_ms": _ms_to("reconnect.backoff.ms"),
    "reconnect_backoff_max_ms": _ms_to("reconnect.backoff.max.ms"),
    "retry_backoff_ms": _ms_to("retry.backoff.ms"),
    "metadata_max_age_ms": _ms_to("metadata.max.age.ms"),
    "connections_max_idle_ms": _ms_to("connections.max.idle.ms"),
    "request_timeout_ms": _ms_to("socket.timeout.ms"),
    # librdkafka never blocks on its bootstrap: the connectors' own deadlines bound it.
    "bootstrap_timeout_ms": _dropped,
    "api_version": _dropped,
}

_CONSUMER: dict[str, Callable[[Any], dict[str, Any]]] = {
    **_COMMON,
    "group_id": _same("group.id"),
    "enable_auto_commit": lambda v: {"enable.auto.commit": bool(v)},
    # "none": an offset that left the log is an error the source reports, never a silent reset.
    "auto_offset_reset": lambda v: {"auto.offset.reset": "error" if v == "none" else v},
    "isolation_level": _same("isolation.level"),
    "fetch_max_bytes": _same("fetch.max.bytes"),
    "max_partition_fetch_bytes": _same("max.partition.fetch.bytes"),
    "fetch_min_bytes": _same("fetch.min.bytes"),
    "fetch_max_wait_ms": _ms_to("fetch.wait.max.ms"),
    "session_timeout_ms": _ms_to("session.timeout.ms"),
    "heartbeat_interval_ms": _ms_to("heartbeat.interval.ms"),
    "max_poll_interval_ms": _ms_to("max.poll.interval.ms"),
    "check_crcs": lambda v: {"check.crcs": bool(v)},
    "allow_auto_create_topics": lambda v: {"allow.auto.create.topics": bool(v)},
    # The adapter's own: records per poll.
    "max_poll_records": _dropped,
}

_PRODUCER: dict[str, Callable[[Any], dict[str, Any]]] = {
    **_COMMON,
    "acks": lambda v: {"acks": str(v)},
    "enable_idempotence": lambda v: {"enable.idempotence": bool(v)},
    "transactional_id": _same("transactional.id"),
    "transaction_timeout_ms": _ms_to("transaction.timeout.ms"),
    "max_request_size": _same("message.max.bytes"),
    "batch_size": _same("batch.size"),
    "linger_ms": _ms_to("linger.ms"),
    "compression_type": lambda v: {"compression.type": v or "none"},
    "delivery_timeout_ms": _ms_to("message.timeout.ms"),
    "buffer_memory": lambda v: {"queue.buffering.max.kbytes": max(1, int(v) // 1024)},
    "retries": _same("retries"),
    "max_in_flight_requests_per_connection": _same("max.in.flight"),
    "request_timeout_ms": lambda v: {"socket.timeout.ms": int(v), "request.timeout.ms": int(v)},
    # The adapter's own: how long a send may wait for metadata or queue space.
    "max_block_ms": _dropped,
}

_ROLES = {"KafkaConsumer": _CONSUMER, "KafkaProducer": _PRODUCER}


def _probe_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a handle that only asks the cluster for its metadata."""
    return librdkafka_config(
        "KafkaConsumer", {k: v for k, v in config.items() if k in _COMMON or "." in k}
    )


def _cluster_answers(probe_conf: Mapping[str, Any]) -> bool:
    """Whether a metadata request of a new handle is answered within :data:`PROBE_S`.

    Tells a handle whose call waits because the cluster is away from one that waits although
    the cluster answers (a librdkafka call that never ends)."""
    from confluent_kafka.admin import AdminClient

    try:
        # Quiet: its lines would repeat the handle's own about the same outage.
        probe = AdminClient({**probe_conf, "logger": rdkafka_log, "log_level": 0})
        bounded_call(lambda: probe.list_topics(timeout=PROBE_S), PROBE_S + OVERRUN_S, "probe")
    except Exception:  # noqa: BLE001 - no answer, whatever the reason
        return False
    return True


def librdkafka_config(role: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka properties for kafka-python-named ``config`` (dotted names pass through).

    Examples
    --------
    >>> librdkafka_config("KafkaProducer", {"bootstrap_servers": ["a:1", "b:2"],
    ...                                     "linger_ms": 5, "statistics.interval.ms": 0})
    {'bootstrap.servers': 'a:1,b:2', 'linger.ms': 5, 'statistics.interval.ms': 0}
    """
    table = _ROLES[role]
    out: dict[str, Any] = {}
    for name, value in config.items():
        if "." in name:
            out[name] = value
        elif value is not None:
            out.update(table[name](value))
    return out


def _logging(kind: str) -> dict[str, Any]:
    """Where librdkafka's lines and errors go: the ``kafka.librdkafka`` logger."""
    return {
        "logger": rdkafka_log,
        "log_level": librdkafka_log_level(rdkafka_log),
        "error_cb": _ErrorLog(kind),
    }


class _ErrorLog:
    """librdkafka's client-level errors (broker down, authentication, fatal): logged, and the
    fatal or authentication ones kept for the next call to raise."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.fatal: Any = None

    def __call__(self, err: Any) -> None:
        code = err.code()
        final = err.fatal() or code in _AUTH_CODES
        if final:
            self.fatal = err
        rdkafka_log.log(logging.WARNING if final else logging.DEBUG, "%s: %s", self.kind, err.str())


# -- errors ----------------------------------------------------------------------------------

_AUTH_CODES = frozenset({-169, -181})  # _AUTHENTICATION, _SSL


def _local_errors() -> dict[int, type]:
    import kafka.errors as E

    return {
        -185: E.KafkaTimeoutError,  # _TIMED_OUT
        -192: E.KafkaTimeoutError,  # _MSG_TIMED_OUT
        -166: E.KafkaTimeoutError,  # _TIMED_OUT_QUEUE
        -184: E.KafkaTimeoutError,  # _QUEUE_FULL
        -152: E.KafkaTimeoutError,  # _PURGE_QUEUE: dropped with a discarded producer
        -151: E.KafkaTimeoutError,  # _PURGE_INFLIGHT
        -195: E.KafkaConnectionError,  # _TRANSPORT
        -187: E.KafkaConnectionError,  # _ALL_BROKERS_DOWN
        -193: E.KafkaConnectionError,  # _RESOLVE
        -180: E.CoordinatorNotAvailableError,  # _WAIT_COORD
        -144: E.ProducerFencedError,  # _FENCED
        -172: E.IllegalStateError,  # _STATE
        -169: E.SaslAuthenticationFailedError,  # _AUTHENTICATION
        -181: E.SaslAuthenticationFailedError,  # _SSL
        -186: E.KafkaConfigurationError,  # _INVALID_ARG
        -188: E.UnknownTopicOrPartitionError,  # _UNKNOWN_TOPIC
        -190: E.UnknownTopicOrPartitionError,  # _UNKNOWN_PARTITION
        -140: E.OffsetOutOfRangeError,  # _AUTO_OFFSET_RESET
        -168: E.NoOffsetForPartitionError,  # _NO_OFFSET
        -165: E.UnsupportedVersionError,  # _UNSUPPORTED_FEATURE
        -170: E.UnsupportedVersionError,  # _NOT_IMPLEMENTED
    }


_LOCAL: dict[int, type] = {}


def kafka_error(err: Any, *args: Any) -> BaseException:
    """The ``kafka.errors`` exception for a librdkafka ``KafkaError`` (its message kept).

    Broker error codes are Kafka's own (``kafka.errors.for_code``); librdkafka's local codes
    are mapped by meaning. An error librdkafka calls retriable stays retriable.
    """
    import kafka.errors as E

    if not _LOCAL:
        _LOCAL.update(_local_errors())
    code = err.code()
    cls = _LOCAL.get(code, E.KafkaError) if code < 0 else E.for_code(code)
    exc = cls(*args) if args else cls(err.str())
    if not getattr(exc, "retriable", False) and err.retriable() and not err.fatal():
        exc.retriable = True
    return exc


def _raise(exc: BaseException, fatal: _ErrorLog | None = None) -> BaseException:
    """The connectors' error for a ``KafkaException`` (or the exception itself).

    A fatal error inside ``flush`` reaches Python as a ``SystemError`` (the binding calls the
    delivery callbacks of the purged messages with the ``KafkaException`` already pending), so
    the ``KafkaException`` is looked for down the exception's chain.
    """
    from confluent_kafka import KafkaError, KafkaException

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, KafkaException):
        cause = cause.__cause__ or cause.__context__
    if cause is None or not cause.args:
        return exc
    exc = cause
    err = exc.args[0]
    if not isinstance(err, KafkaError):
        return exc
    if err.code() == KafkaError._FATAL and fatal is not None and fatal.fatal is not None:
        err = fatal.fatal  # the cause, e.g. fenced, rather than "a fatal error happened"
    return kafka_error(err)


# -- the client ------------------------------------------------------------------------------


class ConfluentClient(Client):
    """confluent-kafka (librdkafka, C) behind the connectors' interface."""

    name = "confluent-kafka"
    pins_partitions = False  # librdkafka partitions in C, with murmur2 (set below)

    def settings(self, role: str) -> Collection[str]:
        return _ROLES[role]

    def unknown_settings(self, role: str, names: Any) -> list[str]:
        known = _ROLES[role]
        return sorted(n for n in names if n not in known and "." not in n)

    def consumer(self, **config: Any) -> ConfluentConsumer:
        return ConfluentConsumer(config)

    def producer(self, **config: Any) -> ConfluentProducer:
        return ConfluentProducer(config)

    def admin(self, **config: Any) -> ConfluentAdmin:
        return ConfluentAdmin(config)


def _construct(cls: type, conf: dict[str, Any]) -> Any:
    """A librdkafka handle; a setting it refuses is a configuration error."""
    from confluent_kafka import KafkaException
    from kafka.errors import KafkaConfigurationError

    try:
        return cls(conf)
    except KafkaException as exc:
        raise KafkaConfigurationError(str(exc.args[0].str())) from None


def _tp(ctp: Any) -> Any:
    from kafka import TopicPartition

    return TopicPartition(ctp.topic, ctp.partition)


class _Record:
    """One consumed message, with kafka-python's ``ConsumerRecord`` attribute names."""

    __slots__ = ("key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(self, msg: Any) -> None:
        self.topic = msg.topic()
        self.partition = msg.partition()
        self.offset = msg.offset()
        self.key = msg.key()
        self.value = msg.value()
        self.timestamp = msg.timestamp()[1]


class ConfluentConsumer:
    """``confluent_kafka.Consumer`` with the calls of ``kafka.KafkaConsumer`` the connectors
    make (``Consumer`` in :mod:`connectors.transport`)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        from confluent_kafka import Consumer

        config = dict(config)
        self.max_poll_records = int(config.pop("max_poll_records", 500))
        self.request_timeout_s = int(config.get("request_timeout_ms", 30_000)) / 1000
        # A metadata request waits at most this for a broker, like kafka-python's bootstrap.
        self.metadata_timeout_s = min(
            self.request_timeout_s, int(config.get("bootstrap_timeout_ms", 30_000)) / 1000
        )
        if not config.get("group_id"):
            # librdkafka needs a group even to read: one of this consumer's own, never joined
            # and never committed to.
            import uuid

            config["group_id"] = f"stream-dp-reader-{uuid.uuid4().hex}"
        self._errors = _ErrorLog("consumer")
        #: Where a new handle finds the cluster (:meth:`_cluster_answers`).
        self._probe_conf = _probe_config(config)
        self._c = _construct(
            Consumer,
            {
                "enable.partition.eof": False,
                # kafka-python's default, not librdkafka's 1 ms: records arrive in batches.
                "fetch.wait.max.ms": 500,
                **librdkafka_config("KafkaConsumer", config),
                **_logging("consumer"),
            },
        )
        #: The offset of the next record of each partition, as far as this consumer knows:
        #: where a re-assignment resumes it.
        self._next: dict[Any, int] = {}
        self._paused: set[Any] = set()
        self._pending: BaseException | None = None
        self._listener: Any = None
        self._closed = False
        #: The last offset commit, while librdkafka has not answered it: later commits wait for
        #: it rather than pile up behind it.
        self._commit: _Commit | None = None
        self._commit_lock = threading.Lock()
        #: Whether a call on this handle outlived its bound while the cluster answered
        #: (librdkafka issue #3740: a commit that never ends): its group offsets are better
        #: committed and read by another consumer.
        self.wedged = False
        #: Whether this handle's metadata requests fail while a new handle's are answered
        #: (seen after a broker restart): a reader is better replaced.
        self.stale = False
        self._stale_probe_at = 0.0
        #: Called with the offsets of a commit given up on that succeeded after all.
        self.on_late_commit: Callable[[dict], None] | None = None

    def _ctp(self, tp: Any, offset: int | None = None, metadata: str | None = None) -> Any:
        from confluent_kafka import TopicPartition

        if offset is None:
            return TopicPartition(tp.topic, tp.partition)
        if metadata is None:
            return TopicPartition(tp.topic, tp.partition, offset)
        return TopicPartition(tp.topic, tp.partition, offset, metadata)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from confluent_kafka import KafkaException

        try:
            return fn(*args, **kwargs)
        except KafkaException as exc:
            raise _raise(exc, self._errors) from None

    # -- metadata and offsets ------------------------------------------------------------
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        from kafka.errors import KafkaConnectionError

        try:
            md = self._bounded(
                "reading the topic's partitions",
                self.metadata_timeout_s,
                self._c.list_topics,
                topic,
            )
        except KafkaConnectionError:
            # After a broker restart a handle can go on failing its metadata requests at once
            # ("broker transport failure") while the broker answers others. Asked at most every
            # STALE_PROBE_EVERY_S: through an outage each probe waits PROBE_S for nothing.
            now = time.monotonic()
            if not self.stale and now >= self._stale_probe_at:
                self._stale_probe_at = now + STALE_PROBE_EVERY_S
                if self._cluster_answers():
                    self.stale = True
                    rdkafka_log.debug("metadata requests fail while the cluster answers: stale")
            raise
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            if t is not None and t.error is not None and t.error.code() not in (3, -188):
                raise kafka_error(t.error)
            return None
        return set(t.partitions)

    def committed(self, partition: Any, metadata: bool = False, timeout_ms: int | None = None):
        from kafka import OffsetAndMetadata

        timeout = self.request_timeout_s if timeout_ms is None else timeout_ms / 1000
        deadline = time.monotonic() + timeout
        backoff = Backoff(
            initial=0.05, maximum=1.0, logger=rdkafka_log, what="reading the committed offset"
        )
        while True:
            try:
                (got,) = self._bounded(
                    "reading the committed offset",
                    max(deadline - time.monotonic(), 0.05),
                    self._c.committed,
                    [self._ctp(partition)],
                )
                if got.error is not None:
                    raise kafka_error(got.error)
                break
            except Exception as err:
                # The group's coordinator moves or loads (a broker that just started creates
                # its offsets topic): kafka-python asks again until its timeout, and so here.
                pause = backoff.next_delay()  # quietly: a loading coordinator is no outage
                if type(err).__name__ not in _COORDINATOR_MOVING or (
                    time.monotonic() + pause >= deadline
                ):
                    raise
                time.sleep(pause)
        if got.offset < 0:
            return None
        return OffsetAndMetadata(got.offset, got.metadata or "", -1) if metadata else got.offset

    def _watermarks(self, partitions: list[Any], timeout_ms: int | None, which: int) -> dict:
        timeout = self.request_timeout_s if timeout_ms is None else timeout_ms / 1000
        out = {}
        for tp in partitions:
            marks = self._bounded(
                "reading the log's offsets",
                timeout,
                self._c.get_watermark_offsets,
                self._ctp(tp),
                cached=False,
            )
            out[tp] = marks[which]
        return out

    def beginning_offsets(self, partitions: list[Any], timeout_ms: int | None = None) -> dict:
        return self._watermarks(partitions, timeout_ms, 0)

    def end_offsets(self, partitions: list[Any], timeout_ms: int | None = None) -> dict:
        # With read_committed, the last stable offset (as kafka-python's).
        return self._watermarks(partitions, timeout_ms, 1)

    def _bounded(self, what: str, timeout: float, fn: Callable[..., Any], *args: Any, **kw: Any):
        """``fn(*args, timeout=timeout, **kw)``, given up on (a retriable timeout) when
        librdkafka overruns its own timeout by :data:`OVERRUN_S` (as it does behind a commit
        of this handle without an answer); see :meth:`_judge`."""
        from kafka.errors import KafkaTimeoutError

        ended = threading.Event()

        def call() -> Any:
            try:
                return self._call(fn, *args, timeout=timeout, **kw)
            finally:
                ended.set()

        try:
            return bounded_call(
                call, timeout + OVERRUN_S, f"{what}: no answer within {timeout + OVERRUN_S:.1f} s"
            )
        except KafkaTimeoutError:
            if not ended.is_set():  # librdkafka's own timeout is an answer; this is none
                self._judge(f"{what}: no answer")
            raise

    def commit(self, offsets: dict[Any, Any] | None = None, timeout_ms: int | None = None):
        """Commit ``offsets`` synchronously, waiting at most ``timeout_ms``.

        librdkafka's synchronous commit has no timeout, and one made while the group
        coordinator is away can go on without end (librdkafka issue #3740). It runs in a
        worker thread; past the bound it is given up on (a retriable ``KafkaTimeoutError``:
        never taken for a success) and the next commit waits for it first, as librdkafka
        would answer them in order anyway. A commit given up on while the cluster answers a
        metadata request marks the handle :attr:`wedged`; one that succeeds after all is
        reported to :attr:`on_late_commit`.
        """
        from kafka.errors import KafkaTimeoutError

        if not offsets:
            return
        timeout = self.request_timeout_s if timeout_ms is None else timeout_ms / 1000
        deadline = time.monotonic() + timeout
        with self._commit_lock:
            job = self._commit
            if job is not None and not job.finished.wait(timeout):
                self._judge(f"offset commit without an answer for {job.age():.1f} s")
                raise KafkaTimeoutError(
                    f"offset commit: the commit before, begun {job.age():.1f} s ago, has had "
                    "no answer"
                )
            parts = [self._ctp(tp, m.offset, m.metadata or "") for tp, m in offsets.items()]
            job = self._commit = _Commit(self, parts, dict(offsets))
            job.start()
            if not job.finished.wait(max(0.0, deadline - time.monotonic())) and job.abandon():
                self._judge(f"offset commit without an answer for {job.age():.1f} s")
                raise KafkaTimeoutError(f"offset commit: no answer within {timeout:.1f} s")
            self._commit = None
        if job.error is not None:
            raise job.error
        for ctp in job.result or ():
            if ctp.error is not None:
                raise kafka_error(ctp.error)

    def _judge(self, what: str) -> None:
        """A call past its bound: the handle is :attr:`wedged` if the cluster answers
        meanwhile. An outage is not: librdkafka ends a commit that waits for its coordinator
        after ``session.timeout.ms``, and answers this handle's commits in order."""
        if not self.wedged and self._cluster_answers():
            self.wedged = True
            rdkafka_log.debug("%s while the cluster answers: this consumer is wedged", what)

    def _cluster_answers(self) -> bool:
        return _cluster_answers(self._probe_conf)

    def group_metadata(self) -> Any:
        return self._call(self._c.consumer_group_metadata)

    # -- assignment ------------------------------------------------------------------------
    def assign(self, partitions: list[Any]) -> None:
        self._paused.clear()
        self._call(self._c.assign, [self._ctp(tp) for tp in partitions])

    def assignment(self) -> set[Any]:
        return {_tp(c) for c in self._call(self._c.assignment)}

    def seek(self, partition: Any, offset: int) -> None:
        from confluent_kafka import KafkaError, KafkaException

        self._next[partition] = offset
        try:
            self._c.seek(self._ctp(partition, offset))
            return
        except KafkaException as exc:
            if exc.args[0].code() not in (KafkaError._STATE, KafkaError._OUTDATED):
                raise _raise(exc, self._errors) from None
        # Assigned a moment ago, its fetcher not started (librdkafka refuses to seek it), or
        # the seek overtaken by the assignment's own start (outdated, seen under load): assign
        # again with the offsets known, which is where a seek would have put them.
        self._reassign()

    def _reassign(self) -> None:
        from confluent_kafka import OFFSET_INVALID

        current = [_tp(c) for c in self._call(self._c.assignment)]
        self._call(
            self._c.assign, [self._ctp(tp, self._next.get(tp, OFFSET_INVALID)) for tp in current]
        )
        paused = [self._ctp(tp) for tp in current if tp in self._paused]
        if paused:
            self._call(self._c.pause, paused)

    def position(self, partition: Any, timeout_ms: int | None = None) -> int:
        (got,) = self._call(self._c.position, [self._ctp(partition)])
        if got.offset >= 0:
            return got.offset
        return self._next[partition]

    def pause(self, *partitions: Any) -> None:
        self._paused.update(partitions)
        self._call(self._c.pause, [self._ctp(tp) for tp in partitions])

    def resume(self, *partitions: Any) -> None:
        self._paused.difference_update(partitions)
        self._call(self._c.resume, [self._ctp(tp) for tp in partitions])
        # librdkafka's fetcher, with nothing to fetch, sees which partitions became fetchable
        # only when it next wakes, up to 1 s later; a metadata response wakes it. With one
        # asked for here, 4 partitions just taken up gave their first records 22-30 ms after
        # the resume instead of 1.0 s. An assignment wakes it too, but assigning them again here
        # made scale-out fail 1 run in 12 (a partition handed on while its old owner still held
        # it; an assignment made while the group rebalances may stand in for the listener's).
        if not partitions:
            return
        from kafka.errors import KafkaError

        try:
            # Bounded as every metadata request of this handle: one queued behind a commit
            # without an answer overruns librdkafka's own timeout.
            self._bounded("waking the fetcher", 1.0, self._c.list_topics, partitions[0].topic)
        except KafkaError:
            pass  # only a wake-up: the fetcher wakes by itself within a second

    # -- group membership ----------------------------------------------------------------
    def subscribe(self, topics: list[str], listener: Any = None) -> None:
        """Join the group; ``listener`` has kafka-python's ``ConsumerRebalanceListener``
        methods, called from :meth:`poll` as kafka-python calls them."""
        self._listener = listener
        if listener is None:
            self._call(self._c.subscribe, list(topics))
            return
        self._call(
            self._c.subscribe,
            list(topics),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        # Assigned before the listener runs, so that it can pause and seek them.
        consumer.assign(partitions)
        self._paused.clear()
        self._listener.on_partitions_assigned([_tp(c) for c in partitions])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._listener.on_partitions_revoked([_tp(c) for c in partitions])
        for c in partitions:
            self._next.pop(_tp(c), None)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        lost = getattr(self._listener, "on_partitions_lost", None)
        tps = [_tp(c) for c in partitions]
        if lost is not None:
            lost(tps)
        else:
            self._listener.on_partitions_revoked(tps)

    # -- records ---------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list]:
        """``{TopicPartition: [record, ...]}``; an error after some records is raised by the
        next call, so that no record fetched before it is lost."""
        from kafka import TopicPartition

        if self._pending is not None:
            err, self._pending = self._pending, None
            raise err
        if self._errors.fatal is not None:
            fatal, self._errors.fatal = self._errors.fatal, None
            raise kafka_error(fatal)
        msgs = self._fetched(max_records or self.max_poll_records, timeout_ms / 1000)
        out: dict[Any, list] = {}
        last: dict[Any, list] | None = None
        key: tuple[str, int] | None = None
        for msg in msgs:
            if msg.error() is not None:
                self._failed(msg)
                continue
            rec = _Record(msg)
            if (rec.topic, rec.partition) != key:
                key = (rec.topic, rec.partition)
                tp = TopicPartition(*key)
                last = out.setdefault(tp, [])
            last.append(rec)
        for tp, recs in out.items():
            self._next[tp] = recs[-1].offset + 1
        if self._pending is not None and not out:
            err, self._pending = self._pending, None
            raise err
        return out

    def _fetched(self, n: int, timeout_s: float) -> list[Any]:
        """Up to n messages, returned as soon as there is one, as kafka-python's poll does.

        librdkafka's ``consume(n, timeout)`` returns only once it has n messages or the timeout
        has passed: with fewer waiting, it waited out the whole timeout (0.5 s for the engine)
        while records sat in its queue: at the end of every drained input, and at every poll
        of an input slower than n records per timeout. What is queued is taken at once;
        with nothing queued, the first message to arrive ends the wait, and what came with it
        is taken too.
        """
        c = self._c
        msgs = self._call(c.consume, n, 0)
        if msgs or timeout_s <= 0:
            return msgs
        first = self._call(c.poll, timeout_s)
        if first is None:
            return []
        return [first, *self._call(c.consume, n - 1, 0)] if n > 1 else [first]

    def _failed(self, msg: Any) -> None:
        import kafka.errors as E
        from confluent_kafka import KafkaError

        err = msg.error()
        if err.code() == KafkaError._PARTITION_EOF or self._pending is not None:
            return
        if err.code() == KafkaError._AUTO_OFFSET_RESET and msg.topic() is not None:
            from kafka import TopicPartition

            tp = TopicPartition(msg.topic(), msg.partition())
            offset, known = msg.offset(), self._next.get(tp)
            # librdkafka resolves a partition's start as it is assigned, before the seek that
            # follows: an error about a position the partition has since been moved off is
            # stale, and acting on it would move it back.
            if offset is None or offset < 0:
                if known is None:
                    self._pending = E.NoOffsetForPartitionError([tp])
            elif known is None or known == offset:
                self._pending = E.OffsetOutOfRangeError({tp: offset})
            return
        self._pending = kafka_error(err)

    def close(self, autocommit: bool = True) -> None:
        """Leave (never commit: auto-commit is off); a broker that is away is not waited for
        (librdkafka would wait up to a session timeout for its coordinator)."""
        from kafka.errors import KafkaTimeoutError

        if self._closed:
            return
        self._closed = True
        try:
            bounded_call(
                lambda: self._call(self._c.close),
                CLOSE_WAIT_S,
                f"closing the consumer: no answer within {CLOSE_WAIT_S:.0f} s",
            )
        except KafkaTimeoutError as err:
            rdkafka_log.debug("%s; left to finish in the background", err)


class _Commit(threading.Thread):
    """One synchronous offset commit, in its own thread so that it can be given up on.

    The thread holds the handle until librdkafka answers; a commit given up on
    (:meth:`abandon`) that succeeds after all is reported to the consumer's
    ``on_late_commit``, whose offsets may now be older than the group's newest.
    """

    def __init__(self, consumer: ConfluentConsumer, parts: list[Any], offsets: dict) -> None:
        super().__init__(name="stream-dp-kafka-commit", daemon=True)
        self.consumer: ConfluentConsumer | None = consumer
        self.parts, self.offsets = parts, offsets
        self.began = time.monotonic()
        self.finished = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._abandoned = False

    def age(self) -> float:
        return time.monotonic() - self.began

    def abandon(self) -> bool:
        """Give it up, unless it has just finished (False: its outcome stands)."""
        with self._lock:
            self._abandoned = not self.finished.is_set()
            return self._abandoned

    def run(self) -> None:
        # No reference back from here: a consumer whose last reference went in a collection of
        # a cycle would be destroyed on whichever thread collects it, and that can wait as
        # long as a commit does.
        consumer, self.consumer = self.consumer, None
        try:
            self.result = consumer._call(consumer._c.commit, offsets=self.parts, asynchronous=False)
        except BaseException as exc:  # noqa: BLE001 - handed to the committing thread
            self.error = exc
        with self._lock:
            # Set before the report: a commit waiting for this one must not wait for it too.
            self.finished.set()
            late = self._abandoned
        ok = self.error is None and all(c.error is None for c in self.result or ())
        report = consumer.on_late_commit
        if late and ok and report is not None:
            try:
                report(self.offsets)
            except Exception:  # noqa: BLE001 - a background thread: logged, never raised
                rdkafka_log.exception("after an offset commit that was given up on")


class _Delivery:
    """A sent message's outcome, kafka-python's future in the parts the connectors read.

    The callback only stores librdkafka's error: it can run while the binding already holds a
    pending exception (a fatal error inside ``flush``), when any call on the error object fails;
    the error is translated when it is read.
    """

    __slots__ = ("_err", "is_done")

    def __init__(self) -> None:
        self.is_done = False
        self._err: Any = None

    def __call__(self, err: Any, msg: Any) -> None:
        self._err = err
        self.is_done = True

    @property
    def exception(self) -> BaseException | None:
        return None if self._err is None else kafka_error(self._err)

    def succeeded(self) -> bool:
        return self.is_done and self._err is None

    def failed(self) -> bool:
        return self.is_done and self._err is not None


class _InFlight:
    """``init_transactions`` calls in progress, per transactional id (across producers).

    Only that call is followed: a handle that has not finished it may still register with
    the broker, and a registration after a newer producer's would fence the newer one. A
    handle past it holds an epoch that the next producer's ``init_transactions`` bumps, after
    which the broker refuses whatever the old handle still sends (its offsets, its commit), so
    its calls are not waited for; librdkafka can keep one of them going without end
    (``send_offsets_to_transaction`` while its group coordinator is away outlives its
    timeout), and waiting for it would stop every later producer of the id.
    """

    def __init__(self) -> None:
        self._calls: dict[str, int] = {}
        self._changed = threading.Condition()

    def enter(self, txn_id: str) -> None:
        with self._changed:
            self._calls[txn_id] = self._calls.get(txn_id, 0) + 1

    def leave(self, txn_id: str) -> None:
        with self._changed:
            self._calls[txn_id] -= 1
            if not self._calls[txn_id]:
                del self._calls[txn_id]
            self._changed.notify_all()

    def wait_idle(self, txn_id: str, timeout_s: float) -> None:
        """Wait until no ``init_transactions`` of ``txn_id`` is in progress; a timeout is a
        retriable error."""
        from kafka.errors import KafkaTimeoutError

        with self._changed:
            if not self._changed.wait_for(lambda: txn_id not in self._calls, timeout_s):
                raise KafkaTimeoutError(
                    f"a discarded producer of transactional id {txn_id!r} is still in "
                    "init_transactions"
                )


_IN_FLIGHT = _InFlight()


class ConfluentProducer:
    """``confluent_kafka.Producer`` with the calls of ``kafka.KafkaProducer`` the connectors
    make (``Producer`` in :mod:`connectors.transport`)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        from confluent_kafka import Producer

        config = dict(config)
        self.max_block_s = int(config.get("max_block_ms", 60_000)) / 1000
        #: Bound on each transactional call (like a delivery: kafka-python's default, 120 s).
        #: librdkafka goes on with a call that timed out until its handle is destroyed, which
        #: happens when the call returns to an abandoned attempt: a caller that abandons
        #: attempts sooner (the transactional publisher) lowers this to its own bound, so that
        #: no discarded producer finishes ``init_transactions`` after a newer one has, fencing
        #: it.
        self.txn_timeout_s = int(config.get("delivery_timeout_ms", 120_000)) / 1000
        self._errors = _ErrorLog("producer")
        conf = {
            # kafka-python's defaults where librdkafka's differ and matter here.
            "message.timeout.ms": 120_000,
            "partitioner": "murmur2_random",
            **librdkafka_config("KafkaProducer", config),
            **_logging("producer"),
        }
        if "transactional.id" in conf and "transaction.timeout.ms" not in conf:
            # librdkafka requires a delivery to fit in a transaction (kafka-python does not
            # check): the broker's default transaction timeout, or the delivery timeout.
            conf["transaction.timeout.ms"] = max(60_000, conf["message.timeout.ms"])
        self._p = _construct(Producer, conf)
        self.transactional_id = conf.get("transactional.id")
        self._topics: set[str] = set()
        self._probe_conf = _probe_config(config)

    def cluster_answers(self) -> bool:
        """Whether a new handle's metadata request is answered (:func:`_cluster_answers`): a
        transactional call of this one still waiting then may never end (librdkafka issue
        #5456), and the transactional publisher abandons it."""
        return _cluster_answers(self._probe_conf)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from confluent_kafka import KafkaException

        try:
            return fn(*args, **kwargs)
        except KafkaException as exc:
            raise _raise(exc, self._errors) from None

    def _await_metadata(self, topic: str) -> None:
        """Wait for the topic's partitions, as kafka-python's first send to a topic does."""
        from kafka.errors import KafkaTimeoutError

        deadline = time.monotonic() + self.max_block_s
        while True:
            left = deadline - time.monotonic()
            try:
                md = self._call(self._p.list_topics, topic, timeout=max(left, 0.05))
                t = md.topics.get(topic)
                if t is not None and t.error is None and t.partitions:
                    self._topics.add(topic)
                    return
            except Exception as err:  # noqa: BLE001 - retried until max_block_ms
                if not getattr(err, "retriable", False):
                    raise
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(
                    f"Failed to update metadata after {self.max_block_s:.1f} secs."
                )
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))

    def partitions_for(self, topic: str) -> set[int]:
        md = self._call(self._p.list_topics, topic, timeout=self.max_block_s)
        return set(md.topics[topic].partitions)

    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> _Delivery:
        if topic not in self._topics:
            self._await_metadata(topic)
        done = _Delivery()
        deadline = None
        while True:
            try:
                if partition is None:
                    self._p.produce(topic, value, key, on_delivery=done)
                else:
                    self._p.produce(topic, value, key, partition, on_delivery=done)
                break
            except BufferError:
                # The queue is full: wait for deliveries, at most max_block_ms (kafka-python's
                # rule for a full buffer).
                from kafka.errors import KafkaTimeoutError

                now = time.monotonic()
                deadline = deadline or now + self.max_block_s
                if now >= deadline:
                    raise KafkaTimeoutError(
                        f"no room in the producer's queue within {self.max_block_s:.1f} s"
                    ) from None
                self._p.poll(0.05)
            except Exception as exc:  # noqa: BLE001 - KafkaException, translated
                raise _raise(exc, self._errors) from None
        self._p.poll(0)  # serve delivery reports
        return done

    def flush(self, timeout: float | None = None) -> None:
        from kafka.errors import KafkaTimeoutError

        try:
            left = self._p.flush(-1 if timeout is None else timeout)
        except Exception as exc:  # noqa: BLE001 - KafkaException, translated
            raise _raise(exc, self._errors) from None
        if left:
            raise KafkaTimeoutError(f"{left} message(s) not delivered within {timeout} s")

    # -- transactions ----------------------------------------------------------------------
    def _txn_call(self, name: str, *args: Any, registers: bool = False) -> None:
        """One transactional call; one that ``registers`` the handle with the broker
        (``init_transactions``) is counted in flight for its transactional id (:class:`_InFlight`).

        The handle is held by a local that is deleted before the count drops: when the
        producer was closed meanwhile (an abandoned attempt), the handle is destroyed right
        there, and librdkafka stops whatever the call left going.
        """
        from confluent_kafka import KafkaException

        producer = self._p
        if producer is None:
            raise ValueError("the producer is closed")
        if registers:
            _IN_FLIGHT.enter(self.transactional_id)
        try:
            getattr(producer, name)(*args)
        except KafkaException as exc:
            raise _raise(exc, self._errors) from None
        finally:
            del producer
            if registers:
                _IN_FLIGHT.leave(self.transactional_id)

    def init_transactions(self) -> None:
        # A discarded producer of this transactional id may still be in this call (its attempt
        # was abandoned): until it ends, its handle could still register with the broker
        # after this one, and fence it.
        _IN_FLIGHT.wait_idle(self.transactional_id, self.txn_timeout_s)
        self._connect()
        self._txn_call("init_transactions", self.txn_timeout_s, registers=True)

    def _connect(self) -> None:
        """Have a broker connection up before the producer asks for its producer id.

        librdkafka's transactional producer that finds no broker connection up when it first
        looks for its transaction coordinator looks again only 500 ms later: on the project's
        broker 6 of 48 fresh producers took 0.51 s in ``init_transactions`` instead of 0.056 s,
        and an engine on confluent-kafka learned its first record 0.73 s after its start
        instead of 0.29 s. A metadata request waits for a connection: with one first, 0 of 48
        were slow. It touches no transactional state, and a failure is ignored (without a
        broker, ``init_transactions`` waits and reports as it always did); bounded at 1 s.
        """
        from confluent_kafka import KafkaException

        handle = self._p
        if handle is None:
            return
        try:
            handle.list_topics(timeout=min(1.0, self.txn_timeout_s))
        except KafkaException:
            pass

    def begin_transaction(self) -> None:
        self._txn_call("begin_transaction")

    def send_offsets_to_transaction(self, offsets: dict, group_metadata: Any) -> None:
        from confluent_kafka import TopicPartition

        if group_metadata is None or isinstance(group_metadata, str):
            raise ValueError(
                "confluent-kafka commits offsets in a transaction only with the consumer's group "
                "metadata (KIP-447): offsets from a confluent-kafka source carry it"
            )
        parts = [
            TopicPartition(tp.topic, tp.partition, m.offset, m.metadata or "")
            for tp, m in offsets.items()
        ]
        self._txn_call("send_offsets_to_transaction", parts, group_metadata, self.txn_timeout_s)

    def commit_transaction(self) -> None:
        self._txn_call("commit_transaction", self.txn_timeout_s)
        producer = self._p
        if producer is not None:  # (closed meanwhile if this attempt was abandoned)
            producer.poll(0)  # serve the batch's delivery reports

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued within ``timeout``, drop the rest; the handle is released
        when this object goes (librdkafka's destroy does not wait for a broker)."""
        if self._p is None:
            return
        from kafka.errors import KafkaTimeoutError

        left = self._p.flush(0 if timeout is None else timeout)
        if left:
            self._p.purge()
            self._p.flush(0)
        self._p = None
        if left:
            raise KafkaTimeoutError(f"{left} message(s) dropped at close")


class ConfluentAdmin:
    """``confluent_kafka.admin.AdminClient`` behind :class:`connectors.transport.TopicAdmin`,
    connected: construction fails like ``KafkaAdminClient``'s when no session comes up."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        from confluent_kafka.admin import AdminClient

        config = dict(config)
        self.timeout_s = int(config.get("request_timeout_ms", 30_000)) / 1000
        bootstrap_s = int(config.get("bootstrap_timeout_ms", 30_000)) / 1000
        self._errors = _ErrorLog("admin")
        self._a = _construct(
            AdminClient,
            {
                # Its handle is a producer's, which would create a topic it only describes.
                "allow.auto.create.topics": False,
                **librdkafka_config("KafkaConsumer", config),
                **_logging("admin"),
            },
        )
        try:
            self._call(self._a.list_topics, timeout=bootstrap_s)
        finally:
            self._a.poll(0)  # hand librdkafka's lines to the logger (a probe's diagnosis)
        if self._errors.fatal is not None:
            raise kafka_error(self._errors.fatal)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from confluent_kafka import KafkaException

        try:
            return fn(*args, **kwargs)
        except KafkaException as exc:
            raise _raise(exc, self._errors) from None

    def topic_partitions(self, topics: list[str]) -> dict[str, int | str | None]:
        import kafka.errors as E

        out: dict[str, int | str | None] = {}
        for topic in topics:
            md = self._call(self._a.list_topics, topic, timeout=self.timeout_s)
            t = md.topics.get(topic)
            if t is None or (t.error is not None and t.error.code() in (3, -188)):
                out[topic] = None
            elif t.error is not None:
                out[topic] = type(kafka_error(t.error)).__name__
            elif not t.partitions:
                out[topic] = E.LeaderNotAvailableError.__name__
            else:
                out[topic] = len(t.partitions)
        return out

    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic

        spec = NewTopic(topic, num_partitions=partitions, config=dict(configs or {}))
        future = self._a.create_topics([spec], request_timeout=self.timeout_s)[topic]
        try:
            future.result(timeout=self.timeout_s)
        except KafkaException as exc:
            raise _raise(exc, self._errors) from None
        # Like kafka-python's wait_for_metadata: the topic is usable when this returns.
        deadline = time.monotonic() + self.timeout_s
        while self.topic_partitions([topic]).get(topic) != partitions:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)

    def topic_config(self, topic: str, name: str) -> str | None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource

        future = self._a.describe_configs(
            [ConfigResource("topic", topic)], request_timeout=self.timeout_s
        )
        try:
            (result,) = [f.result(timeout=self.timeout_s) for f in future.values()]
        except KafkaException as exc:
            raise _raise(exc, self._errors) from None
        entry = result.get(name)
        return None if entry is None else entry.value

    def describe_group(self, group: str) -> GroupDescription:
        from confluent_kafka import KafkaException

        future = self._a.describe_consumer_groups([group], request_timeout=self.timeout_s)[group]
        try:
            found = future.result(timeout=self.timeout_s)
        except KafkaException as exc:
            if exc.args and getattr(exc.args[0], "code", lambda: None)() == 69:
                return GroupDescription(group, "Dead", ())  # GROUP_ID_NOT_FOUND (KIP-1043)
            raise _raise(exc, self._errors) from None
        members = tuple(
            GroupMember(
                member_id=m.member_id,
                client_id=m.client_id,
                host=str(m.host or "").lstrip("/"),
                assignment=tuple(
                    sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)
                ),
            )
            for m in found.members
        )
        state = _GROUP_STATES.get(found.state.name, found.state.name.title())
        return GroupDescription(group, state, members)

    def close(self) -> None:
        self._a.poll(0)


#: Errors of a group's offsets that say to ask again: its coordinator is moving or loading.
_COORDINATOR_MOVING = frozenset(
    {"NotCoordinatorError", "CoordinatorLoadInProgressError", "CoordinatorNotAvailableError"}
)

#: librdkafka's consumer group states by the names the group coordinator gives them.
_GROUP_STATES = {
    "UNKNOWN": "Unknown",
    "PREPARING_REBALANCING": "PreparingRebalance",
    "COMPLETING_REBALANCING": "CompletingRebalance",
    "STABLE": "Stable",
    "DEAD": "Dead",
    "EMPTY": "Empty",
}


def librdkafka_log_level(logger: logging.Logger) -> int:
    """librdkafka's ``log_level`` (syslog severity) for what ``logger`` lets through.

    librdkafka formats no line that would be dropped anyway: the level of the ``kafka`` logger
    governs both clients.

    Examples
    --------
    >>> quiet = logging.getLogger("kafka.librdkafka.example")
    >>> quiet.setLevel(logging.WARNING)
    >>> librdkafka_log_level(quiet)
    4
    """
    level = logger.getEffectiveLevel()
    if level <= logging.DEBUG:
        return 7
    if level <= logging.INFO:
        return 6
    if level <= logging.WARNING:
        return 4
    if level <= logging.ERROR:
        return 3
    return 2
