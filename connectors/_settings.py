"""Checking the settings a caller passes to a source, sink or publisher (private)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["client_settings", "crc32c_in_c", "release_compression"]


def client_settings(
    client: Any,
    role: str,
    owner: str,
    fixed: frozenset[str],
    config: Mapping[str, Any] | None,
    security: Mapping[str, Any],
) -> dict[str, Any]:
    """Merge ``config`` and ``security``; refuse unknown settings and those ``owner`` manages.

    Parameters
    ----------
    client : connectors.transport.Client
        Knows which settings exist (kafka-python's names; librdkafka's dotted names too on
        confluent-kafka).
    role : str
        ``"KafkaConsumer"`` or ``"KafkaProducer"``: whose settings these are.
    owner : str
        Named in the error, e.g. ``"KafkaSink"``.
    fixed : frozenset of str
        Settings ``owner`` sets itself (what its guarantees rest on).
    config, security : dict
        The caller's settings.

    Raises
    ------
    TypeError
        A setting the client does not know (a typo must not pass silently).
    ValueError
        A setting ``owner`` manages.

    Examples
    --------
    >>> from connectors.clients import client
    >>> kp = client("kafka-python")
    >>> client_settings(kp, "KafkaProducer", "X", frozenset({"acks"}), {"linger_ms": 5}, {})
    {'linger_ms': 5}
    >>> client_settings(kp, "KafkaProducer", "X", frozenset({"acks"}), {"acks": 1}, {})
    Traceback (most recent call last):
    ...
    ValueError: X manages these settings itself: ['acks']
    """
    extra = {**(config or {}), **security}
    unknown = client.unknown_settings(role, extra)
    if unknown:
        raise TypeError(f"unknown {role} setting(s) for {client.name}: {unknown}")
    managed = sorted(set(extra) & fixed)
    if managed:
        raise ValueError(f"{owner} manages these settings itself: {managed}")
    return extra


def crc32c_in_c() -> bool:
    """Whether kafka-python computes CRC32C in C (the ``crc32c`` package, the ``fast`` extra)
    rather than in its own pure Python."""
    from kafka.record import util

    return util.crc32c_c is not None


def release_compression(client: str = "kafka-python") -> str | None:
    """The compression of the engine's release batches: none when CRC32C runs in C, else gzip.

    Every produced batch carries a CRC32C. kafka-python computes it in pure Python unless the
    ``crc32c`` package is installed, and then it costs more per byte than gzip (standard
    library) saves: releases repeat their header and feature names, so gzip shrinks them several
    times. With a CRC32C in C (the ``crc32c`` package, or librdkafka on ``confluent-kafka``) the
    checksum is nearly free and gzip (level 9, in Python's ``GzipFile`` on kafka-python) would be
    the larger cost. Both measured with ``benchmarks/kafka_e2e.py`` (``docs/performance.md``,
    "Kafka end to end"); consumers decompress either way without being told.

    Examples
    --------
    >>> release_compression("confluent-kafka") is None
    True
    """
    if client != "kafka-python":
        return None
    return None if crc32c_in_c() else "gzip"
