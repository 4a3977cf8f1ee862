"""Bounded exponential backoff and bounded calls, shared by the Kafka connectors (private)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Backoff", "bounded_call", "is_retriable"]


def is_retriable(exc: BaseException) -> bool:
    """Whether ``exc`` is a transient broker/network failure worth retrying.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    bool
        True for kafka-python errors flagged ``retriable`` (timeouts, connection errors,
        coordinator or leader moves), "no brokers available", and OS-level connection errors.
    """
    # Imported here so that file-only users of connectors never load the Kafka client.
    import kafka.errors as kafka_errors

    # kafka-python < 3 raised NoBrokersAvailable when the bootstrap servers were unreachable;
    # 3.x raises KafkaTimeoutError (retriable). Accept both so either version behaves.
    no_brokers = getattr(kafka_errors, "NoBrokersAvailable", None)
    if isinstance(no_brokers, type) and isinstance(exc, no_brokers):
        return True
    if isinstance(exc, kafka_errors.KafkaError):
        return bool(getattr(exc, "retriable", False))
    return isinstance(exc, ConnectionError | TimeoutError)


def bounded_call(
    fn: Callable[[], Any],
    timeout_s: float,
    message: str,
    *,
    on_wait: Callable[[], None] | None = None,
    thread_name: str = "stream-dp-kafka",
) -> Any:
    """Run ``fn`` in a worker thread; return its result, raise its error, or time out.

    For client calls that wait without a bound (or longer than the caller may) while a broker
    is away. ``fn`` goes on in its (daemon) thread after a timeout: the caller discards what it
    was working on.

    Parameters
    ----------
    fn : callable
    timeout_s : float
    message : str
        The ``KafkaTimeoutError``'s message on a timeout.
    on_wait : callable, optional
        Called about twice a second meanwhile; it may raise (the caller gives up).
    thread_name : str

    Examples
    --------
    >>> bounded_call(lambda: 42, 1.0, "never")
    42
    """
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            box["error"] = exc

    worker = threading.Thread(target=work, name=thread_name, daemon=True)
    worker.start()
    deadline = time.monotonic() + timeout_s
    while worker.is_alive():
        worker.join(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
        if worker.is_alive():
            if on_wait is not None:
                on_wait()
            if time.monotonic() >= deadline:
                from kafka.errors import KafkaTimeoutError

                raise KafkaTimeoutError(message)
    if "error" in box:
        raise box["error"]
    return box.get("value")


class Backoff:
    """Exponential backoff with jitter, capped at ``maximum`` seconds.

    Parameters
    ----------
    initial : float
        First delay in seconds.
    maximum : float
        Upper bound of any single delay.
    logger : logging.Logger
        Where failures are reported.
    what : str
        Short description of the operation, for log messages.

    Examples
    --------
    >>> b = Backoff(initial=0.1, maximum=1.0, logger=logging.getLogger("x"), what="poll")
    >>> [round(b.next_delay(), 1) <= 1.0 for _ in range(6)]
    [True, True, True, True, True, True]
    """

    def __init__(
        self, *, initial: float = 0.1, maximum: float = 10.0, logger: logging.Logger, what: str
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.logger = logger
        self.what = what
        self.failures = 0
        self.first_failure: float | None = None
        self.remind_every = 60.0
        self._last_loud: float | None = None

    def next_delay(self) -> float:
        """Return the next delay (and count one more failure)."""
        base = min(self.maximum, self.initial * (2.0 ** min(self.failures, 30)))
        self.failures += 1
        # Jitter keeps many clients from hammering a recovering broker in lockstep.
        return min(self.maximum, base * random.uniform(0.8, 1.2))

    def failed(self, exc: BaseException, max_sleep: float | None = None) -> float:
        """Log a transient failure, sleep for the next delay, and return that delay.

        Parameters
        ----------
        exc : BaseException
            The failure, for the log.
        max_sleep : float, optional
            Cap on this sleep, e.g. the time left before a caller's deadline.
        """
        if self.first_failure is None:
            self.first_failure = time.monotonic()
        delay = self.next_delay()
        if max_sleep is not None:
            delay = max(0.0, min(delay, max_sleep))
        # An outage of hours must not write thousands of lines: the first failure and then
        # one line a minute at WARNING, the rest at DEBUG.
        now = time.monotonic()
        loud = self._last_loud is None or now - self._last_loud >= self.remind_every
        if loud:
            self._last_loud = now
        self.logger.log(
            logging.WARNING if loud else logging.DEBUG,
            "%s failed (%s); retry %d in %.1f s",
            self.what,
            exc,
            self.failures,
            delay,
        )
        time.sleep(delay)
        return delay

    def succeeded(self) -> None:
        """Reset after a success, logging the recovery if there were failures."""
        if self.failures:
            outage = time.monotonic() - (self.first_failure or time.monotonic())
            self.logger.info(
                "%s recovered after %d failure(s) over %.1f s", self.what, self.failures, outage
            )
        self.failures = 0
        self.first_failure = None
        self._last_loud = None
