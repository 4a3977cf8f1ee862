"""KafkaSource / KafkaSink against a real single-node Kafka broker (deploy/kafka/kafka.sh)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer

from connectors import (
    DeadLetter,
    DeadLetterSink,
    KafkaSink,
    KafkaSource,
    RecordError,
    SourceMessage,
    parse_record,
)

from .kafka_broker import KafkaBroker

pytestmark = pytest.mark.kafka

IDLE = 3.0  # seconds without records after which a test's source stops


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


def record(i: int) -> bytes:
    return json.dumps({"x": {"a": i, "b": i * 0.5}, "y": i % 2, "key": f"user{i % 7}"}).encode()


def produce(bootstrap: str, topic: str, indices: Iterable[int]) -> None:
    with KafkaSink(topic, bootstrap) as sink:
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


def test_produce_consume_commit_and_resume(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str]
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic, group = unique_name("t"), unique_name("g")
    create_topic(bootstrap, topic, partitions=3)
    n = 300
    produce(bootstrap, topic, range(n))

    with KafkaSource(topic, bootstrap, group, max_idle_seconds=IDLE) as first:
        part1 = take(first, 150)
        checkpoint = first.positions()
        assert first.commit() is True
    assert len(part1) == 150
    assert committed_offsets(bootstrap, group) == checkpoint

    with KafkaSource(topic, bootstrap, group, max_idle_seconds=IDLE) as second:
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
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str]
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = unique_name("t")
    create_topic(bootstrap, topic, partitions=2)
    produce(bootstrap, topic, range(100))

    # Seek on a live source, after its partitions were assigned.
    with KafkaSource(topic, bootstrap, unique_name("g"), max_idle_seconds=IDLE) as src:
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
    with KafkaSource(topic, bootstrap, unique_name("g"), max_idle_seconds=IDLE) as fresh:
        fresh.seek(checkpoint)
        resumed = list(fresh)
    assert sorted(index_of(m) for m in resumed) == sorted(index_of(m) for m in after)
    assert len(resumed) == 60


def test_dead_letter_round_trip(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str]
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
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for p in payloads:
            # Kafka needs a key or a value; the tombstone has only a key.
            producer.send(topic, value=p, key=b"k" if p is None else None)
        producer.flush()
    finally:
        producer.close()

    good = []
    dead = DeadLetterSink(KafkaSink(dlq, bootstrap))
    with KafkaSource(topic, bootstrap, unique_name("g"), max_idle_seconds=IDLE) as src:
        messages = list(src)
        for msg in messages:
            try:
                good.append(parse_record(msg.value, max_bytes=4096))
            except RecordError as err:
                dead.send_error(err, msg.value, msg.position)
    dead.close()

    assert len(messages) == len(payloads)
    assert [r.x["a"] for r in good] == [0.0, 1.0]
    wanted = [r for r in expected if r is not None]
    assert dead.total == len(wanted)
    assert dead.counts == {r: wanted.count(r) for r in set(wanted)}

    with KafkaSource(dlq, bootstrap, unique_name("g"), max_idle_seconds=IDLE) as src:
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
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str]
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic, group = unique_name("t"), unique_name("g")
    produce(bootstrap, topic, range(50))

    consumer = KafkaSource(topic, bootstrap, group, max_idle_seconds=90, retry_backoff_max_s=1.0)
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

    sink = KafkaSink(topic, bootstrap, retry_backoff_max_s=1.0)

    def produce_during_outage() -> None:
        try:
            for i in range(50, 100):
                sink.send(f"user{i % 7}", record(i))
            sink.flush()
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
    )
    assert len(take(other, 10)) == 10

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    assert have_50.wait(60), "consumer did not get the first 50 records"
    assert not errors

    writer = threading.Thread(target=produce_during_outage, daemon=True)
    kafka_broker.stop()
    try:
        assert not kafka_broker.is_running()
        writer.start()
        t0 = time.monotonic()
        assert other.commit() is False, "commit during an outage reports failure, not raise"
        assert time.monotonic() - t0 < 15, "commit retries must be bounded"
    finally:
        kafka_broker.start()
    assert kafka_broker.bootstrap == bootstrap, "restart keeps the same port"

    writer.join(120)
    reader.join(120)
    assert not writer.is_alive() and not reader.is_alive()
    assert not errors, errors
    assert [m.position["offset"] for m in got] == list(range(100))
    assert [index_of(m) for m in got] == list(range(100))

    assert consumer.commit() is True
    assert committed_offsets(bootstrap, group) == {f"{topic}:0": 100}
    # A failed commit is retried by the next one; its connection may still be backing off.
    deadline = time.monotonic() + 30
    while not other.commit():
        assert time.monotonic() < deadline, "commits must succeed again after the outage"
    consumer.close()
    other.close()
    sink.close()


def test_source_waits_for_topic_created_later(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str]
) -> None:
    """A source started before its topic exists yields nothing, then the records."""
    bootstrap = kafka_broker.bootstrap
    topic = unique_name("late")
    src = KafkaSource(topic, bootstrap, unique_name("g"), max_idle_seconds=30)
    result: dict[str, Any] = {}

    def consume() -> None:
        result["messages"] = take(src, 5)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    produce(bootstrap, topic, range(5))
    reader.join(60)
    src.close()
    assert [index_of(m) for m in result["messages"]] == list(range(5))
