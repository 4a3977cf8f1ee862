"""An exact running sum of floats: the partials of Shewchuk's grow-expansion.

The accountants keep their totals as partials, so a ledger of a million charges sums to the
correctly rounded total whatever the order (the algorithm behind :func:`math.fsum`, kept
incrementally); :mod:`stream_dp.privacy.accountant` and :mod:`stream_dp.privacy.gdp` share it.

Examples
--------
>>> import math
>>> partials: list[float] = []
>>> for x in [1e16, 1.0, -1e16]:
...     grow(partials, x)
>>> math.fsum(partials)
1.0

"""

from __future__ import annotations

__all__ = ["grow"]


def grow(partials: list[float], x: float) -> None:
    """Add ``x`` to the non-overlapping ``partials`` in place (their sum stays exact)."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]
