"""The Kafka connectors against a real single-node Kafka broker (deploy/kafka/kafka.sh).

Every test runs on each client (the ``kafka_client`` fixture: kafka-python and
confluent-kafka). The broker's own view (committed offsets, what a ``read_committed`` reader
sees) is read with kafka-python's clients throughout, the same observer for both.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from conftest import patience
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from connectors import (
    DeadLetter,
    DeadLetterSink,
    KafkaSink,
    KafkaSource,
    ProducerFenced,
    RecordError,
    SourceMessage,
    TransactionalPublisher,
    parse_record,
)

from .kafka_broker import KafkaBroker

pytestmark = pytest.mark.kafka

# Seconds without records after which a test's source stops: the longest wait for a record
# while records remain is the first fetch (0.8 s at load 6). Stretched by patience()
# (tests/conftest.py) like every deadline here, each >= 5 × the duration it bounds.
IDLE = patience(3.0)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            {topic: {"num_partitions": partitions, "replication_factor": 1}},
            wait_for_metadata=True,
        )
    finally:
        admin.close()


def committed_offsets(bootstrap: str, group: str) -> dict[str, int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    return {f"{tp.topic}:{tp.partition}": meta.offset for tp, meta in offsets.items()}


def settled_offsets(bootstrap: str, group: str, expected: dict[str, int]) -> dict[str, int]:
    """The group's committed offsets once they equal ``expected``, or as they are at a deadline.

    Offsets committed in a transaction become visible to an offset fetch only once the
    coordinator has written the commit marker to ``__consumer_offsets``, which it does after
    answering EndTxn; until then the admin client, which asks without KIP-447's
    ``require_stable``, sees the offsets from before the transaction."""
    deadline = time.monotonic() + patience(10.0)
    while True:
        offsets = committed_offsets(bootstrap, group)
        if offsets == expected or time.monotonic() > deadline:
            return offsets
        time.sleep(0.1)  # polling interval of a bounded wait


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    """What a ``read_committed`` reader sees on ``topic`` (partition order), read to its end."""
    reader = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        consumer_timeout_ms=int(IDLE * 1000),
    )
    try:
        return [m.value for m in reader]
    finally:
        reader.close()


def record(i: int) -> bytes:
    return json.dumps({"x": {"a": i, "b": i * 0.5}, "y": i % 2, "key": f"user{i % 7}"}).encode()


def produce(
    bootstrap: str, topic: str, indices: Iterable[int], client: str = "kafka-python"
) -> None:
    with KafkaSink(topic, bootstrap, client=client) as sink:
        for i in indices:
            sink.send(f"user{i % 7}", record(i))
        sink.flush()


def take(source: KafkaSource, n: int) -> list[SourceMessage]:
    out: list[SourceMessage] = []
    for msg in source:
        out.append(msg)
        if len(out) == n:
            break
    return out


def index_of(msg: SourceMessage) -> int:
    return int(parse_record(msg.value).x["a"])


def check_partition_order(messages: list[SourceMessage]) -> None:
    last: dict[int, int] = {}
    for msg in messages:
        part, off = msg.position["partition"], msg.position["offset"]
        assert off > last.get(part, -1), "offsets must increase within a partition"
        last[part] = off


def test_a_poll_returns_as_soon_as_records_are_there(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    """A poll with a long timeout returns the records there are, fewer than it may take,
    without waiting out its timeout (librdkafka's own batch consume waits for all of them)."""
    from connectors.clients import client

    bootstrap = kafka_broker.bootstrap
    topic = unique_name("t")
    produce(bootstrap, topic, range(10), kafka_client)
    consumer = client(kafka_client).consumer(
        bootstrap_servers=bootstrap,
        group_id=unique_name("g"),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        from kafka import TopicPartition

        consumer.assign([TopicPartition(topic, 0)])
        timeout_s = patience(30.0)
        began = time.monotonic()
        got = 0
        while got < 10 and time.monotonic() - began < timeout_s:
            batch = consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=500)
            got += sum(len(records) for records in batch.values())
        took = time.monotonic() - began
    finally:
        consumer.close()
    assert got == 10
    assert took < timeout_s / 2, f"the poll waited {took:.1f} s for records it had"


def test_produce_consume_commit_and_resume(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic, group = unique_name("t"), unique_name("g")
    create_topic(bootstrap, topic, partitions=3)
    n = 300
    produce(bootstrap, topic, range(n), kafka_client)

    with KafkaSource(topic, bootstrap, group, max_idle_seconds=IDLE, client=kafka_client) as first:
        part1 = take(first, 150)
        checkpoint = first.positions()
        assert first.commit() is True
    assert len(part1) == 150
    assert committed_offsets(bootstrap, group) == checkpoint

    with KafkaSource(topic, bootstrap, group, max_idle_seconds=IDLE, client=kafka_client) as second:
        part2 = list(second)
        final = second.positions()
        assert second.commit() is True

    assert len(part2) == n - 150
    seen = [index_of(m) for m in part1 + part2]
    assert sorted(seen) == list(range(n)), "every record exactly once across the restart"
    check_partition_order(part1 + part2)
    # The resumed consumer started exactly at the committed offsets.
    for msg in part2:
        key = f"{topic}:{msg.position['partition']}"
        assert msg.position["offset"] >= checkpoint.get(key, 0)
    first_offsets: dict[str, int] = {}
    for msg in part2:
        first_offsets.setdefault(f"{topic}:{msg.position['partition']}", msg.position["offset"])
    for key, off in first_offsets.items():
        assert off == checkpoint.get(key, 0)
    assert committed_offsets(bootstrap, group) == final
    assert sum(final.values()) == n
    assert all(m.key is not None and m.key.startswith(b"user") for m in part2)


def test_seek_to_checkpoint_positions(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = unique_name("t")
    create_topic(bootstrap, topic, partitions=2)
    produce(bootstrap, topic, range(100), kafka_client)

    # Seek on a live source, after its partitions were assigned.
    with KafkaSource(
        topic, bootstrap, unique_name("g"), max_idle_seconds=IDLE, client=kafka_client
    ) as src:
        before = take(src, 40)
        checkpoint = src.positions()
        ahead = take(src, 30)
        assert len(ahead) == 30
        src.seek(checkpoint)
        assert src.positions() == checkpoint
        after = list(src)
    assert sorted(index_of(m) for m in before + after) == list(range(100))

    # Seek on a fresh source (different group, nothing committed), before assignment: this
    # is what a restart from a checkpoint does.
    with KafkaSource(
        topic, bootstrap, unique_name("g"), max_idle_seconds=IDLE, client=kafka_client
    ) as fresh:
        fresh.seek(checkpoint)
        resumed = list(fresh)
    assert sorted(index_of(m) for m in resumed) == sorted(index_of(m) for m in after)
    assert len(resumed) == 60


def test_dead_letter_round_trip(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic, dlq = unique_name("in"), unique_name("dlq")
    payloads: list[bytes | None] = [
        record(0),
        b"not json at all",
        b'{"x": {"a": "seven"}, "y": 1}',
        b'{"x": {"a": 1.0}}',
        b'{"x": {}, "y": 1}',
        b'{"x": [NaN], "y": 1}',
        b'{"x": [1], "y": 1, "pad": "' + b"z" * 5000 + b'"}',
        b"\xff\xfe\xfd",
        None,  # a tombstone
        record(1),
    ]
    expected = [
        None,
        "invalid_json",
        "wrong_type",
        "missing_label",
        "empty_features",
        "non_finite",
        "oversize",
        "invalid_json",
        "invalid_json",
        None,
    ]
    create_topic(bootstrap, topic, partitions=1)
    # Idempotent: a retried send (the broker just started) must not duplicate a payload.
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    try:
        for p in payloads:
            # Kafka needs a key or a value; the tombstone has only a key.
            producer.send(topic, value=p, key=b"k" if p is None else None)
        producer.flush()
    finally:
        producer.close()

    good = []
    dead = DeadLetterSink(KafkaSink(dlq, bootstrap, client=kafka_client))
    with KafkaSource(
        topic, bootstrap, unique_name("g"), max_idle_seconds=IDLE, client=kafka_client
    ) as src:
        messages = list(src)
        for msg in messages:
            try:
                good.append(parse_record(msg.value, max_bytes=4096))
            except RecordError as err:
                dead.send_error(err, msg.value, msg.position)
    dead.close()

    check_partition_order(messages)  # each message once
    assert len(messages) == len(payloads)
    assert [r.x["a"] for r in good] == [0.0, 1.0]
    wanted = [r for r in expected if r is not None]
    assert dead.total == len(wanted)
    assert dead.counts == {r: wanted.count(r) for r in set(wanted)}

    with KafkaSource(
        dlq, bootstrap, unique_name("g"), max_idle_seconds=IDLE, client=kafka_client
    ) as src:
        letters = [(m.key, DeadLetter.model_validate_json(m.value)) for m in src]
    assert [letter.reason for _, letter in letters] == wanted
    assert all(key == letter.reason.encode() for key, letter in letters)
    bad_positions = [i for i, r in enumerate(expected) if r is not None]
    for (_, letter), offset in zip(letters, bad_positions, strict=True):
        assert letter.source_position == {"topic": topic, "partition": 0, "offset": offset}
        original = payloads[offset] or b""
        assert letter.payload_length == len(original)
        assert letter.payload == original.decode("utf-8", errors="replace")[:10_000]
        assert letter.message


def test_broker_outage_mid_consumption_loses_nothing(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic, group = unique_name("t"), unique_name("g")
    produce(bootstrap, topic, range(50), kafka_client)

    # Outlasts the outage (the broker is stopped and started again: ≤ 18 s at load 4-7).
    consumer = KafkaSource(
        topic,
        bootstrap,
        group,
        max_idle_seconds=patience(90),
        retry_backoff_max_s=1.0,
        client=kafka_client,
    )
    got: list[SourceMessage] = []
    errors: list[BaseException] = []
    have_50 = threading.Event()

    def consume() -> None:
        try:
            for msg in consumer:
                got.append(msg)
                if len(got) == 50:
                    have_50.set()
                if len(got) == 100:
                    break
        except BaseException as err:  # surfaced in the main thread
            errors.append(err)
        finally:
            have_50.set()

    sink = KafkaSink(topic, bootstrap, retry_backoff_max_s=1.0, client=kafka_client)

    def produce_during_outage() -> None:
        try:
            for i in range(50, 100):
                sink.send(f"user{i % 7}", record(i))
            sink.flush()
        except BaseException as err:
            errors.append(err)

    # A transactional publisher, ready before the outage, publishes a batch and its input's
    # offsets through it, as the engine does: an attempt whose answer was lost is recognised
    # by the group's commit tag, so the batch is visible once.
    out, txn_group = unique_name("out"), unique_name("g")
    txn_source = KafkaSource(topic, bootstrap, txn_group, max_idle_seconds=IDLE,
                             client=kafka_client)  # fmt: skip
    assert len(take(txn_source, 10)) == 10
    publisher = TransactionalPublisher(
        bootstrap, unique_name("txn"), attempt_timeout_s=5.0, retry_backoff_max_s=1.0,
        client=kafka_client,
    )  # fmt: skip
    publisher.start()
    publisher.publish([(out, b"m", b"before")])
    retries: list[BaseException] = []

    def published() -> bool:
        try:
            return txn_source.committed(timeout_s=2.0)[f"{topic}:0"] == (10, "run 2")
        except Exception:  # noqa: BLE001 - unknown counts as not yet
            return False

    def publish_during_outage() -> None:
        try:
            publisher.publish(
                [(out, b"m", b"during-%d" % i) for i in range(20)],
                txn_source.offsets(tag="run 2"),
                txn_group,
                on_retry=retries.append,
                already_committed=published,
            )
        except BaseException as err:
            errors.append(err)

    # A second source, used only from this thread, to check commit() during the outage.
    other = KafkaSource(
        topic,
        bootstrap,
        unique_name("g"),
        max_idle_seconds=IDLE,
        commit_timeout_s=2.0,
        retry_backoff_max_s=0.5,
        client=kafka_client,
    )
    assert len(take(other, 10)) == 10

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    assert have_50.wait(patience(60)), "consumer did not get the first 50 records"
    assert not errors

    writer = threading.Thread(target=produce_during_outage, daemon=True)
    txn_writer = threading.Thread(target=publish_during_outage, daemon=True)
    kafka_broker.stop()
    try:
        assert not kafka_broker.is_running()
        writer.start()
        txn_writer.start()
        t0 = time.monotonic()
        assert other.commit() is False, "commit during an outage reports failure, not raise"
        # commit_timeout_s = 2 and backoffs of ≤ 0.5 s
        assert time.monotonic() - t0 < patience(15), "commit retries must be bounded"
    finally:
        kafka_broker.start()
    assert kafka_broker.bootstrap == bootstrap, "restart keeps the same port"

    writer.join(patience(120))
    reader.join(patience(120))
    txn_writer.join(patience(180))
    assert not writer.is_alive() and not reader.is_alive() and not txn_writer.is_alive()
    assert not errors, errors
    assert retries, "the batch published during the outage was retried"
    assert committed_values(bootstrap, out) == [b"before"] + [b"during-%d" % i for i in range(20)]
    settled = {f"{topic}:0": 10}
    assert settled_offsets(bootstrap, txn_group, settled) == settled
    publisher.close()
    txn_source.close()
    assert [m.position["offset"] for m in got] == list(range(100))
    assert [index_of(m) for m in got] == list(range(100))

    assert consumer.commit() is True
    assert committed_offsets(bootstrap, group) == {f"{topic}:0": 100}
    # A failed commit is retried by the next one; its connection may still be backing off, and
    # librdkafka answers the commits abandoned during the outage first (≤ 12 s at load 4; the
    # deadline only bounds a hang).
    deadline = time.monotonic() + patience(90)
    while not other.commit():
        assert time.monotonic() < deadline, "commits must succeed again after the outage"
    consumer.close()
    other.close()
    sink.close()


def test_source_waits_for_topic_created_later(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    """A source started before its topic exists yields nothing, then the records."""
    bootstrap = kafka_broker.bootstrap
    topic = unique_name("late")
    src = KafkaSource(
        topic, bootstrap, unique_name("g"), max_idle_seconds=patience(30), client=kafka_client
    )
    result: dict[str, Any] = {}

    def consume() -> None:
        result["messages"] = take(src, 5)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    produce(bootstrap, topic, range(5), kafka_client)
    reader.join(patience(60))
    src.close()
    assert [index_of(m) for m in result["messages"]] == list(range(5))


def test_transaction_commits_offsets_with_group_metadata(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    """Outputs and the source's offsets in one transaction (offsets with the consumer's group
    metadata, KIP-447); a second writer with the same transactional id fences the first, whose
    batch then never becomes visible."""
    bootstrap = kafka_broker.bootstrap
    topic, group, out, txn = (unique_name(k) for k in ("t", "g", "out", "txn"))
    produce(bootstrap, topic, range(20), kafka_client)
    first = TransactionalPublisher(bootstrap, txn, client=kafka_client)
    with KafkaSource(topic, bootstrap, group, max_idle_seconds=IDLE, client=kafka_client) as src:
        got = take(src, 20)
        offsets = src.offsets(tag="run-1 1")
        assert offsets.group_metadata is not None
        first.start()
        first.publish([(out, b"m", m.value) for m in got], offsets, group)
        expected = {f"{topic}:0": 20}
        assert settled_offsets(bootstrap, group, expected) == expected
        assert src.committed() == {f"{topic}:0": (20, "run-1 1")}
    assert committed_values(bootstrap, out) == [record(i) for i in range(20)]

    second = TransactionalPublisher(bootstrap, txn, client=kafka_client)
    second.start()  # the same model started again: the first writer is fenced
    with pytest.raises(ProducerFenced, match="has started"):
        first.publish([(out, b"m", b"zombie")])
    second.publish([(out, b"m", b"second")])
    assert committed_values(bootstrap, out)[20:] == [b"second"]
    first.close()
    second.close()


def test_group_rebalance_and_a_stale_generation_is_fenced(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    """Group membership as scale-out uses it: a subscribed consumer's rebalance callbacks,
    partitions paused on assignment and read through PartitionSource; the coordinator
    describes each member's client id and assignment; the offsets a member took before a
    rebalance carry its old generation, and the broker refuses them (KIP-447)."""
    from kafka import ConsumerRebalanceListener
    from kafka.errors import NoOffsetForPartitionError

    from connectors.admin import connect, describe_group
    from connectors.clients import client
    from connectors.partition import PartitionSource

    bootstrap = kafka_broker.bootstrap
    topic, group, out = unique_name("t"), unique_name("g"), unique_name("out")
    create_topic(bootstrap, topic, partitions=2)
    produce(bootstrap, topic, range(40), kafka_client)

    def member(name: str) -> tuple[Any, list[tuple[str, list[int]]]]:
        events: list[tuple[str, list[int]]] = []
        consumer = client(kafka_client).consumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            client_id=name,
            enable_auto_commit=False,
            auto_offset_reset="none",
            isolation_level="read_committed",
            session_timeout_ms=6000,
            heartbeat_interval_ms=1500,
        )

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                events.append(("revoked", sorted(tp.partition for tp in revoked)))

            def on_partitions_lost(self, lost):
                events.append(("lost", sorted(tp.partition for tp in lost)))

            def on_partitions_assigned(self, assigned):
                consumer.pause(*assigned)  # taken up after the poll, as scale-out does
                events.append(("assigned", sorted(tp.partition for tp in assigned)))

        consumer.subscribe([topic], listener=Listener())
        return consumer, events

    def poll(consumer: Any) -> dict:
        try:
            return consumer.poll(timeout_ms=100)
        except NoOffsetForPartitionError:
            return {}  # gained, not yet sought to its learner's position (scale-out's rule)

    a, a_events = member("a")
    deadline = time.monotonic() + patience(60)
    while not any(e == ("assigned", [0, 1]) for e in a_events):
        assert time.monotonic() < deadline, a_events
        poll(a)
    sources = {p: PartitionSource(a, topic, p, group) for p in (0, 1)}
    for p, src in sources.items():
        assert src.start() == {f"{topic}:{p}": 0}
    a.resume(*a.assignment())
    learned: dict[int, list[int]] = {0: [], 1: []}
    while sum(len(v) for v in learned.values()) < 40:
        assert time.monotonic() < deadline
        for tp, records in poll(a).items():
            learned[tp.partition] += [index_of(m) for m in sources[tp.partition].messages(records)]
    assert sorted(learned[0] + learned[1]) == list(range(40))

    publisher = TransactionalPublisher(bootstrap, unique_name("txn"), client=kafka_client)
    publisher.start()
    stale = sources[0].offsets(tag="a 1")
    publisher.publish([(out, b"m", b"a-1")], stale, group)  # the current generation: accepted
    assert sources[0].committed() == {f"{topic}:0": (len(learned[0]), "a 1")}

    b, b_events = member("b")  # a second member: the group rebalances
    while not (b.assignment() and len(a.assignment()) == 1):
        assert time.monotonic() < deadline, (a_events, b_events)
        poll(a)
        poll(b)
    assert a_events[-2:][0] == ("revoked", [0, 1]), a_events  # eager: all given up first
    assert {p for tp in a.assignment() | b.assignment() for p in [tp.partition]} == {0, 1}
    # The coordinator's view, as `stream-dp status` reads it: members by client id.
    admin = connect(bootstrap, timeout_s=15, what="test", client=kafka_client)
    try:
        described = describe_group(admin, group)
        assert describe_group(admin, unique_name("g")).exists is False
    finally:
        admin.close()
    assert described.state == "Stable", described
    held = {m.client_id: {k for t, k in m.assignment if t == topic} for m in described.members}
    assert held == {"a": {tp.partition for tp in a.assignment()},
                    "b": {tp.partition for tp in b.assignment()}}  # fmt: skip

    with pytest.raises(ProducerFenced, match="consumer group refused"):
        publisher.publish([(out, b"m", b"zombie")], stale, group)
    assert committed_values(bootstrap, out) == [b"a-1"]
    a.close(autocommit=False)
    b.close(autocommit=False)
    publisher.close()


def test_a_member_polling_briefly_between_work_is_always_assigned(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    """A group's only member, started again and again, polls for 50 ms with 30 ms of work
    between polls (as scale-out does while it holds no partition) and must be assigned both
    partitions every time. Its first assignment precedes the topic's metadata, so as leader it
    rejoins at once; on kafka-python 3.0 that join, finished between polls, used to be dropped
    for good (7 of 8 starts) until connectors._kafka_python.rejoin_if_join_lost."""
    from connectors.clients import client

    bootstrap = kafka_broker.bootstrap
    topic, group = unique_name("t"), unique_name("g")
    create_topic(bootstrap, topic, partitions=2)
    for start in range(6):
        consumer = client(kafka_client).consumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=1500,
        )  # fmt: skip
        try:
            consumer.subscribe([topic])
            # 0.07-0.27 s on a quiet 2-core VM; a dropped join never ends.
            deadline = time.monotonic() + patience(10.0)
            while not consumer.assignment() and time.monotonic() < deadline:
                consumer.poll(timeout_ms=50, max_records=100)
                time.sleep(0.03)
            assert {tp.partition for tp in consumer.assignment()} == {0, 1}, start
        finally:
            consumer.close()


def test_admin_checks_and_checkpoint_topic(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    """The start-up checks and the checkpoint topic: a compacted topic created with its limit,
    the newest committed value of a key, and of every key, read back (aborted writes never
    seen)."""
    from connectors.admin import (
        KafkaProblem,
        connect,
        ensure_topic,
        latest_by_key,
        latest_with_key,
        topic_max_message_bytes,
        topic_partitions,
    )

    bootstrap = kafka_broker.bootstrap
    topic, missing = unique_name("ckpt"), unique_name("none")
    admin = connect(bootstrap, timeout_s=15, what="test", client=kafka_client)
    try:
        configs = {"cleanup.policy": "compact", "max.message.bytes": str(4 << 20)}
        assert ensure_topic(admin, topic, configs=configs) is True
        assert ensure_topic(admin, topic, configs=configs) is False
        assert topic_partitions(admin, [topic, missing]) == {topic: 1, missing: None}
        assert topic_max_message_bytes(admin, topic) == 4 << 20
    finally:
        admin.close()

    publisher = TransactionalPublisher(bootstrap, unique_name("txn"), client=kafka_client)
    publisher.start()
    publisher.publish([(topic, b"m/p0", b"ckpt-1"), (topic, b"m/p1", b"other")])
    publisher.publish([(topic, b"m/p0", b"ckpt-2")])
    publisher.close()
    aborted = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique_name("abort"))
    aborted.init_transactions()
    aborted.begin_transaction()
    aborted.send(topic, key=b"m/p0", value=b"aborted")
    aborted.flush()
    aborted.abort_transaction()
    aborted.close()
    read = {"timeout_s": 15, "client": kafka_client}
    assert latest_with_key(bootstrap, topic, b"m/p0", **read) == b"ckpt-2"
    assert latest_with_key(bootstrap, topic, b"m/p1", **read) == b"other"
    assert latest_with_key(bootstrap, topic, b"m/p9", **read) is None
    # What a consumer reading uncommitted saw: the aborted message too.
    assert latest_with_key(bootstrap, topic, b"m/p0", committed=False, **read) == b"aborted"
    # Read backwards in growing windows: a key 70 messages back is found, one beyond the tail
    # is not.
    publisher = TransactionalPublisher(bootstrap, unique_name("txn"), client=kafka_client)
    publisher.start()
    publisher.publish([(topic, b"m/p1", f"other-{i}".encode()) for i in range(70)])
    publisher.close()
    assert latest_with_key(bootstrap, topic, b"m/p0", **read) == b"ckpt-2"
    assert latest_with_key(bootstrap, topic, b"m/p1", **read) == b"other-69"
    assert latest_with_key(bootstrap, topic, b"m/p0", tail=40, **read) is None
    # Every key's newest committed value (the status topic's reader).
    assert latest_by_key(bootstrap, topic, **read) == {b"m/p0": b"ckpt-2", b"m/p1": b"other-69"}
    assert latest_by_key(bootstrap, missing, **read) == {}

    # The diagnoses: nothing listening, and a TLS client at a plaintext listener.
    with pytest.raises(KafkaProblem, match="cannot reach Kafka at 127.0.0.1:1 "):
        connect("127.0.0.1:1", timeout_s=4, what="x", client=kafka_client)
    with pytest.raises(KafkaProblem, match="works but no Kafka session came up.*is that listener"):
        connect(bootstrap, timeout_s=4, what="x", client=kafka_client, security_protocol="SSL")


def test_keys_land_on_kafka_python_partitions(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], kafka_client: str
) -> None:
    """Both clients partition keys as kafka-python's default partitioner (and Java's) do, so a
    model's releases stay on one partition whichever client wrote them."""
    from kafka.partitioner.default import murmur2

    bootstrap = kafka_broker.bootstrap
    topic = unique_name("keys")
    create_topic(bootstrap, topic, partitions=7)
    keys = [f"model-{i}/p{i % 5}" for i in range(60)]
    with KafkaSink(topic, bootstrap, client=kafka_client) as sink:
        for k in keys:
            sink.send(k, k.encode())
    publisher = TransactionalPublisher(bootstrap, unique_name("txn"), client=kafka_client)
    publisher.start()
    publisher.publish([(topic, k.encode(), k.encode()) for k in keys])
    publisher.close()
    with KafkaSource(topic, bootstrap, unique_name("g"), max_idle_seconds=IDLE,
                     client=kafka_client) as src:  # fmt: skip
        where = [(m.value, m.position["partition"]) for m in src]
    # The default partitioner's rule (tests/test_connectors.py holds kafka-python to it).
    want = {k.encode(): (murmur2(k.encode()) & 0x7FFFFFFF) % 7 for k in keys}
    assert len(where) == 2 * len(keys)
    assert all(want[value] == part for value, part in where)
    assert len(set(want.values())) > 3  # the keys spread, so a wrong rule would show
