"""PairwiseGIGA: the non-private baseline."""

from __future__ import annotations

import numpy as np

from stream_dp._kernels import LEARN, WRITE
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
        reproducible: bool = False,
        features: tuple | int | None = None,
        model_id: str = "stream-dp-giga",
        track_regret: bool = True,
        keep_history: bool = False,
        max_buffer_warning: int = 100_000,
    ) -> None:
        _check_variant(self, task)
        self._init_common(
            task, alpha, data_radius, model_radius, buffer, seed, reproducible, features,
            model_id,
            track_regret, keep_history, max_buffer_warning,
        )  # fmt: skip
        self._loss = self._make_loss()

    def learn_one(self, x, y, **kwargs) -> None:
        """Learn one record (raises ``InvalidRecord``, state untouched, for bad input)."""
        xv, yv = self._validate(x, y)
        self._learn_validated(xv[None, :], np.array([yv]), (y,))

    def _learn_validated(self, X: np.ndarray, Y: np.ndarray, labels) -> None:
        self._ensure_bound()
        m = len(Y)
        step = 1 if self.track_regret and self.keep_history else m
        for i in range(0, m, step):
            j = min(m, i + step)
            t0, k = self._t, j - i
            mode = np.full(k, LEARN | WRITE, dtype=np.int64)
            eta = np.array([self._eta(t) for t in range(t0 + 1, t0 + k + 1)])
            off, slots, nb = self._buffer.plan_writes(t0, k, self._noise)
            ids_before = self._buffer.member_ids().copy() if step == 1 else None
            penok = self._run_data(
                X[i:j], Y[i:j], mode, eta, self._no_rows, self._no_rows, off, slots, nb, t0
            )
            if ids_before is not None:
                self._remember(X[i], Y[i], ids_before, t0 + 1, penok[0])
            self._buffer.advance(k)
            self._t = t0 + k
            self._commit_labels(labels[i:j])

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
