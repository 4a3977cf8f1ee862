"""PairwiseGIGA: the non-private baseline."""

from __future__ import annotations

import numpy as np

from stream_dp.buffers import Buffer
from stream_dp.online.base import PairwiseLearner
from stream_dp.online.interfaces import AUCInterface, MetricInterface
from stream_dp.online.mechanism import Unperturbed
from stream_dp.online.params import river_check_params

__all__ = ["PairwiseGIGA", "PairwiseGIGAAUC", "PairwiseGIGAMetric"]


class PairwiseGIGA(PairwiseLearner):
    """Pairwise GIGA — OnPairStrC without noise or warm-up (Kar et al. 2013 OLP; Huai et al.
    2020, Alg. 1 without steps 12–13). **Not private**: the baseline every figure compares to.

    ``w_t = Π_C(w_{t−1} − η_t ∇L̂_t(w_{t−1}))`` with ``L̂_t`` the buffer-averaged loss plus
    ``(α/2)‖w‖²`` and ``η_t = 2(t−1)/(αt(t−2))`` (``1/α`` at t ≤ 2, where the formula is
    infinite or negative). Predictions use the iterate itself; ``private_weights`` is None and so
    is ``accountant``: nothing this model outputs is private. Without ``features`` the first
    learned record's keys become the schema. The parameters are :class:`OnPairStrC`'s that apply.

    Examples
    --------
    >>> from stream_dp.online import PairwiseGIGA
    >>> model = PairwiseGIGA(task="auc", alpha=0.5)
    >>> for i in range(50):
    ...     model.learn_one({"a": i % 5 / 5, "b": (i % 2) / 2}, i % 2 == 0)
    >>> model.predict_one({"a": 0.0, "b": 0.0}), model.private_weights
    (False, None)

    """

    accountant = None
    budget = None
    _requires_schema = False
    _variants: dict[str, type] = {}

    def __init__(
        self,
        task: str = "auc",
        alpha: float = 1.0,
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        buffer: str | int | Buffer = "all",
        seed: int | None = None,
        reproducible: bool = False,
        features: tuple | int | None = None,
        model_id: str = "stream-dp-giga",
        track_regret: bool = True,
        keep_history: bool = False,
        max_buffer_warning: int = 100_000,
        noise_source: type | None = None,
    ) -> None:
        self.task = task
        self.alpha = alpha
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.buffer = buffer
        self.seed = seed
        self.reproducible = reproducible
        self.features = features
        self.model_id = model_id
        self.track_regret = track_regret
        self.keep_history = keep_history
        self.max_buffer_warning = max_buffer_warning
        self.noise_source = noise_source
        self._setup(alpha)

    def _mechanism(self, buffer: Buffer) -> Unperturbed:
        return Unperturbed()

    @property
    def weights(self) -> np.ndarray | None:
        """The (non-private) iterate."""
        s = self._state
        return None if s.w is None else s.w.reshape(s.shape).copy()

    @classmethod
    def _unit_test_params(cls):
        yield river_check_params(cls._task or "auc", private=False)


class PairwiseGIGAAUC(PairwiseGIGA, AUCInterface):
    """PairwiseGIGA for bipartite ranking (``task="auc"``)."""

    _task = "auc"


class PairwiseGIGAMetric(PairwiseGIGA, MetricInterface):
    """PairwiseGIGA for metric learning (``task="metric"``)."""

    _task = "metric"


PairwiseGIGA._variants = {"auc": PairwiseGIGAAUC, "metric": PairwiseGIGAMetric}
