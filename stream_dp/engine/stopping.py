"""Stop requests: SIGTERM and Ctrl-C end a run gracefully, and within seconds in any case.

A stop request (a signal, or :meth:`StopRequest.request` from another thread) lets the engine
end gracefully: learn the batch in hand, checkpoint the cycle and publish it. That usually
takes well under a second, but not always: the learner may be busy (numba compiling its kernels
on a first start, a slow metric step) or Kafka away. So a request has
:data:`STOP_GRACE_SECONDS`; after that, or at a second signal, the main thread is stopped where
it is by :class:`Abandoned`, and the run ends as a crash would. That is safe by design (the
engine survives SIGKILL at any point): nothing that no checkpoint holds was published, and the
next start resumes from the last checkpoint and learns the rest again, identically
(``docs/privacy.md``, *The engine: one release per step*).
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from typing import Any

__all__ = ["STOP_GRACE_SECONDS", "Abandoned", "StopRequest"]

#: Seconds a stop request has to end the run gracefully.
STOP_GRACE_SECONDS = 3.0


class Abandoned(BaseException):
    """The stop request was not done within its grace, or a second signal came: the run stops
    where it is, without a last checkpoint (a ``BaseException``, as ``KeyboardInterrupt``, so
    that no ``except Exception`` on the way swallows it)."""


class StopRequest:
    """Whether, and since when, a run was asked to stop; the signal handlers that ask.

    Parameters
    ----------
    grace : float, default STOP_GRACE_SECONDS

    Examples
    --------
    >>> stop = StopRequest(grace=5.0)
    >>> stop.requested, stop.overdue()
    (False, False)
    >>> stop.request()
    >>> stop.requested, stop.overdue(), stop.overdue(time.monotonic() + 5.0)
    (True, False, True)
    """

    def __init__(self, grace: float = STOP_GRACE_SECONDS) -> None:
        self.grace = grace
        self.event = threading.Event()
        #: ``time.monotonic()`` of the first request (None: none yet).
        self.since: float | None = None
        self._lock = threading.Lock()
        self._armed = False
        self._timer: threading.Timer | None = None
        self._saved: dict[Any, Any] = {}

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    def request(self) -> None:
        """Ask the run to stop (thread-safe, idempotent)."""
        with self._lock:
            if self.since is None:
                self.since = time.monotonic()
        self.event.set()

    def overdue(self, now: float | None = None) -> bool:
        """Whether a request has waited its grace (at ``now``, of ``time.monotonic``)."""
        since = self.since
        now = time.monotonic() if now is None else now
        return since is not None and now - since >= self.grace

    # -- signals ---------------------------------------------------------------------------
    def install(self) -> None:
        """Handle SIGTERM and SIGINT until :meth:`restore` (in the main thread only: signal
        handlers can be set nowhere else)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._saved[sig] = signal.signal(sig, self._on_signal)
        self._armed = True

    def disarm(self) -> None:
        """The run has ended: a late signal or timer no longer stops anything."""
        with self._lock:
            self._armed = False
            if self._timer is not None:
                self._timer.cancel()

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        self.disarm()
        saved, self._saved = self._saved, {}
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self._armed:
            return
        if self.requested:
            raise Abandoned()
        self.request()
        timer = threading.Timer(self.grace, self._fire, args=(signum,))
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _fire(self, signum: int) -> None:
        """At the end of the grace: the same signal again, in the main thread (which stops it
        where it is, if the run is still going)."""
        with self._lock:
            if self._armed:
                _thread.interrupt_main(signum)
