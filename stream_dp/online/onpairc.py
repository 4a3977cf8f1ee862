"""OnPairC: online private pairwise learning for general convex losses (Huai et al. 2020)."""

from __future__ import annotations

import numpy as np

from stream_dp.losses import PairwiseLoss, Regularized
from stream_dp.online.interfaces import AUCInterface, MetricInterface
from stream_dp.online.onpairstrc import OnPairStrC

__all__ = ["OnPairC", "OnPairCAUC", "OnPairCMetric"]


class OnPairC(OnPairStrC):
    """Online Pairwise Private GIGA, general convex (Huai et al., AAAI 2020, Algorithm 2).

    Draws ``w₀`` uniformly in C (keyed, data-independent) and runs OnPairStrC (Algorithm 1) on
    ``ℓ(w) + (α/2)‖w − w₀‖²``, whose constants are ``G̃ = G + α·diam(C)`` and ``L̃ = L + α``
    with strong convexity α. The parameters are :class:`OnPairStrC`'s; ``alpha=None`` means the
    theorem's order ``α = n^{−1/4}`` for the horizon n (raised, if needed, so that the warm-up
    takes at most a tenth of the stream); with the anytime schedule (``horizon=None``) choose α
    yourself. ``OnPairC(task=...)`` returns :class:`OnPairCAUC` or :class:`OnPairCMetric`.

    Examples
    --------
    >>> from stream_dp.online import OnPairC
    >>> model = OnPairC(task="auc", epsilon=2.0, horizon=10_000, features=["a", "b"])
    >>> round(model.alpha_, 4), model.T1
    (0.2611, 1000)

    """

    _variants: dict[str, type] = {}

    def _preferred_alpha(self) -> float:
        if self.horizon is None:
            raise ValueError(
                "OnPairC needs alpha when horizon is None (the default α = n^(-1/4) needs n)"
            )
        return float(self.horizon) ** -0.25

    def _loss_for(self, regularized: type[Regularized], base_loss: PairwiseLoss) -> PairwiseLoss:
        # The centre w0 is drawn once d is known (_on_bind); the constants only need the bound
        # ‖w − w0‖ ≤ diam(C).
        return regularized(base_loss, self._alpha, center=None,
                           center_radius=self._constraint.diameter)  # fmt: skip

    def _center_radius(self) -> float:
        return float(self._constraint.diameter)

    def _on_bind(self) -> None:
        # Step 0 of the "center" purpose: a pure function of the secret, drawn again on restore.
        w0 = self._constraint.sample(self._noise.generator(0, "center"), self._shape())
        self._loss.center = np.asarray(w0, dtype=float)

    @property
    def w0(self) -> np.ndarray | None:
        """The random centre of the regulariser (data-independent)."""
        return self._loss.center


class OnPairCAUC(OnPairC, AUCInterface):
    """OnPairC for bipartite ranking (``task="auc"``): a river binary classifier."""

    _task = "auc"


class OnPairCMetric(OnPairC, MetricInterface):
    """OnPairC for Mahalanobis metric learning (``task="metric"``): a river transformer."""

    _task = "metric"


OnPairC._variants = {"auc": OnPairCAUC, "metric": OnPairCMetric}
