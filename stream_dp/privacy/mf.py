"""The matrix-factorization Gaussian mechanism on a pairwise gradient stream: Δ, σ and its charge.

One mechanism covers a whole stream of ``horizon`` steps: the learner adds ``σ·(M·Z)_t`` to the
gradient of every step t (:mod:`stream_dp.privacy.correlated_noise`), which publishes, up to
post-processing, ``C·G + σZ`` — a single Gaussian mechanism with sensitivity
``Δ = sup ‖C(G − G′)‖_F`` over neighbouring streams, adaptively chosen gradients included
(Denisov et al., NeurIPS 2022, Thm. 2.1: lower-triangular, invertible C). Its zCDP cost
``ρ = Δ²/(2σ²)`` is charged once, before the first noisy gradient exists; every model derived
from the noisy gradients — each iterate, each release, their averages — is then
post-processing and free. ``Δ`` is computed from the factorization, the pairwise influence
pattern of the buffer (:mod:`stream_dp.privacy.influence`) and the horizon, never from data
(``docs/privacy.md``, *Correlated noise*).

Horizons: a known horizon n is the default (Δ uses ``C`` restricted to n steps; after step n
the learner stops). ``horizon=None`` is offered for BLT only: its column norms converge (every
decay θ < 1), so ``Δ_∞ = lim_n Δ_n`` is finite and charging it up front covers an unbounded
stream for the same single cost; the BLT is then
:func:`~stream_dp.privacy.unbounded_blt.unbounded_blt`, held near the known-horizon optimum at
every step count from 10³ to 10¹⁰.

"""

from __future__ import annotations

import math

import numpy as np

from stream_dp.privacy.blt import BLT
from stream_dp.privacy.correlated_noise import CorrelatedNoise
from stream_dp.privacy.events import GaussianEvent, gaussian_rho
from stream_dp.privacy.factorizations import BinaryTree, Factorization, Independent, SqrtToeplitz
from stream_dp.privacy.mechanisms import gaussian_sigma_zcdp
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.privacy.unbounded_blt import UNBOUNDED_HORIZONS, unbounded_blt
from stream_dp.privacy.unit_sensitivity import UnitSensitivity, unit_sensitivity

__all__ = [
    "MECHANISM_NAME",
    "MFMechanism",
    "NOISES",
    "factorization_from_state",
    "make_factorization",
]

#: The ledger's name for the one charge of a stream's correlated gradient noise.
MECHANISM_NAME = "gaussian-correlated"

#: The factorizations a learner can stream with (``noise=``); the first is the default.
NOISES = ("blt", "tree", "independent", "sqrt-toeplitz")
# Schedules' convention: a share is multiplied by 1 − 1e-9 so that its cost, computed back from
# Δ and σ in floating point, can never exceed the budget it was derived from.
_SHARE = 1.0 - 1e-9


def make_factorization(
    noise: str, horizon: int | None, unbounded: tuple[int, int] = UNBOUNDED_HORIZONS
) -> Factorization:
    """The factorization named ``noise`` for ``horizon`` steps (BLT: fitted, < 1 s).

    ``horizon=None`` (BLT only): :func:`~stream_dp.privacy.unbounded_blt.unbounded_blt` for the
    step counts ``unbounded`` (stored for the default, fitted in seconds otherwise).

    Examples
    --------
    >>> make_factorization("tree", 100)
    BinaryTree()

    """
    if noise == "blt":
        return unbounded_blt(*unbounded) if horizon is None else BLT.fit(horizon)
    if noise == "tree":
        return BinaryTree()
    if noise == "independent":
        return Independent()
    if noise == "sqrt-toeplitz":
        return SqrtToeplitz()
    raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")


def factorization_from_state(state: dict) -> Factorization:
    """Rebuild a factorization from its ``state_dict()``.

    Examples
    --------
    >>> factorization_from_state(SqrtToeplitz().state_dict())
    SqrtToeplitz()

    """
    kind = state.get("kind")
    if kind == SqrtToeplitz.name:
        return SqrtToeplitz()
    if kind == Independent.name:
        return Independent()
    if kind == BinaryTree.name:
        return BinaryTree()
    if kind == BLT.name:
        return BLT.from_state_dict(state)
    raise ValueError(f"unknown factorization {kind!r}")


class MFMechanism:
    """σ, Δ and the ledger event of correlated noise for one stream.

    Parameters
    ----------
    factorization
        The strategy ``C`` (:func:`make_factorization`).
    pattern
        The influence pattern ``u`` of the buffer policy (:mod:`stream_dp.privacy.influence`).
    horizon
        Steps covered; ``None`` for an unbounded stream (BLT only).
    rho
        The zCDP budget of the whole stream (``ZCDPAccountant.rho_budget``); ``0`` or ``None``
        for a noise-free (non-private) run.
    size
        Values per gradient row.
    max_events, min_separation
        The contribution bound of a unit-level learner (k events of a unit, ≥ b steps apart):
        Δ is then the certified unit-level sensitivity
        (:func:`~stream_dp.privacy.unit_sensitivity.unit_sensitivity`), and
        :attr:`event_sensitivity` the event-level one it is compared with. ``k = 1`` (default)
        is the event-level mechanism.

    Examples
    --------
    >>> from stream_dp.privacy.influence import PairTermBounds, window_pattern
    >>> u = window_pattern(4, 4, PairTermBounds(1.0, 1.0))
    >>> m = MFMechanism(Independent(), u, horizon=10, rho=0.5, size=3)
    >>> round(m.sensitivity, 6), round(m.sigma, 6), m.charged_rho <= 0.5
    (1.118034, 1.118034, True)

    """

    def __init__(
        self,
        factorization: Factorization,
        pattern,
        horizon: int | None,
        rho: float | None,
        size: int,
        max_events: int = 1,
        min_separation: int = 1,
    ) -> None:
        if horizon is None and not isinstance(factorization, BLT):
            raise ValueError("an unknown horizon needs BLT noise (its column norms converge)")
        self.factorization = factorization
        self.pattern = np.asarray(pattern, dtype=float)
        self.horizon = None if horizon is None else int(horizon)
        self.size = int(size)
        self.event_sensitivity = float(factorization.sensitivity(self.pattern, self.horizon))
        self.sensitivity = self.event_sensitivity
        self.unit: UnitSensitivity | None = None
        if max_events != 1 or min_separation != 1:
            self.unit = unit_sensitivity(
                factorization, self.pattern, self.horizon, max_events, min_separation
            )
            self.sensitivity = float(self.unit.sensitivity)
        self.rho = None if not rho else float(rho)
        self.sigma = (
            0.0 if self.rho is None else gaussian_sigma_zcdp(self.sensitivity, self.rho * _SHARE)
        )

    @property
    def private(self) -> bool:
        return self.sigma > 0

    @property
    def charged_rho(self) -> float:
        """The zCDP cost ``Δ²/(2σ²)`` of the stream's one charge (just under ``rho``)."""
        return gaussian_rho(self.sensitivity, self.sigma)

    @property
    def event_rho(self) -> float:
        """The zCDP cost of one *event* at this σ, ``Δ_event²/(2σ²)`` (the event-level
        guarantee a unit-level mechanism also gives; 0 without noise)."""
        return gaussian_rho(self.event_sensitivity, self.sigma) if self.private else 0.0

    def event(self, step: int) -> GaussianEvent:
        """The ledger event: one Gaussian mechanism with (Δ, σ), charged at ``step`` under the
        ledger's name for correlated noise (:data:`MECHANISM_NAME`)."""
        if not self.private:
            raise ValueError("a noise-free run has nothing to charge")
        return GaussianEvent(
            step=int(step), sensitivity=self.sensitivity, sigma=self.sigma, mechanism=MECHANISM_NAME
        )

    def noise(self, keyed: KeyedNoise) -> CorrelatedNoise:
        """The streaming standard rows ``(M·Z)_t`` (scale them by :attr:`sigma`)."""
        return CorrelatedNoise(self.factorization, keyed, self.size)

    def prefix_noise_std(self, t: int | None = None) -> float:
        """Per-coordinate std of the noise in the sum of the first t noisy gradients.

        ``σ·√(prefix variance)``; t defaults to the horizon. This is the noise an unprojected
        SGD iterate carries (times the step size).
        """
        t = self.horizon if t is None else int(t)
        if t is None:
            raise ValueError("give t for an unbounded stream")
        return self.sigma * math.sqrt(self.factorization.max_error(t))

    def describe(self) -> dict:
        """Everything about the mechanism that is public (data-independent)."""
        f = self.factorization
        out = {
            "mechanism": f"matrix-factorization Gaussian ({f.name})",
            "factorization": f.state_dict(),
            "horizon": self.horizon,
            "sensitivity": self.sensitivity,
            "sigma": self.sigma,
            "rho": self.charged_rho if self.private else 0.0,
            "influence_l1": float(self.pattern.sum()),
            "influence_steps": int(len(self.pattern)),
        }
        if self.unit is not None:
            out["unit"] = {
                "max_events": self.unit.max_events,
                "min_separation": self.unit.min_separation,
                "event_sensitivity": self.event_sensitivity,
                "exact": self.unit.exact,
                "method": self.unit.method,
            }
        if self.horizon is not None:
            out["max_column_norm"] = f.max_column_norm(self.horizon)
        return out

    def state_dict(self) -> dict:
        return {
            "factorization": self.factorization.state_dict(),
            "pattern": self.pattern.tolist(),
            "horizon": self.horizon,
            "rho": self.rho,
            "size": self.size,
        } | (
            {}
            if self.unit is None
            else {"max_events": self.unit.max_events, "min_separation": self.unit.min_separation}
        )

    @classmethod
    def from_state_dict(cls, state: dict) -> MFMechanism:
        return cls(
            factorization_from_state(state["factorization"]),
            state["pattern"],
            state["horizon"],
            state["rho"],
            state["size"],
            state.get("max_events", 1),
            state.get("min_separation", 1),
        )
