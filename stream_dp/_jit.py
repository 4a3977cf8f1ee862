"""The numba switch: whether the learners' fast path is compiled, and the decorators that say so.

numba is optional at run time. A function that the compiled fast path calls is decorated with
:func:`jitable` and stays an ordinary Python function for everyone else; where a compiled loop
beats NumPy's temporaries, :func:`compiled_body` gives the same rule a second body that only
numba sees (each such pair is held together by a test). Nothing else in the library knows
whether numba is there.

Without numba, with ``STREAM_DP_NUMBA=0`` in the environment, or inside
``with use_numba(False):`` the learners take their plain NumPy reference path.

The first use after an install or upgrade compiles the kernels (about a minute of CPU for
``learn_one``'s step and as much for ``learn_many``'s, once: numba caches the machine code;
docs/performance.md, "First start"); a compilation that runs longer than
:data:`NOTICE_AFTER_SECONDS` is announced on the ``stream_dp`` logger, so a first start does
not look hung. The learners do not learn on the NumPy path meanwhile: its results equal the
compiled path's to rounding (the tests hold them within 1e-12), not bit for bit, and a step
replayed after a restart must publish the very release it published before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = [
    "NOTICE_AFTER_SECONDS",
    "NUMBA_INSTALLED",
    "cache_dir",
    "compiled_body",
    "jitable",
    "njit",
    "numba",
    "numba_active",
    "source_digest",
    "tree_digest",
    "use_numba",
]

try:  # the fast path's compiler
    import numba
    from numba.extending import overload, register_jitable
except Exception:  # pragma: no cover - not installed, or unusable (e.g. an unsupported NumPy)
    numba = None

NUMBA_INSTALLED: bool = numba is not None

log = logging.getLogger("stream_dp")

#: A compilation of one of the package's kernels that has run this long is announced.
NOTICE_AFTER_SECONDS = 2.0


def jitable(fn: Callable) -> Callable:
    """Make ``fn`` callable from compiled code; it is unchanged when called from Python."""
    return register_jitable(fn) if NUMBA_INSTALLED else fn


def compiled_body(python_fn: Callable) -> Callable:
    """Register the decorated function as ``python_fn``'s body inside compiled code.

    The decorated function has ``python_fn``'s signature and returns the implementation (numba's
    ``overload`` protocol). Without numba it is never used.
    """

    def register(make_impl: Callable) -> Callable:
        if NUMBA_INSTALLED:
            overload(python_fn)(make_impl)
        return make_impl

    return register


def njit(fn: Callable | None = None, **options) -> Callable:
    """``numba.njit(cache=True, **options)`` when numba is installed, else ``fn`` itself; the
    machine code is cached in :func:`cache_dir`."""

    def wrap(f: Callable) -> Callable:
        if not NUMBA_INSTALLED:
            return f
        # numba picks a function's cache directory when caching is enabled, from its config:
        # set for this decoration only, so other libraries' kernels in the process keep theirs.
        previous = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = cache_dir()
        try:
            return numba.njit(cache=True, **options)(f)
        finally:
            numba.config.CACHE_DIR = previous

    return wrap if fn is None else wrap(fn)


@functools.cache
def source_digest() -> str:
    """A digest of every Python source of the package (16 hex digits).

    numba's cache notices edits to the file of the function it compiled, not to the hooks and
    rules it inlines from other modules (a mechanism's release, a loss, a projection): after
    such an edit it would load machine code that computes the old rule — the old σ, say.
    """
    return tree_digest(Path(__file__).resolve().parent)


def tree_digest(root: Path) -> str:
    """The digest of the ``*.py`` files under ``root``: their paths and contents."""
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def cache_dir() -> str:
    """Where the package's compiled kernels are cached: a directory per :func:`source_digest`,
    so that any edit of the package compiles afresh, under ``$NUMBA_CACHE_DIR`` when set, else
    the package's ``__pycache__/numba`` when writable, else ``~/.cache/stream_dp/numba``."""
    base = os.environ.get("NUMBA_CACHE_DIR")
    if not base:
        in_tree = Path(__file__).resolve().parent / "__pycache__"
        with contextlib.suppress(OSError):
            in_tree.mkdir(exist_ok=True)
        if os.access(in_tree, os.W_OK):
            base = str(in_tree / "numba")
        else:
            cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
            base = os.path.join(cache_home, "stream_dp", "numba")
    return os.path.join(base, f"stream_dp-{source_digest()}")


def _env_allows_numba() -> bool:
    return os.environ.get("STREAM_DP_NUMBA", "1").strip().lower() not in ("0", "false", "no", "off")


_ACTIVE = [NUMBA_INSTALLED and _env_allows_numba()]


def numba_active() -> bool:
    """True when the learners run their compiled fast path."""
    return _ACTIVE[0]


@contextlib.contextmanager
def use_numba(enabled: bool) -> Iterator[None]:
    """Temporarily force the compiled fast path on (if installed) or off (the NumPy reference).

    Examples
    --------
    >>> with use_numba(False):
    ...     numba_active()
    False

    """
    previous = _ACTIVE[0]
    _ACTIVE[0] = bool(enabled) and NUMBA_INSTALLED
    try:
        yield
    finally:
        _ACTIVE[0] = previous


@dataclasses.dataclass
class _Compiling:
    """One compilation being watched."""

    what: str
    started: float
    announced: bool = False
    timer: threading.Timer | None = None


def _notice_listener(base: type) -> object:
    """A numba ``numba:compile`` listener (``base``: numba's ``Listener``) that says so when a
    kernel of this package compiles for longer than :data:`NOTICE_AFTER_SECONDS`, and when it
    is done.

    numba signals only real compilations (a kernel loaded from its on-disk cache is silent); the
    events of the kernels it compiles on the way nest inside its own, on its thread. The notice
    never fails a compilation.
    """

    class CompileNotice(base):
        def __init__(self) -> None:
            self._local = threading.local()

        def on_start(self, event) -> None:
            local = self._local
            local.depth = getattr(local, "depth", 0) + 1
            if local.depth == 1:
                with contextlib.suppress(Exception):
                    self._start(local, (event.data or {}).get("dispatcher"))

        def on_end(self, event) -> None:
            local = self._local
            local.depth = max(getattr(local, "depth", 1) - 1, 0)
            if local.depth == 0:
                with contextlib.suppress(Exception):
                    self._end(local)

        @staticmethod
        def _start(local, dispatcher) -> None:
            local.compiling = None
            fn = getattr(dispatcher, "py_func", None)
            module = getattr(fn, "__module__", None) or ""
            if not module.startswith("stream_dp"):
                return
            cache = getattr(getattr(dispatcher, "_cache", None), "_cache_path", None)
            # Shared with the timer's thread (``local`` is this thread's alone).
            this = _Compiling(f"{module}.{fn.__qualname__}", time.monotonic())

            def announce() -> None:
                this.announced = True
                log.warning(
                    "compiling %s with numba: the first start after an install or upgrade "
                    "compiles the kernels once, about a minute of CPU for learn_one's and as "
                    "much for learn_many's (then cached%s); STREAM_DP_NUMBA=0 runs the slower "
                    "NumPy path without compiling",
                    this.what,
                    f" in {cache}" if cache else "",
                )

            this.timer = threading.Timer(NOTICE_AFTER_SECONDS, announce)
            this.timer.daemon = True
            this.timer.start()
            local.compiling = this

        @staticmethod
        def _end(local) -> None:
            this = getattr(local, "compiling", None)
            if this is None:
                return
            local.compiling = None
            this.timer.cancel()
            if this.announced:
                log.warning("compiled %s in %.0f s", this.what, time.monotonic() - this.started)

    return CompileNotice()


if NUMBA_INSTALLED:
    try:
        from numba.core import event as _event

        _event.register("numba:compile", _notice_listener(_event.Listener))
    except Exception:  # pragma: no cover - a numba without the event API: compiles silently
        pass
