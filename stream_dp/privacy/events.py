"""Privacy events: frozen parameter records of what was released, and with what noise.

Modelled on Google's ``dp_accounting``: an event holds the parameters of one release — its step,
the mechanism name it is charged under, its sensitivity and noise scale — and computes nothing.
What a release *costs* is an accountant's reading of those parameters
(:mod:`stream_dp.privacy.accountant`: ρ for zCDP, ε for pure DP), so the ledger stores only
parameters and every cost is derived again from them.

A release at every record makes an event the one object built per record, so events are
``NamedTuple`` s (the cheapest immutable record Python builds). :class:`GaussianEvents` is the
batch form of :class:`GaussianEvent`: the releases of a run of steps as columns, charged in one
call and stored row by row exactly as the single events would be.

"""

from __future__ import annotations

import enum
from typing import NamedTuple

import numpy as np

__all__ = [
    "ApproxDPEvent",
    "Event",
    "GAUSSIAN_MECHANISMS",
    "GaussianEvent",
    "GaussianEvents",
    "LaplaceEvent",
    "NeighbouringRelation",
    "event_from_dict",
    "gaussian_rho",
]

#: The names a Gaussian release may be charged under: one per component that can share a
#: budget (a model's releases, its correlated gradient noise, a private scaler, private operator
#: metrics), so that the ledger tells their charges apart and each step can carry one of each.
GAUSSIAN_MECHANISMS = (
    "gaussian",
    "gaussian-correlated",
    "gaussian-scaler",
    "gaussian-metrics",
)


class NeighbouringRelation(enum.Enum):
    """Which datasets (streams) count as neighbours: what one guarantee protects.

    Every mechanism of the project is calibrated for :attr:`REPLACE_ONE` — two streams of the
    same length differing in one record, anywhere, features and label (``docs/privacy.md``,
    *Privacy unit and neighbouring streams*). An accountant composes only events calibrated for
    its relation.
    """

    REPLACE_ONE = "replace-one"


def gaussian_rho(sensitivity: float, sigma: float) -> float:
    """The zCDP cost ``Δ²/(2σ²)`` of one Gaussian release (Bun & Steinke 2016, Prop. 1.6).

    The one expression every Gaussian cost is computed with (the accountant's reading of an
    event, of a stored ledger row, a calibration's check), so all of them agree bit for bit.

    Examples
    --------
    >>> gaussian_rho(1.0, 2.0)
    0.125

    """
    return sensitivity**2 / (2.0 * sigma**2)


class GaussianEvent(NamedTuple):
    """One Gaussian release: ℓ2 sensitivity Δ, noise std σ per coordinate.

    Examples
    --------
    >>> event = GaussianEvent(step=3, sensitivity=1.0, sigma=2.0)
    >>> event.sigma, event.to_dict()["mechanism"]
    (2.0, 'gaussian')

    """

    step: int
    sensitivity: float
    sigma: float
    mechanism: str = "gaussian"

    def to_dict(self) -> dict:
        return self._asdict()


class GaussianEvents(NamedTuple):
    """Gaussian releases at non-decreasing steps, all under one mechanism name, as columns.

    The batch form of :class:`GaussianEvent` (a run of compiled steps reports its releases this
    way): charged in one call, it leaves the ledger, the totals and the refusals that charging
    :meth:`events` one by one would leave, except that a batch the budget cannot pay for in full
    is refused whole.

    Examples
    --------
    >>> import numpy as np
    >>> batch = GaussianEvents(np.array([4, 5]), np.array([0.5, 0.4]), np.array([2.0, 2.0]))
    >>> batch.events()[1]
    GaussianEvent(step=5, sensitivity=0.4, sigma=2.0, mechanism='gaussian')

    """

    steps: np.ndarray
    sensitivities: np.ndarray
    sigmas: np.ndarray
    mechanism: str = "gaussian"

    def events(self) -> list[GaussianEvent]:
        """The releases one by one."""
        rows = zip(self.steps.tolist(), self.sensitivities.tolist(), self.sigmas.tolist(),
                   strict=True)  # fmt: skip
        return [GaussianEvent(t, s, g, self.mechanism) for t, s, g in rows]


class LaplaceEvent(NamedTuple):
    """One Laplace release: ℓ1 sensitivity Δ₁, scale b per coordinate.

    Examples
    --------
    >>> LaplaceEvent(step=1, sensitivity=1.0, scale=4.0).scale
    4.0

    """

    step: int
    sensitivity: float
    scale: float
    mechanism: str = "laplace"

    def to_dict(self) -> dict:
        return self._asdict()


class ApproxDPEvent(NamedTuple):
    """A release calibrated directly to (ε, δ)-DP (e.g. the classic ``√(2 ln(1.25/δ))`` Gaussian).

    Offline algorithms whose papers state their guarantee this way record it as is: ε and δ are
    parameters of the release here, and such events compose by basic composition.
    """

    step: int
    sensitivity: float
    scale: float
    epsilon: float
    delta: float
    mechanism: str = "gaussian-approx"

    def to_dict(self) -> dict:
        return self._asdict()


Event = GaussianEvent | LaplaceEvent | ApproxDPEvent


def event_from_dict(d: dict) -> Event:
    """Inverse of ``to_dict`` (checkpoints that hold a list of events; a stored cost, which older
    checkpoints wrote beside the parameters, is dropped: it is derived again)."""
    d = dict(d)
    mech = d.get("mechanism")
    d.pop("rho", None)
    if mech in GAUSSIAN_MECHANISMS:
        return GaussianEvent(**d)
    if mech == "laplace":
        d.pop("epsilon", None)
        return LaplaceEvent(**d)
    if mech == "gaussian-approx":
        return ApproxDPEvent(**d)
    raise ValueError(f"unknown mechanism in ledger entry: {mech!r}")
