"""PairwiseGIGA: the non-private baseline."""

from __future__ import annotations

import numpy as np

from stream_dp.buffers import Buffer
from stream_dp.online._dispatch import task_variants
from stream_dp.online._params import river_check_params
from stream_dp.online.base import PairwiseOnlineBase
from stream_dp.online.onpairstrc import _check_variant

__all__ = ["PairwiseGIGA"]


class PairwiseGIGA(PairwiseOnlineBase):
    """Pairwise GIGA — OnPairStrC without noise or warm-up (Kar et al. 2013 OLP; Huai et al.
    2020, Alg. 1 without steps 12–13). **Not private**: the baseline every figure compares to.

    ``w_t = Π_C(w_{t−1} − η_t ∇L̂_t(w_{t−1}))`` with ``L̂_t`` the buffer-averaged loss plus
    ``(α/2)‖w‖²`` and ``η_t = 2(t−1)/(αt(t−2))`` (``1/α`` at t = 2, where the formula is
    infinite). Predictions use the iterate itself. ``private_weights`` is None and
    ``accountant`` is None: nothing this model outputs is private.

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

    def __init__(
        self,
        task: str = "auc",
        alpha: float = 0.1,
        data_radius: float = 1.0,
        model_radius: float = 1.0,
        buffer: str | int | Buffer = "all",
        seed: int | None = None,
        features: tuple | None = None,
        model_id: str = "stream-dp-giga",
        track_regret: bool = True,
        keep_history: bool = False,
        max_buffer_warning: int = 100_000,
    ) -> None:
        _check_variant(self, task)
        self._init_common(
            task, alpha, data_radius, model_radius, buffer, seed, features, model_id,
            track_regret, keep_history, max_buffer_warning,
        )  # fmt: skip
        self._loss = self._make_loss()

    def learn_one(self, x, y, **kwargs) -> None:
        """Learn one record (raises ``InvalidRecord``, state untouched, for bad input)."""
        xv, yv = self._validate(x, y)
        self._commit_label(y)
        self._ensure_bound()
        t = self._t + 1
        self._track_penalty(t, xv, yv)
        self._w = self._gradient_step(t, self._w, xv, yv)
        self._buffer.add(xv, yv, t, self._noise)
        self._t = t

    @property
    def weights(self) -> np.ndarray | None:
        """The (non-private) iterate."""
        return None if self._w is None else self._w.copy()

    @property
    def private_weights(self) -> None:
        return None

    @property
    def exhausted(self) -> bool:
        return False

    def _served_weights(self) -> np.ndarray | None:
        return self._w

    def _served_version(self) -> tuple:
        return (self._t,)

    @classmethod
    def _unit_test_params(cls):
        yield river_check_params(getattr(cls, "_task", "auc"), private=False)


task_variants(PairwiseGIGA, globals())
