"""OnPairC: online private pairwise learning for general convex losses."""

from __future__ import annotations

import numpy as np

from stream_dp.buffers import Buffer
from stream_dp.losses import PairwiseLoss, Regularized
from stream_dp.online._dispatch import task_variants
from stream_dp.online._params import river_check_params
from stream_dp.online.base import PrivateOnlineBase
from stream_dp.online.onpairstrc import _check_variant

__all__ = ["OnPairC"]


class OnPairC(PrivateOnlineBase):
    """Online Pairwise Private GIGA, general convex (Huai et al., AAAI 2020, Algorithm 2).

    Draws ``w₀`` uniformly in C (keyed, data-independent) and runs OnPairStrC (Algorithm 1) on
    ``ℓ(w) + (α/2)‖w − w₀‖²``, whose constants are ``G̃ = G + α·diam(C)`` and ``L̃ = L + α``
    with strong convexity α. The theorem's order ``α = n^{−1/4}`` is the default when the
    horizon n is known; with the anytime schedule (``horizon=None``) choose α yourself.

    Parameters are those of :class:`stream_dp.online.OnPairStrC`; ``alpha=None`` means
    ``horizon^{−1/4}``.

    Examples
    --------
    >>> from stream_dp.online import OnPairC
    >>> model = OnPairC(task="auc", epsilon=2.0, horizon=10_000, features=["a", "b"])
    >>> model.alpha_
    0.1
    >>> model.T1
    6560

    """

    def __init__(
        self,
        task: str = "auc",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        horizon: int | None = None,
        alpha: float | None = None,
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        buffer: str | int | Buffer = "all",
        conversion: str = "tight",
        seed: int | None = None,
        reproducible: bool = False,
        release_every: int = 1,
        smoothing_window: int = 1,
        predict_with: str = "release",
        warmup: int | None = None,
        sensitivity: str = "certified",
        anytime_p: float = 1.1,
        features: tuple | int | None = None,
        model_id: str = "stream-dp",
        track_regret: bool = True,
        keep_history: bool = False,
        max_buffer_warning: int = 100_000,
    ) -> None:
        _check_variant(self, task)
        if alpha is None:
            if horizon is None:
                raise ValueError(
                    "OnPairC needs alpha when horizon is None (the default α = n^(-1/4) needs n)"
                )
            alpha_ = float(horizon) ** -0.25
        else:
            alpha_ = alpha
        self._init_common(
            task, alpha_, data_radius, model_radius, buffer, seed, reproducible, features,
            model_id,
            track_regret, keep_history, max_buffer_warning,
        )  # fmt: skip
        self.alpha = alpha  # keep the parameter as given (river's clone relies on it)
        self.alpha_ = round(alpha_, 15)
        self._loss = self._make_loss()
        self._init_private(
            epsilon, delta, horizon, conversion, release_every, smoothing_window,
            predict_with, warmup, sensitivity, anytime_p,
        )  # fmt: skip

    def _make_loss(self) -> PairwiseLoss:
        # The centre w0 is drawn once the dimension is known (_ensure_bound); the constants only
        # need the bound ‖w − w0‖ ≤ diam(C).
        return Regularized(
            self._base_loss(), self.alpha_, center=None, center_radius=self._constraint.diameter
        )

    def _eta_alpha(self) -> float:
        return float(self.alpha_)

    def _ensure_bound(self) -> None:
        fresh = self._w is None
        super()._ensure_bound()
        if fresh:
            w0 = self._constraint.sample(self._noise.generator(0, "center"), self._w.shape)
            self._loss.center = np.asarray(w0, dtype=float)

    def _on_restore(self) -> None:
        if self._w is not None:
            w0 = self._constraint.sample(self._noise.generator(0, "center"), self._w.shape)
            self._loss.center = np.asarray(w0, dtype=float)

    @property
    def w0(self) -> np.ndarray | None:
        """The random centre of the regulariser (data-independent)."""
        return self._loss.center

    @classmethod
    def _unit_test_params(cls):
        yield river_check_params(getattr(cls, "_task", "auc"))


task_variants(OnPairC, globals())
