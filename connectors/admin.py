"""Start-up checks against a Kafka cluster, each bounded in time and ending in a diagnosis.

A misconfigured deployment must fail fast with one line that says what is wrong, not retry
forever or look like an idle stream. :func:`connect` reaches the cluster within a deadline
(a TCP probe first, so "connection refused" and "name does not resolve" are told apart from a
TLS or SASL problem); the other functions describe topics and consumer groups, create missing
topics, read a topic's message size limit, look for the latest message of a key at the tail of
a topic, and read the latest message of every key of a (small, compacted) topic.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from typing import Any

from . import clients
from .clients import DEFAULT_CLIENT
from .transport import Client, GroupDescription, TopicAdmin

__all__ = [
    "KafkaProblem",
    "connect",
    "describe_group",
    "ensure_topic",
    "latest_by_key",
    "latest_with_key",
    "topic_max_message_bytes",
    "topic_partitions",
]

log = logging.getLogger(__name__)


class KafkaProblem(RuntimeError):
    """The cluster cannot be used as configured; the message is a one-line diagnosis."""


class _Capture(logging.Handler):
    """Takes the Kafka client's WARNING+ lines while a probe runs: they become its diagnosis."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    @property
    def best(self) -> str | None:
        """The first line naming a connection failure (the cause), else the last one."""
        for line in self.lines:
            if "failed:" in line and "Bootstrap failed" not in line:
                return line
        return self.lines[-1] if self.lines else None


def _servers(bootstrap_servers: str | Sequence[str]) -> list[str]:
    if isinstance(bootstrap_servers, str):
        return [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    return [str(s) for s in bootstrap_servers]


def _tcp(server: str, timeout: float) -> str | None:
    """None if ``host:port`` accepts a TCP connection, else why not."""
    host, sep, port = server.rpartition(":")
    if not sep or not port.isdigit():
        return f"{server!r} is not host:port"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except socket.gaierror as err:
        return f"host {host!r} does not resolve ({err.strerror})"
    except TimeoutError:
        return f"no answer within {timeout:.0f} s (firewall, or wrong host?)"
    except OSError as err:
        return err.strerror or str(err)


def connect(
    bootstrap_servers: str | Sequence[str],
    *,
    timeout_s: float = 20.0,
    what: str = "Kafka",
    client: str | Client = DEFAULT_CLIENT,
    **security: Any,
) -> TopicAdmin:
    """An admin client connected within ``timeout_s``, or a :class:`KafkaProblem`.

    Parameters
    ----------
    bootstrap_servers : str or list of str
    timeout_s : float, default 20.0
        Bound on the whole probe.
    what : str
        Names the configuration the servers come from, for the diagnosis
        (e.g. ``"source.bootstrap_servers"``).
    client : str, default "kafka-python"
        The Kafka client (:mod:`connectors.transport`).
    **security
        ``security_protocol``, ``ssl_cafile``, ``sasl_mechanism``, ...

    Raises
    ------
    KafkaProblem
        No server accepts TCP connections (refused, unresolvable, silent), or TCP works but
        no Kafka session comes up (TLS/SASL settings not those of the listener).

    Examples
    --------
    >>> try:
    ...     connect("127.0.0.1:1", timeout_s=2, what="source.bootstrap_servers")
    ... except KafkaProblem as err:
    ...     print(err)  # doctest: +ELLIPSIS
    cannot reach Kafka at 127.0.0.1:1 (source.bootstrap_servers): ...: Connection refused; ...
    """
    kafka = clients.client(client)
    servers = _servers(bootstrap_servers)
    if not servers:
        raise KafkaProblem(f"{what} is empty")
    started = time.monotonic()
    tcp = {s: _tcp(s, min(5.0, timeout_s / 2)) for s in servers}
    if all(tcp.values()):
        why = "; ".join(f"{s}: {e}" for s, e in tcp.items())
        raise KafkaProblem(
            f"cannot reach Kafka at {', '.join(servers)} ({what}): {why}; is the broker "
            "running and the address right?"
        )
    protocol = str(security.get("security_protocol", "PLAINTEXT")).upper()
    left = max(2.0, timeout_s - (time.monotonic() - started))
    capture = _Capture()
    kafka_log = logging.getLogger("kafka")
    # While probing, the client's lines go to the diagnosis only, not to the log as well.
    saved = kafka_log.propagate, kafka_log.level
    kafka_log.propagate = False
    kafka_log.setLevel(logging.WARNING)
    kafka_log.addHandler(capture)
    try:
        return kafka.admin(
            bootstrap_servers=servers,
            bootstrap_timeout_ms=int(left * 1000),
            request_timeout_ms=int(min(left, 15.0) * 1000),
            **security,
        )
    except Exception as err:  # noqa: BLE001 - every failure becomes a diagnosis
        detail = capture.best or str(err)
        if "SSL" in protocol:
            hint = "is that listener TLS? (a PLAINTEXT listener drops the TLS handshake)"
        elif "SASL" in protocol:
            hint = "check the SASL mechanism and credentials"
        else:
            hint = "does that listener need TLS or SASL (security settings)?"
        raise KafkaProblem(
            f"TCP to {', '.join(s for s, e in tcp.items() if e is None)} works but no Kafka "
            f"session came up within {left:.0f} s with security_protocol={protocol} ({what}): "
            f"{detail}; {hint}"
        ) from None
    finally:
        kafka_log.removeHandler(capture)
        kafka_log.propagate, _ = saved
        kafka_log.setLevel(saved[1])


def topic_partitions(admin: TopicAdmin, topics: Sequence[str]) -> dict[str, int | None]:
    """Number of partitions of each topic (None: the topic does not exist).

    Raises
    ------
    KafkaProblem
        The cluster refuses to describe a topic (not authorised, invalid name).
    """
    out: dict[str, int | None] = {}
    for name, found in admin.topic_partitions(list(topics)).items():
        if isinstance(found, str):
            raise KafkaProblem(f"cannot describe topic {name!r}: {found}")
        out[name] = found
    return out


def ensure_topic(
    admin: TopicAdmin, topic: str, partitions: int = 1, configs: dict[str, str] | None = None
) -> bool:
    """Create ``topic`` if it does not exist; return True if it was created.

    ``configs`` are topic settings (e.g. ``{"cleanup.policy": "compact"}``); the broker's
    defaults apply to everything else (replication factor, retention).

    Raises
    ------
    KafkaProblem
        It could not be created (not authorised, invalid name, ...).
    """
    from kafka.errors import TopicAlreadyExistsError

    if topic_partitions(admin, [topic]).get(topic) is not None:
        return False
    try:
        admin.create_topic(topic, partitions, dict(configs or {}))
    except TopicAlreadyExistsError:
        return False  # created by someone else meanwhile
    except Exception as err:  # noqa: BLE001 - a one-line diagnosis
        raise KafkaProblem(f"topic {topic!r} does not exist and cannot be created: {err}") from None
    return True


def describe_group(admin: TopicAdmin, group: str, timeout_s: float = 15.0) -> GroupDescription:
    """The consumer group's state, members and current assignment.

    A transient error (the group coordinator moving or loading; on a new cluster, the offsets
    topic being created by the first look-up) is retried for ``timeout_s``.

    Raises
    ------
    KafkaProblem
        The cluster refuses to describe it (not authorised, no coordinator in time, ...).
    """
    from ._retry import is_retriable

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin.describe_group(group)
        except Exception as err:  # noqa: BLE001 - a one-line diagnosis
            if not is_retriable(err) or time.monotonic() >= deadline:
                raise KafkaProblem(f"cannot describe consumer group {group!r}: {err}") from None
        time.sleep(0.2)  # a bounded wait for the coordinator, re-asked


def topic_max_message_bytes(admin: TopicAdmin, topic: str) -> int | None:
    """The topic's ``max.message.bytes`` (the broker's limit on one record batch), or None."""
    try:
        value = admin.topic_config(topic, "max.message.bytes")
    except Exception as err:  # noqa: BLE001 - the limit is advisory; the send would still fail
        log.debug("cannot read max.message.bytes of %s: %s", topic, err)
        return None
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _reader(
    bootstrap_servers: str | Sequence[str],
    timeout_s: float,
    client: str | Client,
    *,
    committed: bool = True,
    **config: Any,
) -> Any:
    """A consumer of committed messages (all messages, aborted ones too, without
    ``committed``) that joins no group, each request bounded by ``timeout_s``."""
    return clients.client(client).consumer(
        bootstrap_servers=bootstrap_servers,
        enable_auto_commit=False,
        isolation_level="read_committed" if committed else "read_uncommitted",
        request_timeout_ms=int(timeout_s * 1000) + 1000,
        bootstrap_timeout_ms=int(timeout_s * 1000),
        **config,
    )


#: The first window :func:`latest_with_key` reads back from a partition's end; each next one is
#: this many times longer.
_FIRST_WINDOW, _GROWTH = 8, 8


def latest_with_key(
    bootstrap_servers: str | Sequence[str],
    topic: str,
    key: bytes,
    *,
    tail: int = 2000,
    timeout_s: float = 15.0,
    client: str | Client = DEFAULT_CLIENT,
    committed: bool = True,
    **security: Any,
) -> bytes | None:
    """The value of the newest committed message with ``key`` among the last ``tail`` of each
    partition of ``topic``, or None.

    Without ``committed``, the newest message whether committed, aborted or in an open
    transaction: what a consumer reading uncommitted (Kafka's default) may have seen.

    Each partition is read backwards in growing windows (8, 64, 512, ... offsets from its end,
    up to ``tail``), stopping at the first window that holds the key: the newest message of a
    key that is written often (a checkpoint per commit cycle) costs a read of the last few
    messages, not of the whole tail (checkpoints of megabytes each).

    Raises
    ------
    kafka.errors.KafkaError
        The cluster did not answer in time.
    """
    from kafka import TopicPartition
    from kafka.errors import KafkaTimeoutError

    consumer = _reader(
        bootstrap_servers,
        timeout_s,
        client,
        committed=committed,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        **security,
    )
    try:
        deadline = time.monotonic() + timeout_s
        parts = sorted(consumer.partitions_for_topic(topic) or ())
        tps = [TopicPartition(topic, p) for p in parts]
        if not tps:
            return None
        ends = consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
        begins = consumer.beginning_offsets(tps, timeout_ms=int(timeout_s * 1000))
        # Per partition, the offsets [lo, hi) still to read: the next window back from its end.
        unread = {tp: ends[tp] for tp in tps if ends[tp] > begins[tp]}
        found: dict[Any, tuple[int, bytes]] = {}
        window = _FIRST_WINDOW
        while unread and time.monotonic() < deadline:
            todo = {}
            for tp, hi in unread.items():
                lo = max(begins[tp], ends[tp] - min(window, tail))
                if lo < hi:
                    todo[tp] = (lo, hi)
            if not todo:
                break
            consumer.assign(list(todo))
            for tp, (lo, _) in todo.items():
                consumer.seek(tp, lo)
            newest: dict[Any, tuple[int, int, bytes]] = {}  # tp -> (offset, timestamp, value)
            while todo and time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=500).items():
                    if tp not in todo:
                        continue
                    hi = todo[tp][1]
                    for rec in records:
                        if rec.key == key and rec.offset < hi:
                            if tp not in newest or rec.offset > newest[tp][0]:
                                newest[tp] = (rec.offset, rec.timestamp, rec.value)
                for tp in list(todo):
                    # Transaction markers occupy offsets too: done when the position reaches hi.
                    if consumer.position(tp, timeout_ms=int(timeout_s * 1000)) >= todo[tp][1]:
                        unread[tp] = todo.pop(tp)[0]
            if todo:  # a window read in part: its newest message of the key may be unread
                break
            for tp, (_, ts, value) in newest.items():
                found[tp] = (ts, value)
                del unread[tp]
            unread = {tp: lo for tp, lo in unread.items() if lo > max(begins[tp], ends[tp] - tail)}
            window *= _GROWTH
        if unread and time.monotonic() >= deadline:
            # None or an older message would say "nothing newer" of what was not read.
            raise KafkaTimeoutError(
                f"reading topic {topic!r} back from its end for key {key!r} took more than "
                f"{timeout_s:g} s"
            )
        if not found:
            return None
        return max(found.values(), key=lambda tv: tv[0])[1]
    finally:
        consumer.close(autocommit=False)


def latest_by_key(
    bootstrap_servers: str | Sequence[str],
    topic: str,
    *,
    timeout_s: float = 15.0,
    client: str | Client = DEFAULT_CLIENT,
    **security: Any,
) -> dict[bytes, bytes]:
    """The value of the newest message of every key of ``topic``, read up to the end it has at
    the call (a key whose newest message is a tombstone is left out).

    Meant for small compacted topics (one message per key once compacted); no consumer group
    is joined or committed to.

    Raises
    ------
    kafka.errors.KafkaError
        The cluster did not answer in time, or the topic was not read to its end in
        ``timeout_s``.
    """
    from kafka import TopicPartition
    from kafka.errors import KafkaTimeoutError

    consumer = _reader(bootstrap_servers, timeout_s, client, **security)
    try:
        deadline = time.monotonic() + timeout_s
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not tps:
            return {}
        ends = consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
        begins = consumer.beginning_offsets(tps, timeout_ms=int(timeout_s * 1000))
        todo = {tp for tp in tps if ends[tp] > begins[tp]}
        consumer.assign(sorted(todo, key=lambda tp: tp.partition))
        for tp in todo:
            consumer.seek(tp, begins[tp])
        # A key lives in one partition, whose records come in order: the last one read wins.
        newest: dict[bytes, bytes | None] = {}
        while todo:
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(f"topic {topic!r} not read to its end in {timeout_s:g} s")
            for tp, records in consumer.poll(timeout_ms=500).items():
                for rec in records:
                    if rec.key is not None and rec.offset < ends[tp]:
                        newest[rec.key] = rec.value
            for tp in list(todo):
                # Transaction markers occupy offsets too: done when the position reaches the end.
                if consumer.position(tp, timeout_ms=int(timeout_s * 1000)) >= ends[tp]:
                    todo.discard(tp)
        return {key: value for key, value in newest.items() if value is not None}
    finally:
        consumer.close(autocommit=False)
