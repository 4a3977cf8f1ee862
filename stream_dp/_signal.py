"""The two functions of ``scipy.signal`` the library calls, imported at their first call.

Importing ``scipy.signal`` took ~0.44 s (it imports ``scipy.stats`` too), two fifths of what an
engine process spent importing before it starts (docs/performance.md). The correlated-noise and
unit-level code that calls these is imported by every learner module, while only OnPairMF and
unit-level learners run it. Each wrapper is the SciPy function itself once imported.

Examples
--------
>>> fftconvolve([1.0, 2.0], [1.0, 1.0]).round(12).tolist()
[1.0, 3.0, 2.0]
"""

from __future__ import annotations

from typing import Any

__all__ = ["fftconvolve", "lfilter"]


def fftconvolve(*args: Any, **kwargs: Any) -> Any:
    """``scipy.signal.fftconvolve``."""
    from scipy import signal

    return signal.fftconvolve(*args, **kwargs)


def lfilter(*args: Any, **kwargs: Any) -> Any:
    """``scipy.signal.lfilter``."""
    from scipy import signal

    return signal.lfilter(*args, **kwargs)
