"""The Kafka client behind the connectors: one small interface, two implementations.

Every connector that talks to Kafka (:class:`~connectors.sources.KafkaSource`,
:class:`~connectors.partition.PartitionSource`, :class:`~connectors.sinks.KafkaSink`,
:class:`~connectors.transactions.TransactionalPublisher`, :mod:`connectors.admin`) reaches the
broker through a :class:`Client`, chosen by name with :func:`connectors.clients.client`:

* ``"kafka-python"`` (the default) -- pure Python, a core dependency. Its consumer and producer
  *are* the interface: the connectors call them exactly as they always did.
* ``"confluent-kafka"`` -- librdkafka, in C (the optional ``confluent`` extra). Several times
  faster per message; :mod:`connectors._confluent` adapts it to the same calls.

The interface is the part of kafka-python's API the connectors use, and so is its vocabulary:
settings are named as kafka-python names them (``bootstrap_servers``, ``security_protocol``,
``max_request_size``, ...; librdkafka's own dotted names are also accepted by
``confluent-kafka``), topic partitions are ``kafka.TopicPartition`` and offsets
``kafka.OffsetAndMetadata``, and errors are the classes of ``kafka.errors``. So the
exactly-once contract, fencing, outage handling and every error message are written once, in
the connectors, and hold on both clients.

Both clients log through the ``kafka`` logger hierarchy (librdkafka's lines as
``kafka.librdkafka``), so one setting quiets either.

This module is the interface alone: it imports neither implementation, and
:mod:`connectors.clients` (the factory) imports both.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Client",
    "Consumer",
    "GroupDescription",
    "GroupMember",
    "GroupOffsets",
    "Producer",
    "TopicAdmin",
]


class GroupOffsets(dict):
    """Offsets for a transaction, ``{TopicPartition: OffsetAndMetadata}``, with the group
    metadata of the consumer that read them (KIP-447).

    The transactional offset commit carries the consumer's group id, generation and member id,
    so the broker refuses offsets sent on behalf of a consumer that has left the group or
    whose generation has passed (a zombie after a rebalance). A source's ``offsets()`` returns
    them, and :meth:`connectors.transactions.TransactionalPublisher.publish` passes the
    metadata on.

    Parameters
    ----------
    offsets : mapping
    group_metadata : object
        ``consumer.group_metadata()`` of the client that consumed (its own type on each client).

    Examples
    --------
    >>> o = GroupOffsets({("t", 0): 5}, group_metadata="g")
    >>> dict(o), o.group_metadata
    ({('t', 0): 5}, 'g')
    """

    __slots__ = ("group_metadata",)

    def __init__(self, offsets: Mapping[Any, Any] | Iterable[Any] = (), group_metadata: Any = None):
        super().__init__(offsets)
        self.group_metadata = group_metadata


@dataclass(frozen=True)
class GroupMember:
    """One member of a consumer group as the group coordinator describes it.

    Attributes
    ----------
    member_id : str
        The coordinator's id of the member (changes at each join).
    client_id : str
        The ``client_id`` the member's consumer was created with.
    host : str
        The address the member connected from.
    assignment : tuple of (str, int)
        The ``(topic, partition)`` pairs the group's current generation gives the member.
    """

    member_id: str
    client_id: str
    host: str
    assignment: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class GroupDescription:
    """A consumer group's state and members (``TopicAdmin.describe_group``).

    Attributes
    ----------
    group_id : str
    state : str
        The coordinator's name for it: ``"Stable"``, ``"Empty"`` (no member; its committed
        offsets kept), ``"PreparingRebalance"``, ``"CompletingRebalance"``, or ``"Dead"``
        (the group does not exist).
    members : tuple of GroupMember

    Examples
    --------
    >>> g = GroupDescription("g", "Stable", (GroupMember("m-1", "c", "/10.0.0.2", (("t", 0),)),))
    >>> g.exists, g.members[0].assignment
    (True, (('t', 0),))
    >>> GroupDescription("g", "Dead", ()).exists
    False
    """

    group_id: str
    state: str
    members: tuple[GroupMember, ...]

    @property
    def exists(self) -> bool:
        """Whether the coordinator knows the group (members, or committed offsets)."""
        return self.state != "Dead"


@runtime_checkable
class Consumer(Protocol):
    """What the connectors call on a consumer (kafka-python's ``KafkaConsumer`` signatures)."""

    def partitions_for_topic(self, topic: str) -> set[int] | None: ...
    def assign(self, partitions: list[Any]) -> None: ...
    def assignment(self) -> set[Any]: ...
    def subscribe(self, topics: list[str], listener: Any = None) -> None: ...
    def seek(self, partition: Any, offset: int) -> None: ...
    def position(self, partition: Any, timeout_ms: int | None = None) -> int: ...
    def pause(self, *partitions: Any) -> None: ...
    def resume(self, *partitions: Any) -> None: ...
    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list]: ...
    def committed(self, partition: Any, metadata: bool = False, timeout_ms: int | None = None): ...
    def beginning_offsets(self, partitions: list[Any], timeout_ms: int | None = None) -> dict: ...
    def end_offsets(self, partitions: list[Any], timeout_ms: int | None = None) -> dict: ...
    def commit(self, offsets: dict[Any, Any] | None = None, timeout_ms: int | None = None): ...
    def group_metadata(self) -> Any: ...
    def close(self, autocommit: bool = True) -> None: ...


@runtime_checkable
class Producer(Protocol):
    """What the connectors call on a producer (kafka-python's ``KafkaProducer`` signatures).

    ``send`` returns a future with ``succeeded()``, ``failed()``, ``is_done`` and
    ``exception``.
    """

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             partition: int | None = None) -> Any: ...  # fmt: skip
    def flush(self, timeout: float | None = None) -> None: ...
    def partitions_for(self, topic: str) -> set[int]: ...
    def init_transactions(self) -> None: ...
    def begin_transaction(self) -> None: ...
    def send_offsets_to_transaction(self, offsets: dict, group_metadata: Any) -> None: ...
    def commit_transaction(self) -> None: ...
    def close(self, timeout: float | None = None) -> None: ...


@runtime_checkable
class TopicAdmin(Protocol):
    """The cluster administration the start-up checks and ``stream-dp status`` need
    (:mod:`connectors.admin`)."""

    def topic_partitions(self, topics: list[str]) -> dict[str, int | str | None]:
        """Partitions of each topic: None if it does not exist, the error's name if the
        cluster refuses to describe it (``TopicAuthorizationFailedError``, ...)."""
        ...

    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        """Create a topic. Raises ``TopicAlreadyExistsError`` if it exists."""
        ...

    def topic_config(self, topic: str, name: str) -> str | None:
        """One setting of a topic, e.g. ``max.message.bytes`` (None if unknown)."""
        ...

    def describe_group(self, group: str) -> GroupDescription:
        """The consumer group's state, members and their current assignment (state ``"Dead"``
        and no member if the group does not exist)."""
        ...

    def close(self) -> None: ...


class Client:
    """A Kafka client library seen through the connectors' interface.

    Attributes
    ----------
    name : str
        ``"kafka-python"`` or ``"confluent-kafka"``.
    pins_partitions : bool
        Whether the transactional publisher should work out each keyed message's partition
        itself (:class:`connectors.transactions._KeyPartitions`): worth it where the client's
        partitioner runs in Python.
    """

    name: str = ""
    pins_partitions: bool = False

    def settings(self, role: str) -> Collection[str]:
        """The setting names a ``role`` (``"KafkaConsumer"`` or ``"KafkaProducer"``) accepts."""
        raise NotImplementedError

    def unknown_settings(self, role: str, names: Iterable[str]) -> list[str]:
        """The names among ``names`` that ``role`` does not know."""
        known = self.settings(role)
        return sorted(n for n in names if n not in known)

    def consumer(self, **config: Any) -> Consumer:
        """A consumer with kafka-python-named ``config``."""
        raise NotImplementedError

    def producer(self, **config: Any) -> Producer:
        """A producer (idempotent, or transactional with ``transactional_id``)."""
        raise NotImplementedError

    def admin(self, **config: Any) -> TopicAdmin:
        """A connected admin client; raises if no Kafka session comes up in time."""
        raise NotImplementedError
