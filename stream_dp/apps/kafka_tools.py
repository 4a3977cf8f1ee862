"""What the Kafka apps (``produce``, ``watch``, ``merge``) share: the broker probe, the release
consumer and their exit codes.

Every app fails fast: an unreachable or misconfigured broker, or a topic it must read that does
not exist, is one line on stderr and exit code 4 within 20 s; a bad argument is exit code 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

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
    return one_line_errors(command, args.debug, exit_codes(), work)


def probe(bootstrap: str, topics: Sequence[str] = ()) -> None:
    """Reach the broker and check that ``topics`` exist.

    Raises
    ------
    connectors.admin.KafkaProblem
        The broker is unreachable or misconfigured, or one of ``topics`` does not exist.
    """
    from connectors.admin import KafkaProblem, connect, topic_partitions

    admin = connect(bootstrap, timeout_s=PROBE_TIMEOUT_SECONDS, what="--bootstrap")
    try:
        found = topic_partitions(admin, list(topics)) if topics else {}
    finally:
        admin.close()
    missing = [t for t in topics if found.get(t) is None]
    if missing:
        raise KafkaProblem(f"topic {missing[0]!r} does not exist on {bootstrap}")


def release_consumer(bootstrap: str, topic: str, idle_seconds: float) -> Any:
    """A consumer of a release topic from its start, ending after ``idle_seconds`` of silence.

    It reads ``read_committed``: only releases whose checkpoint is durable, each once; the
    copies in aborted transactions are never shown (``docs/privacy.md``, "The engine: one
    release per step").
    """
    from kafka import KafkaConsumer

    return KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        consumer_timeout_ms=int(idle_seconds * 1000),
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap``, required by every Kafka app."""
    parser.add_argument(
        "--bootstrap", required=True, metavar="HOST:PORT", help="Kafka bootstrap servers"
    )
