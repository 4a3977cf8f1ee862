"""Privacy events: small immutable records of one released value each.

Modelled on Google's ``dp_accounting``: an event says *what* was released and with what noise;
an accountant (:mod:`stream_dp.privacy.accountant`) only composes events. Each event knows its
own cost, so the ledger never stores a number that is not derivable from the mechanism.

"""

from __future__ import annotations

import dataclasses
import enum
import math

__all__ = [
    "ApproxDPEvent",
    "Event",
    "GaussianEvent",
    "LaplaceEvent",
    "GAUSSIAN_MECHANISMS",
    "NeighbouringRelation",
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

    The one expression every Gaussian cost is computed with (events, ledger rows, the
    event-free charge), so all of them agree bit for bit.

    Examples
    --------
    >>> gaussian_rho(1.0, 2.0)
    0.125

    """
    return sensitivity**2 / (2.0 * sigma**2)


@dataclasses.dataclass(frozen=True)
class GaussianEvent:
    """One Gaussian release: ℓ2 sensitivity Δ, noise std σ per coordinate.

    Its zCDP cost is ``ρ = Δ² / (2σ²)`` (Bun & Steinke 2016, Prop. 1.6).

    Examples
    --------
    >>> GaussianEvent(step=3, sensitivity=1.0, sigma=2.0).rho
    0.125

    """

    step: int
    sensitivity: float
    sigma: float
    mechanism: str = "gaussian"

    def __post_init__(self) -> None:
        if not (self.sensitivity >= 0 and math.isfinite(self.sensitivity)):
            raise ValueError(f"sensitivity must be finite and >= 0, got {self.sensitivity!r}")
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma!r}")
        if self.mechanism not in GAUSSIAN_MECHANISMS:
            raise ValueError(f"a Gaussian mechanism is one of {GAUSSIAN_MECHANISMS}, got "
                             f"{self.mechanism!r}")  # fmt: skip

    @property
    def rho(self) -> float:
        return gaussian_rho(self.sensitivity, self.sigma)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "rho": self.rho}


@dataclasses.dataclass(frozen=True)
class LaplaceEvent:
    """One Laplace release: ℓ1 sensitivity Δ₁, scale b per coordinate; pure ``ε = Δ₁ / b``."""

    step: int
    sensitivity: float
    scale: float
    mechanism: str = "laplace"

    def __post_init__(self) -> None:
        if not (self.sensitivity >= 0 and math.isfinite(self.sensitivity)):
            raise ValueError(f"sensitivity must be finite and >= 0, got {self.sensitivity!r}")
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale!r}")

    @property
    def epsilon(self) -> float:
        return self.sensitivity / self.scale

    @property
    def rho(self) -> float:
        # ε-DP implies (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4).
        return self.epsilon**2 / 2.0

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "epsilon": self.epsilon}


@dataclasses.dataclass(frozen=True)
class ApproxDPEvent:
    """A release calibrated directly to (ε, δ)-DP (e.g. the classic ``√(2 ln(1.25/δ))`` Gaussian).

    Offline algorithms whose papers state their guarantee this way record it as is; such events
    compose by basic composition (ε and δ add).
    """

    step: int
    sensitivity: float
    scale: float
    epsilon: float
    delta: float
    mechanism: str = "gaussian-approx"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


Event = GaussianEvent | LaplaceEvent | ApproxDPEvent


def event_from_dict(d: dict) -> Event:
    """Inverse of ``to_dict`` (used by checkpoints)."""
    d = dict(d)
    mech = d.get("mechanism")
    d.pop("rho", None)
    if mech == "gaussian":
        return GaussianEvent(**d)
    if mech == "laplace":
        d.pop("epsilon", None)
        return LaplaceEvent(**d)
    if mech == "gaussian-approx":
        return ApproxDPEvent(**d)
    raise ValueError(f"unknown mechanism in ledger entry: {mech!r}")


__all__ += ["event_from_dict"]
