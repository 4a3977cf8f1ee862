"""A scale-out instance's heartbeat: its status summary on a compacted Kafka topic.

Each instance of a per-partition model writes its status to a file on its own machine
(``status.<instance>.json``): a local view, which a killed instance leaves behind as it was. The
cluster's view is built from Kafka instead (``stream-dp status``, :mod:`stream_dp.apps.status`):

* **who owns a partition** is the consumer group's current assignment, read from the group
  coordinator. The group consumer of an instance carries the client id
  :func:`member_client_id` (``stream-dp.<model_id>/<instance>``), which maps a member to the
  instance;
* **when an owner was last heard of** is its heartbeat: at every status report
  (``[status] interval_seconds``) the instance publishes its status summary -- the content of
  its status file: counters, steps and privacy spent, nothing computed from record values and
  no model -- to the status topic (:func:`status_topic`), keyed by :func:`status_key`. The
  topic is compacted (the newest summary of each instance is kept) and its old segments are
  deleted after :data:`RETENTION_MS`, so instances long gone drop out.

Publishing runs on a thread of its own holding only the newest summary: a broker that is away
never stalls the learning loop, and a summary that could not be sent is replaced by the next.

Examples
--------
>>> member_client_id("bank", "host-1"), status_key("bank", "host-1")
('stream-dp.bank/host-1', b'bank/host-1')
>>> instance_of("stream-dp.bank/host-1", "bank"), instance_of("console-consumer", "bank")
('host-1', None)
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from stream_dp.engine.config import EngineConfig

__all__ = [
    "RETENTION_MS",
    "StatusPublisher",
    "instance_of",
    "member_client_id",
    "status_key",
    "status_topic",
    "status_topic_configs",
]

log = logging.getLogger("stream_dp.engine")

#: How long the status topic keeps what is not an instance's newest summary (7 days): an
#: instance that has not published for that long is forgotten.
RETENTION_MS = 7 * 24 * 3600 * 1000

#: Segments roll hourly so the compaction keeps the topic at about one summary per instance:
#: ``stream-dp status`` reads all of it.
SEGMENT_MS = 3600 * 1000


def status_topic(config: EngineConfig) -> str:
    """The status topic of a per-partition model: ``scale.status_topic``, else
    ``<releases topic>.status`` (on the release topic's cluster)."""
    return config.scale.status_topic or f"{config.releases.topic}.status"


def status_topic_configs() -> dict[str, str]:
    """The status topic's settings when the engine creates it."""
    return {
        "cleanup.policy": "compact,delete",
        "retention.ms": str(RETENTION_MS),
        "segment.ms": str(SEGMENT_MS),
    }


def member_client_id(model_id: str, instance: str) -> str:
    """The client id of an instance's group consumer: it names the instance to the group."""
    return f"stream-dp.{model_id}/{instance}"


def instance_of(client_id: str, model_id: str) -> str | None:
    """The instance a group member's ``client_id`` names, or None (not an instance of it)."""
    prefix = member_client_id(model_id, "")
    return client_id[len(prefix) :] or None if client_id.startswith(prefix) else None


def status_key(model_id: str, instance: str) -> bytes:
    """The key of an instance's summaries on the status topic."""
    return f"{model_id}/{instance}".encode()


class StatusPublisher:
    """Publishes an instance's newest status summary to the status topic, from its own thread.

    Parameters
    ----------
    config : EngineConfig
        The model's config (the release topic's cluster, its security settings and client).
    instance : str
        The instance's name (the key of its summaries).

    Examples
    --------
    >>> publisher = StatusPublisher(config, "host-1")  # doctest: +SKIP
    >>> publisher.publish(scaleout.status())            # doctest: +SKIP
    >>> publisher.close()                               # doctest: +SKIP
    """

    def __init__(self, config: EngineConfig, instance: str) -> None:
        self.config = config
        self.topic = status_topic(config)
        self.key = status_key(config.model.model_id, instance)
        self.client_id = member_client_id(config.model.model_id, instance)
        self._newest: bytes | None = None
        self._closing = False
        self._wake = threading.Condition()
        self._producer: Any = None
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="stream-dp-status", daemon=True)
        self._thread.start()

    def publish(self, summary: dict[str, Any]) -> None:
        """Hand over ``summary`` (replacing one not sent yet); never blocks on Kafka."""
        value = json.dumps(summary, separators=(",", ":"), default=str).encode()
        with self._wake:
            self._newest = value
            self._wake.notify()

    def close(self, timeout: float = 3.0) -> None:
        """Send the summary handed over last (at most ``timeout`` seconds), then stop."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._newest is None and not self._closing:
                    self._wake.wait()
                value, self._newest = self._newest, None
                closing = self._closing
            if value is not None:
                self._send(value, flush=closing)
            if closing:
                break
        if self._producer is not None:
            try:
                self._producer.close(timeout=1.0)
            except Exception:  # noqa: BLE001 - status only
                pass

    def _send(self, value: bytes, flush: bool) -> None:
        from connectors.clients import client

        rel = self.config.releases
        try:
            if self._producer is None:
                self._producer = client(self.config.kafka.client).producer(
                    bootstrap_servers=rel.bootstrap_servers,
                    client_id=self.client_id,
                    bootstrap_timeout_ms=5000,
                    max_block_ms=5000,
                    **rel.security,
                )
            self._producer.send(self.topic, value=value, key=self.key)
            if flush:
                self._producer.flush(timeout=2.0)
        except Exception as err:  # noqa: BLE001 - the status must never stop the engine
            if not self._failing:
                log.warning("cannot publish the status to topic %s: %s", self.topic, err)
            self._failing = True
            return
        if self._failing:
            log.info("publishing the status to topic %s again", self.topic)
        self._failing = False
