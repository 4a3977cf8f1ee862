"""OnPairStrC: online private pairwise learning for strongly convex losses."""

from __future__ import annotations

from stream_dp.buffers import Buffer
from stream_dp.online._dispatch import task_variants
from stream_dp.online._params import river_check_params
from stream_dp.online.base import PrivateOnlineBase

__all__ = ["OnPairStrC"]


class OnPairStrC(PrivateOnlineBase):
    """Online Pairwise Private GIGA, strongly convex (Huai et al., AAAI 2020, Algorithm 1).

    Each record ``z_t`` is paired with the buffer ``B_t``; one projected gradient step is taken
    on ``L̂_t(w) = (1/|B_t|) Σ_{z∈B_t} ℓ(w; z_t, z) + (α/2)‖w‖²`` with
    ``η_t = 2(t−1)/(αt(t−2))``; on a release step the model ``Π_C(w_t + N(0, σ_t² I))`` is
    published and charged to the zCDP ledger. Steps ``1..T1`` (``T1 = max(⌈16L/α²⌉, 7)``)
    release data-independent random models at no cost.

    σ_t is ``Δ_t/√(2ρ_k)``: ``ρ_k`` comes from the schedule (``horizon=n`` splits ρ evenly over
    the ``⌈(n − T1)/release_every⌉`` releases, the paper's ``σ_t² = 32G²(n−T1)/(α²t²ρ)`` when
    ``sensitivity="paper"``; ``horizon=None`` uses the anytime schedule
    ``ρ_k = ρ k^{−p}/ζ(p)``); ``Δ_t`` is the certified bound of ``docs/privacy.md`` (default)
    or Lemma 4's ``8G/(αt)`` (``sensitivity="paper"``, full buffer only). Predictions use only
    the latest release (or the smoothed release), never the internal iterate.

    Parameters
    ----------
    task
        ``"auc"`` (logistic pairwise ranking loss, L2 ball; a river ``Classifier``) or
        ``"metric"`` (logistic metric loss, PSD ∩ Frobenius ball; a ``SupervisedTransformer``).
    epsilon, delta
        The (ε, δ) budget for everything this learner will ever release.
    horizon
        Stream length n for the paper's schedule; ``None`` for the anytime schedule.
    alpha
        Strength α of the ``(α/2)‖w‖²`` regulariser, which is the strong convexity. Small α
        means a long warm-up (T1 ∝ 1/α²) and large noise (σ ∝ 1/α): see ``describe()``.
    data_radius
        R: every x is clipped to ``‖x‖ ≤ R`` (part of the privacy proof).
    model_radius
        D: radius of the constraint set C.
    buffer
        ``"all"`` (the paper; O(t·d) memory), an int (FIFO of that size), ``"fifo:N"``,
        ``"reservoir:N"`` (Kar et al. RS-x) or a :class:`stream_dp.buffers.Buffer`.
    conversion
        zCDP → (ε, δ): ``"tight"`` (CKS 2020, default) or ``"paper"``.
    seed
        Secret of the keyed noise. ``None`` (the default) draws 128 bits from the OS. An int is
        guessable, so it is refused unless ``reproducible=True``. Stored in checkpoints — keep
        those secret.
    reproducible
        Declare the run non-private so that an int ``seed`` is accepted (tests, debugging):
        every release message, ``describe()`` and the ledger then say it is not private.
    release_every
        Release every k-th step; the budget is split over fewer releases, so each is less noisy.
    smoothing_window
        Number of releases averaged by ``smoothed_weights`` (post-processing: free).
    predict_with
        ``"release"`` or ``"smoothed"``: which private model predictions use.
    warmup
        Override T1 (then ``sensitivity`` must be ``"certified"``).
    sensitivity
        ``"certified"`` (the recurrence of ``docs/privacy.md``, any buffer) or ``"paper"``
        (Lemma 4).
    anytime_p
        Exponent p > 1 of the anytime schedule.
    features
        The declared schema (required): feature names, or their number d for array input
        (names ``x0 … x{d−1}``). Features outside it are ignored and counted
        (``unknown_features``); missing ones are 0.
    model_id
        Identifies the model in releases; also keys the noise.
    track_regret
        Track the penalty of each served model on the next record (operator-only numbers).
    keep_history
        Keep records so :meth:`best_fixed_comparator` can be solved (finite runs only).
    max_buffer_warning
        The ``"all"`` buffer warns above this many records.

    Examples
    --------
    >>> from stream_dp.online import OnPairStrC
    >>> model = OnPairStrC(task="auc", epsilon=1.0, delta=1e-5, horizon=1000, alpha=1.0,
    ...                    features=["a", "b"])
    >>> model.T1
    80
    >>> for i in range(100):
    ...     model.learn_one({"a": (i % 7) / 7, "b": (i % 3) / 3}, i % 2 == 0)
    >>> model.private_weights.shape
    (2,)
    >>> eps, delta = model.accountant.spent()
    >>> 0 < eps < 1.0
    True

    """

    def __init__(
        self,
        task: str = "auc",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        horizon: int | None = None,
        alpha: float = 0.1,
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
        self._init_common(
            task, alpha, data_radius, model_radius, buffer, seed, reproducible, features,
            model_id,
            track_regret, keep_history, max_buffer_warning,
        )  # fmt: skip
        self._loss = self._make_loss()
        self._init_private(
            epsilon, delta, horizon, conversion, release_every, smoothing_window,
            predict_with, warmup, sensitivity, anytime_p,
        )  # fmt: skip

    @classmethod
    def _unit_test_params(cls):
        yield river_check_params(getattr(cls, "_task", "auc"))


def _check_variant(model, task: str) -> None:
    expected = getattr(type(model), "_task", None)
    if expected is not None and task != expected:
        raise ValueError(f"{type(model).__name__} is the {expected!r} variant, got task={task!r}")


task_variants(OnPairStrC, globals())
