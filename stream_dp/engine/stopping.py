"""Stop requests: SIGTERM and Ctrl-C end a run gracefully, and within seconds in any case.

A stop request lets the engine end gracefully: learn the batch in hand, checkpoint the cycle
and publish it. That usually takes well under a second, but not always: Kafka may be away, or
the learner busy (numba compiling its kernels on a first start, a slow metric step).

* Asked by :meth:`StopRequest.request` (``Engine.stop()`` from another thread), the engine
  waits up to :data:`STOP_GRACE_SECONDS` for a publication in progress, then stops with the
  cycle checkpointed (the next start publishes it).
* Asked by a signal, it has :data:`SIGNAL_GRACE_SECONDS` for all of it; after that, or at a
  second signal, the main thread is stopped where it is by :class:`Abandoned`, and the run ends
  as a crash would. That is safe by design (the engine survives SIGKILL at any point): nothing
  that no checkpoint holds was published, and the next start resumes from the last checkpoint
  and learns the rest again, identically (``docs/privacy.md``, *The engine: one release per
  step*).
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from typing import Any

__all__ = ["SIGNAL_GRACE_SECONDS", "STOP_GRACE_SECONDS", "Abandoned", "StopRequest"]

#: Seconds a stop request waits for a publication in progress before leaving it to the next
#: start (the checkpoint holds it).
STOP_GRACE_SECONDS = 10.0
#: Seconds a signal's stop request has to end the run gracefully, before it is stopped where
#: it is (``stream-dp run`` then exits within about as long).
SIGNAL_GRACE_SECONDS = 3.0


class Abandoned(BaseException):
    """The stop request was not done within its grace, or a second signal came: the run stops
    where it is, without a last checkpoint (a ``BaseException``, as ``KeyboardInterrupt``, so
    that no ``except Exception`` on the way swallows it)."""


class StopRequest:
    """Whether, and since when, a run was asked to stop; the signal handlers that ask.

    Examples
    --------
    >>> stop = StopRequest()
    >>> stop.requested, stop.overdue()
    (False, False)
    >>> stop.request(grace=5.0)
    >>> stop.requested, stop.overdue(), stop.overdue(time.monotonic() + 5.0)
    (True, False, True)
    """

    def __init__(self) -> None:
        #: Seconds the first request (or a later, more pressing one) grants.
        self.grace = STOP_GRACE_SECONDS
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

    def request(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Ask the run to stop within about ``grace`` seconds (thread-safe; a later request
        may only shorten the wait)."""
        with self._lock:
            if self.since is None:
                self.since, self.grace = time.monotonic(), grace
            else:
                self.grace = min(self.grace, grace)
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
        if self._timer is not None:
            raise Abandoned()
        self.request(SIGNAL_GRACE_SECONDS)
        left = max(0.0, self.since + self.grace - time.monotonic())
        timer = threading.Timer(left, self._fire, args=(signum,))
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _fire(self, signum: int) -> None:
        """At the end of the grace: the same signal again, in the main thread (which stops it
        where it is, if the run is still going)."""
        with self._lock:
            if self._armed:
                _thread.interrupt_main(signum)
