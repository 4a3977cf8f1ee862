"""Broker outages as the engine lives through them: said once, ridden out, or ended at a deadline.

The source and the publisher each know since when they have not reached Kafka; an
:class:`OutageWatch` follows both, logs when the broker went away and when it came back (once
each, however many reconnects kafka-python tries meanwhile), and raises
:class:`~stream_dp.engine.errors.KafkaUnavailable` once the outage has lasted
``kafka.outage_deadline_seconds`` (default: never). Stopping at the deadline is clean: the state
is checkpointed and the next start continues.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from stream_dp.engine.errors import KafkaUnavailable

__all__ = ["OutageWatch"]

log = logging.getLogger("stream_dp.engine")


class OutageWatch:
    """Follows the parts that talk to Kafka (see the module docstring).

    Parameters
    ----------
    deadline_seconds : float, optional
        ``kafka.outage_deadline_seconds``: how long an outage may last (None: any length).

    Examples
    --------
    >>> class Source:
    ...     unreachable_since = None
    >>> source = Source()
    >>> watch = OutageWatch(60.0)
    >>> watch.follow(source, None)
    >>> watch.since() is None
    True
    >>> source.unreachable_since = time.time() - 61
    >>> try:
    ...     watch.check()
    ... except KafkaUnavailable as err:
    ...     print(str(err).split(" since")[0])
    Kafka unreachable
    """

    def __init__(self, deadline_seconds: float | None) -> None:
        self.deadline_seconds = deadline_seconds
        self._source: Any = None
        self._publisher: Any = None
        self._logged: float | None = None

    def follow(self, source: Any, publisher: Any) -> None:
        """Watch ``source`` (``unreachable_since``) and ``publisher`` (``failing_since``)."""
        self._source, self._publisher = source, publisher

    def since(self) -> float | None:
        """Wall time since which Kafka has not answered (source or publisher), or None."""
        times = [
            getattr(self._source, "unreachable_since", None),
            getattr(self._publisher, "failing_since", None),
        ]
        times = [t for t in times if t is not None]
        return min(times) if times else None

    def watch(self) -> None:
        """Log the start and the end of an outage, once each."""
        since = self.since()
        if since is not None and self._logged is None:
            self._logged = since
            log.warning(
                "Kafka unreachable since %s; riding it out%s",
                time.strftime("%H:%M:%S", time.localtime(since)),
                ""
                if self.deadline_seconds is None
                else f" for up to {self.deadline_seconds:.0f} s",
            )
        elif since is None and self._logged is not None:
            log.warning("Kafka reachable again after %.0f s", time.time() - self._logged)
            self._logged = None

    def check(self) -> None:
        """Raise :class:`KafkaUnavailable` once the outage has lasted the deadline."""
        limit, since = self.deadline_seconds, self.since()
        if limit is not None and since is not None and time.time() - since >= limit:
            raise KafkaUnavailable(
                f"Kafka unreachable since {time.strftime('%H:%M:%S', time.localtime(since))} "
                f"({time.time() - since:.0f} s, kafka.outage_deadline_seconds = {limit:g}): "
                "stopped cleanly; the state is checkpointed and the next start continues"
            )
