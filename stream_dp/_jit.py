"""The numba switch: whether the learners' fast path is compiled, and the decorators that say so.

numba is optional at run time. A function that the compiled fast path calls is decorated with
:func:`jitable` and stays an ordinary Python function for everyone else; where a compiled loop
beats NumPy's temporaries, :func:`compiled_body` gives the same rule a second body that only
numba sees (each such pair is held together by a test). Nothing else in the library knows
whether numba is there.

Without numba, with ``STREAM_DP_NUMBA=0`` in the environment, or inside
``with use_numba(False):`` the learners take their plain NumPy reference path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

__all__ = [
    "NUMBA_INSTALLED",
    "compiled_body",
    "jitable",
    "njit",
    "numba",
    "numba_active",
    "use_numba",
]

try:  # the fast path's compiler
    import numba
    from numba.extending import overload, register_jitable
except Exception:  # pragma: no cover - not installed, or unusable (e.g. an unsupported NumPy)
    numba = None

NUMBA_INSTALLED: bool = numba is not None


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
    """``numba.njit(cache=True, **options)`` when numba is installed, else ``fn`` itself."""

    def wrap(f: Callable) -> Callable:
        if not NUMBA_INSTALLED:
            return f
        return numba.njit(cache=True, **options)(f)

    return wrap if fn is None else wrap(fn)


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
