"""Budget schedules: how a total ρ is split over the releases of a stream (docs/privacy.md,
*Accounting*).

A schedule maps the k-th *charged* release (k = 1, 2, …) to the share of ρ it may spend. The
shares of every schedule sum to at most 1, and are shaved by ``_SAFETY`` so that floating-point
summation of the ledger can never exceed the budget.

"""

from __future__ import annotations

import math

from scipy import special

__all__ = ["Schedule", "HorizonSchedule", "AnytimeSchedule"]

# A relative shave of 1e-9 is invisible in σ (it changes σ by 5e-10 relative) but guarantees
# that n correctly rounded shares never sum above the budget.
_SAFETY = 1.0 - 1e-9


class Schedule:
    """Base class: ``share(k)`` is the fraction of the total ρ the k-th release may spend."""

    def share(self, k: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def n_releases(self) -> int | None:
        return None

    def to_dict(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError


class HorizonSchedule(Schedule):
    """Huai et al. (2020) Alg. 1: each of ``n_releases`` releases costs ``ρ / n_releases``.

    Examples
    --------
    >>> s = HorizonSchedule(4)
    >>> round(s.share(1), 6), s.share(5)
    (0.25, 0.0)

    """

    def __init__(self, n_releases: int) -> None:
        if int(n_releases) < 1:
            raise ValueError(f"a horizon schedule needs at least one release, got {n_releases}")
        self._n = int(n_releases)

    @property
    def n_releases(self) -> int:
        return self._n

    def share(self, k: int) -> float:
        if k < 1:
            raise ValueError("releases are counted from 1")
        return _SAFETY / self._n if k <= self._n else 0.0

    def to_dict(self) -> dict:
        return {"kind": "horizon", "n_releases": self._n}

    def __repr__(self) -> str:
        return f"HorizonSchedule({self._n})"


class AnytimeSchedule(Schedule):
    """For streams with no known end: ``ρ_k = ρ · k^{−p} / ζ(p)``, p > 1; Σ_k ρ_k = ρ for ever.

    Examples
    --------
    >>> s = AnytimeSchedule(1.1)
    >>> round(sum(s.share(k) for k in range(1, 100_000)), 3) < 1
    True

    """

    def __init__(self, p: float = 1.1) -> None:
        if not p > 1.0:
            raise ValueError(f"the anytime schedule needs p > 1 (Σ k^-p must converge), got {p}")
        self.p = float(p)
        self._zeta = float(special.zeta(self.p, 1))

    def share(self, k: int) -> float:
        if k < 1:
            raise ValueError("releases are counted from 1")
        return _SAFETY * math.pow(k, -self.p) / self._zeta

    def to_dict(self) -> dict:
        return {"kind": "anytime", "p": self.p}

    def __repr__(self) -> str:
        return f"AnytimeSchedule(p={self.p})"


def schedule_from_dict(d: dict) -> Schedule:
    if d["kind"] == "horizon":
        return HorizonSchedule(d["n_releases"])
    if d["kind"] == "anytime":
        return AnytimeSchedule(d["p"])
    raise ValueError(f"unknown schedule {d!r}")


__all__ += ["schedule_from_dict"]
