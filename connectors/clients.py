"""The Kafka clients by name: the factory the connectors and the engine choose a client with.

The interface is :mod:`connectors.transport`; the implementations are
:mod:`connectors._kafka_python` and :mod:`connectors._confluent`, imported on first use (the
``confluent`` extra is optional).

Examples
--------
>>> client("kafka-python").name
'kafka-python'
>>> client("librdkafka")
Traceback (most recent call last):
...
ValueError: unknown Kafka client 'librdkafka': choose one of 'kafka-python', 'confluent-kafka'
"""

from __future__ import annotations

from .transport import Client

__all__ = ["CLIENTS", "DEFAULT_CLIENT", "client"]

#: The clients by name, the default first.
CLIENTS = ("kafka-python", "confluent-kafka")
DEFAULT_CLIENT = CLIENTS[0]

_CLIENTS: dict[str, Client] = {}


def client(name: str | Client = DEFAULT_CLIENT) -> Client:
    """The :class:`Client` named ``name`` (a :class:`Client` is returned as it is).

    Raises
    ------
    ValueError
        An unknown name.
    ImportError
        ``"confluent-kafka"`` without the ``confluent-kafka`` package (the ``confluent``
        extra).
    """
    if isinstance(name, Client):
        return name
    if name not in CLIENTS:
        raise ValueError(
            f"unknown Kafka client {name!r}: choose one of {', '.join(repr(c) for c in CLIENTS)}"
        )
    if name not in _CLIENTS:
        if name == "kafka-python":
            from ._kafka_python import KafkaPythonClient

            _CLIENTS[name] = KafkaPythonClient()
        else:
            try:
                import confluent_kafka  # noqa: F401 - its absence is the error here
            except ImportError as err:
                raise ImportError(
                    "the confluent-kafka client needs the confluent-kafka package "
                    "(pip install 'stream-dp[confluent]')",
                    name="confluent_kafka",
                ) from err
            from ._confluent import ConfluentClient

            _CLIENTS[name] = ConfluentClient()
    return _CLIENTS[name]
