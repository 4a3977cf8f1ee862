"""Checking the kafka-python settings a caller passes to a source, sink or publisher (private)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["client_settings"]


def client_settings(
    client: type,
    owner: str,
    fixed: frozenset[str],
    config: Mapping[str, Any] | None,
    security: Mapping[str, Any],
) -> dict[str, Any]:
    """Merge ``config`` and ``security``; refuse unknown settings and those ``owner`` manages.

    Parameters
    ----------
    client : type
        ``KafkaConsumer`` or ``KafkaProducer`` (its ``DEFAULT_CONFIG`` lists what exists).
    owner : str
        Named in the error, e.g. ``"KafkaSink"``.
    fixed : frozenset of str
        Settings ``owner`` sets itself (what its guarantees rest on).
    config, security : dict
        The caller's settings.

    Raises
    ------
    TypeError
        A setting ``client`` does not know (a typo must not pass silently).
    ValueError
        A setting ``owner`` manages.

    Examples
    --------
    >>> from kafka import KafkaProducer
    >>> client_settings(KafkaProducer, "X", frozenset({"acks"}), {"linger_ms": 5}, {})
    {'linger_ms': 5}
    >>> client_settings(KafkaProducer, "X", frozenset({"acks"}), {"acks": 1}, {})
    Traceback (most recent call last):
    ...
    ValueError: X manages these settings itself: ['acks']
    """
    extra = {**(config or {}), **security}
    unknown = sorted(set(extra) - set(client.DEFAULT_CONFIG))
    if unknown:
        raise TypeError(f"unknown {client.__name__} setting(s): {unknown}")
    managed = sorted(set(extra) & fixed)
    if managed:
        raise ValueError(f"{owner} manages these settings itself: {managed}")
    return extra
