"""What the Kafka apps (``produce``, ``watch``, ``merge``) share: the broker probe, the release
consumer and their exit codes.

Every app fails fast: an unreachable or misconfigured broker, or a topic it must read that does
not exist, is one line on stderr and exit code 4 within 20 s; a bad argument is exit code 2.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from connectors.clients import CLIENTS, DEFAULT_CLIENT
from stream_dp.engine.cli import configure_logging, one_line_errors

__all__ = [
    "PROBE_TIMEOUT_SECONDS",
    "BadArgument",
    "add_bootstrap_argument",
    "exit_codes",
    "probe",
    "release_consumer",
    "run_app",
]

#: Bound on the broker probe of every app.
PROBE_TIMEOUT_SECONDS = 20.0


class BadArgument(ValueError):
    """A command-line argument the app cannot use (exit code 2)."""


def exit_codes() -> dict[type[BaseException], int]:
    """The apps' exit codes by exception: a bad argument 2, a Kafka problem 4."""
    from connectors.admin import KafkaProblem

    return {BadArgument: 2, KafkaProblem: 4}


def run_app(command: str, args: argparse.Namespace, work: Callable[[], int]) -> int:
    """Run an app's ``work`` with the command line's conventions: the Kafka client's chatter
    kept down (unless ``--verbose``), every error one stderr line and an exit code (the
    traceback with ``--debug``)."""
    configure_logging("WARNING", args.verbose)

    def checked() -> int:
        from connectors.clients import client

        try:
            client(args.client)
        except ImportError as err:
            if err.name != "confluent_kafka":
                raise
            raise BadArgument(f"--client: {err}") from None
        return work()

    return one_line_errors(command, args.debug, exit_codes(), checked)


def probe(bootstrap: str, topics: Sequence[str] = (), client: str = DEFAULT_CLIENT) -> None:
    """Reach the broker with ``client`` and check that ``topics`` exist.

    Raises
    ------
    connectors.admin.KafkaProblem
        The broker is unreachable or misconfigured, or one of ``topics`` does not exist.
    """
    from connectors.admin import KafkaProblem, connect, topic_partitions

    admin = connect(bootstrap, timeout_s=PROBE_TIMEOUT_SECONDS, what="--bootstrap", client=client)
    try:
        found = topic_partitions(admin, list(topics)) if topics else {}
    finally:
        admin.close()
    missing = [t for t in topics if found.get(t) is None]
    if missing:
        raise KafkaProblem(f"topic {missing[0]!r} does not exist on {bootstrap}")


class _ReleaseReader:
    """A topic read from its start on every partition, without joining a consumer group;
    iterating yields its records until ``idle_seconds`` pass without one (and may be done
    again, continuing where it stopped). The consumer's other calls (``end_offsets``,
    ``position``, ...) pass through."""

    def __init__(self, consumer: Any, topic: str, idle_seconds: float) -> None:
        from kafka import TopicPartition

        self._consumer = consumer
        self._idle_seconds = idle_seconds
        numbers = sorted(consumer.partitions_for_topic(topic) or ())
        parts = [TopicPartition(topic, p) for p in numbers]
        consumer.assign(parts)
        for tp, offset in consumer.beginning_offsets(parts).items():
            consumer.seek(tp, offset)

    def __iter__(self) -> Iterator[Any]:
        from connectors._retry import is_retriable

        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < self._idle_seconds:
            try:
                polled = self._consumer.poll(timeout_ms=min(500, int(self._idle_seconds * 1000)))
            except Exception as err:
                # A broker that is starting or away (e.g. its group coordinator loading):
                # counted as silence, like kafka-python's consumer, which keeps quiet.
                if not is_retriable(err):
                    raise
                time.sleep(0.2)
                continue
            for records in polled.values():
                yield from records
            if polled:
                quiet_since = time.monotonic()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def close(self) -> None:
        self._consumer.close(autocommit=False)


def release_consumer(
    bootstrap: str, topic: str, idle_seconds: float, client: str = DEFAULT_CLIENT
) -> Any:
    """A reader of a release topic from its start on ``client``, each pass over it ending
    after ``idle_seconds`` of silence; its records have ``key`` and ``value``.

    It reads ``read_committed``: only releases whose checkpoint is durable, each once; the
    copies in aborted transactions are never shown (``docs/privacy.md``, "The engine: one
    release per step"). No consumer group is joined or committed to.
    """
    from connectors.clients import client as kafka_client

    consumer = kafka_client(client).consumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    try:
        return _ReleaseReader(consumer, topic, idle_seconds)
    except BaseException:
        consumer.close(autocommit=False)
        raise


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap``, required by every Kafka app, and ``--client``."""
    parser.add_argument(
        "--bootstrap", required=True, metavar="HOST:PORT", help="Kafka bootstrap servers"
    )
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default=DEFAULT_CLIENT,
        help="the Kafka client (default: %(default)s; confluent-kafka needs the confluent extra)",
    )
