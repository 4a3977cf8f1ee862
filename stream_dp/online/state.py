"""What one step of an online pairwise learner reads and writes, in one place.

The reference step (:mod:`stream_dp.online.reference`) and the compiled fast path
(:mod:`stream_dp.online.fast`) both work on a :class:`LearnerState`: the iterate and step
counter, the loss and constraint set, the buffer of partners, the privacy mechanism, the keyed
noise, the release ring, and the operator-only regret. The river-facing learner
(:mod:`stream_dp.online.base`) owns one and never lets anything but released models out.
"""

from __future__ import annotations

import numpy as np

from stream_dp.buffers import Buffer
from stream_dp.constraints import ConstraintSet
from stream_dp.huai import huai_step_size
from stream_dp.losses import PairwiseLoss
from stream_dp.online.mechanism import Mechanism
from stream_dp.online.release import ReleaseRing
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.regret import RegretTracker

__all__ = ["LearnerState"]


class LearnerState:
    """The state of one online pairwise learner.

    Parameters
    ----------
    loss
        The (regularised) pairwise loss, with its strong convexity α.
    constraint
        C: every iterate and every release is projected onto it.
    buffer
        The partners ``B_t`` of each new record.
    mechanism
        The privacy side (:mod:`stream_dp.online.mechanism`).
    noise
        The keyed noise all randomness is drawn from.
    window
        Releases kept for the smoothed release.
    eta_alpha
        The α of Huai et al.'s step size ``η_t = 2(t−1)/(αt(t−2))``.
    eta
        A constant step size instead (OnPairMF); None for Huai et al.'s.
    divisor
        A fixed divisor B of the gradient's sum over the partners, ``(1/B) Σ_{z∈B_t} ∇ℓ``, so
        that one record's influence is data-independent (OnPairMF); None divides by ``|B_t|``.
    smoothed
        Serve the mean of the release window instead of the latest release.
    track_regret, keep_history
        Track the operator-only penalty of each served model on the next record, and keep the
        records so the best fixed comparator can be solved (:class:`RegretTracker`).

    """

    def __init__(
        self,
        loss: PairwiseLoss,
        constraint: ConstraintSet,
        buffer: Buffer,
        mechanism: Mechanism,
        noise: KeyedNoise,
        window: int,
        eta_alpha: float,
        smoothed: bool,
        track_regret: bool,
        keep_history: bool,
        eta: float | None = None,
        divisor: int | None = None,
    ) -> None:
        self.loss = loss
        self.constraint = constraint
        self.buffer = buffer
        self.mechanism = mechanism
        self.noise = noise
        self.window = int(window)
        self.eta_alpha = float(eta_alpha)
        self.eta = None if eta is None else float(eta)
        self.divisor = None if divisor is None else int(divisor)
        self.smoothed = bool(smoothed)
        self.track_regret = bool(track_regret)
        self.regret = RegretTracker(keep_history=keep_history)
        self.t = 0
        self.shape: tuple[int, ...] | None = None
        self.w: np.ndarray | None = None  # the flat iterate: never released, never served
        self.center: np.ndarray | None = None  # the regulariser's centre (OnPairC), flat
        self.ring: ReleaseRing | None = None
        self.exhausted = False

    @property
    def bound(self) -> bool:
        """True once the dimension is known and the arrays exist."""
        return self.w is not None

    def bind(self, dim: int, start: np.ndarray | None = None) -> None:
        """Allocate the arrays once the dimension d is known; the iterate starts at ``start``
        (data-independent, in C; default 0)."""
        self.shape = self.loss.param_shape(dim)
        size = int(np.prod(self.shape))
        self.buffer.bind(dim)
        self.w = np.zeros(size) if start is None else np.array(start, dtype=float).reshape(-1)
        self.ring = ReleaseRing(self.window, self.shape)
        self.mechanism.bind(self.noise, self.shape)
        center = self.loss.center
        self.center = np.zeros(size) if center is None else np.asarray(center).reshape(-1)

    def step_size(self, t: int) -> float:
        """η_t: Huai et al. (2020, Alg. 1), or the constant step size."""
        return huai_step_size(t, self.eta_alpha) if self.eta is None else self.eta

    def gradient(self, w: np.ndarray, x: np.ndarray, y: float, X: np.ndarray, Y: np.ndarray):
        """The step's gradient against the partners ``(X, Y)``: their mean, or their sum over
        the fixed divisor (zeros without partners)."""
        if self.divisor is None:
            return self.loss.gradient(w, x, y, X, Y)
        if len(Y) == 0:
            return np.zeros_like(w)
        c = self.loss.pair_coefficients(y, Y)
        return self.loss.pair_gradient_sum(w, x - X, c) / self.divisor

    def served(self) -> np.ndarray | None:
        """The model predictions use, flat: a release (or the mean of the window); the iterate
        only for a mechanism that publishes nothing (the non-private baseline)."""
        if not self.mechanism.publishes:
            return self.w
        if self.ring is None:
            return None
        model = self.ring.served(self.smoothed)
        return None if model is None else model.reshape(-1)
