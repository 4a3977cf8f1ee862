"""A running scaler whose statistics are released under zero-concentrated DP.

Each declared feature ``j`` has public bounds ``[a_j, b_j]`` (schema, like the feature names).
A record contributes ``u_j = (clip(x_j, a_j, b_j) − c_j)/h_j ∈ [−1, 1]`` (``c_j``, ``h_j``: the
bounds' midpoint and half-width) and, for the norm, ``q = Σ_{i pass} min(x_i², B²)/(p·B²) ∈ [0,
1]`` over the ``p`` features it does not scale. At a few steps ``n_1 < n_2 < …`` (doubling
epochs, chosen before any data) it releases the prefix sums with Gaussian noise,

    Y = (Σ_t u_t, √2·Σ_t u_t², Σ_t q_t) + N(0, σ² I),

whose replace-one ℓ2 sensitivity is ``Δ = √(4k + 1)`` (``√(4k)`` without the norm term), and
charges ``ρ_i = Δ²/(2σ²)`` under ``"gaussian-scaler"`` before anyone sees it. Everything the
scaler outputs — centres, spreads, the norm factor, every scaled record — is computed from the
latest release only (post-processing); records are scaled with statistics released *before*
them. The derivation, the schedule and why the composition with the learner holds are in
``docs/privacy.md``, *Private preprocessing*.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
from river import compose

from stream_dp.online.composition import OWN_LEDGER, check_unit_level
from stream_dp.preprocessing.affine import AffineScaler, check_bounds, schema_names
from stream_dp.privacy.budget import (
    BudgetExhausted,
    BudgetSlice,
    PrivacyBudget,
    budget_from_dict,
    zcdp_budget,
)
from stream_dp.privacy.events import GaussianEvent, gaussian_rho
from stream_dp.privacy.mechanisms import gaussian_sigma_zcdp
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.privacy.schedules import HorizonSchedule
from stream_dp.privacy.secrets import check_seed

__all__ = ["MECHANISM", "PrivateScaler", "scaler_sensitivity"]

#: The ledger name of the scaler's charges.
MECHANISM = "gaussian-scaler"
#: The keyed-noise purpose of its release noise.
PURPOSE = "scaler"
#: Default number of releases (doubling epochs).
DEFAULT_RELEASES = 4
#: The default first release comes once the noise of the mean is at most this in u units (a
#: twentieth of the bounds' width) ...
FIRST_RELEASE_NOISE = 0.1
#: ... and never before this many records.
MIN_FIRST_RELEASE = 100
#: The layout of :meth:`PrivateScaler.state_dict`.
STATE_FORMAT = 1
_SQRT2 = math.sqrt(2.0)


def scaler_sensitivity(n_scaled: int, with_norm: bool) -> float:
    """The replace-one ℓ2 sensitivity of one release: ``√(4k + 1)``, or ``√(4k)`` without
    the norm term (``docs/privacy.md``, *Private preprocessing*).

    Per feature, ``(u − u')² + 2(u² − u'²)² = d²(1 + 2s²)`` with ``d = u − u'``, ``s = u + u'``
    and ``|d| + |s| ≤ 2``; ``(2 − s)²(1 + 2s²)`` falls on ``[0, 2]`` (its derivative is
    ``−2(2 − s)(2s − 1)²``), so the maximum is 4, at ``u = −u' = ±1``. The norm term adds at
    most 1. Both maxima are reached by one pair of records.

    Examples
    --------
    >>> scaler_sensitivity(6, with_norm=True)
    5.0

    """
    return math.sqrt(4.0 * n_scaled + (1.0 if with_norm else 0.0))


class PrivateScaler(AffineScaler):
    """Running standardisation of bounded features, released under zCDP (a river transformer).

    Records are scaled as ``(clip(x, a, b) − mean) / (std · norm_scale)`` with the *released*
    mean and standard deviation of each declared feature; the other features of the schema are
    divided by ``norm_scale``, chosen so that the root-mean-square norm of a scaled record is
    about ``target_norm``. Before the first release the statistics are those of the uniform
    distribution on the bounds (public). After the last release they stay fixed. Its privacy
    cost is charged to a ledger under ``"gaussian-scaler"``: the ledger of the learner it
    serves when it sits in a :class:`~stream_dp.preprocessing.ScaledLearner` (one budget for
    both), or its own (``epsilon`` given) when used alone.

    Parameters
    ----------
    bounds
        ``{feature: (lower, upper)}``: the features to standardise and their public bounds.
        Values are clipped to them; wide bounds cost accuracy (the noise is relative to the
        width), never privacy.
    features
        The declared schema (names, or their number d for array input), bounds included. In a
        ``ScaledLearner``, ``None`` takes the learner's.
    target_norm
        The root-mean-square norm of a scaled record (R = 1 then clips few records); ``None``
        for no common factor (and no norm statistic).
    passthrough_bound
        ``B``: the features the scaler does not standardise count for the norm statistic with
        ``|x| ≤ B`` (one-hot and 0/1 features: 1). Their output is never clipped.
    release_at
        The steps (records learned) after which the statistics are released, increasing.
        ``None``: four doubling epochs ``n_1, 2n_1, 4n_1, 8n_1`` with ``n_1`` the first step at
        which the noise of a mean is at most a twentieth of the bounds' width (at least 100).
    budget_share
        In a ``ScaledLearner``: the fraction of the model's ρ the scaler spends (the learner
        gets the rest).
    epsilon, delta, conversion
        Alone: the scaler's own (ε, δ) budget, all spent on its releases. Leave ``epsilon=None``
        in a ``ScaledLearner``.
    seed
        Secret of the keyed noise. ``None`` (the default) draws 128 bits from the OS; an int is
        refused unless ``reproducible=True``.
    reproducible
        Declare the run non-private so that an int ``seed`` is accepted (tests, debugging).
    model_id
        Keys the noise together with the secret.

    Examples
    --------
    >>> from stream_dp.preprocessing import PrivateScaler
    >>> scaler = PrivateScaler(bounds={"age": (18, 100)}, features=["age", "member"],
    ...                        epsilon=1.0, release_at=(200,))
    >>> scaler.release_plan()[0]["step"], round(scaler.sensitivity, 4)
    (200, 2.2361)
    >>> for i in range(200):
    ...     scaler.learn_one({"age": 30 + i % 20, "member": float(i % 2)})
    >>> scaler.release_step, scaler.accountant.spent()[0] <= 1.0
    (200, True)
    >>> sorted(scaler.transform_one({"age": 40, "member": 1.0}))
    ['age', 'member']

    """

    def __init__(
        self,
        bounds: Mapping[Hashable, tuple[float, float]] | None = None,
        features: Sequence[Hashable] | int | None = None,
        target_norm: float | None = 0.75,
        passthrough_bound: float = 1.0,
        release_at: Sequence[int] | None = None,
        budget_share: float = 0.1,
        epsilon: float | None = None,
        delta: float = 1e-5,
        conversion: str = "tight",
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "stream-dp-scaler",
    ) -> None:
        self.bounds = bounds
        self.features = features
        self.target_norm = target_norm
        self.passthrough_bound = passthrough_bound
        self.release_at = release_at
        self.budget_share = budget_share
        self.epsilon = epsilon
        self.delta = delta
        self.conversion = conversion
        self.seed = seed
        self.reproducible = reproducible
        self.model_id = model_id
        check_seed(seed, reproducible, "PrivateScaler")
        _check_params(self)
        names, lower, upper = check_bounds(bounds)
        schema = schema_names(features)
        self._c0 = (lower + upper) / 2
        self._h = (upper - lower) / 2
        self._k = len(names)
        self._init_map(names, lower, upper, schema)
        self._noise = KeyedNoise(seed, model_id)
        self._budget: PrivacyBudget | BudgetSlice | None = None
        self._steps: tuple[int, ...] = ()
        self._sigmas: tuple[float, ...] = ()
        self._n = 0
        self._released: list[tuple[int, np.ndarray]] = []
        self._stopped = False
        #: Learned records with a value outside its declared bounds (clipped). Operator-only.
        self.n_out_of_bounds = 0
        if epsilon is not None:
            if schema is None:
                raise ValueError(
                    "a PrivateScaler with its own budget needs a declared schema: pass "
                    "features=[...] (all the features, the bounded ones included)"
                )
            budget = zcdp_budget(epsilon, delta, conversion)
            budget.accountant.private = self.private
            self.bind_budget(budget, own=True)

    def _more_tags(self) -> set[str]:
        return {OWN_LEDGER}  # in a pipeline; inside ScaledLearner it shares the learner's

    def __or__(self, other) -> compose.Pipeline:
        """River's ``scaler | other``; refused before a unit-level learner, whose guarantee per
        unit the scaler's per-event charge would void (:func:`~stream_dp.online.composition.
        check_unit_level`)."""
        pipeline = super().__or__(other)
        check_unit_level(pipeline)
        return pipeline

    def _init_map(self, scaled: tuple, lower: np.ndarray, upper: np.ndarray, schema) -> None:
        super()._init_map(scaled, lower, upper, schema)
        self._p = len(self._others) if schema is not None and self.target_norm is not None else 0
        self._dims = 2 * self._k + (1 if self._p else 0)
        self._sums = np.zeros(self._dims)
        for cache in ("_index_cache", "_other_cols_cache", "_others_frozen"):
            self.__dict__.pop(cache, None)
        self._set_prior()  # the norm term depends on how many features pass through

    # -- the budget and the release schedule ----------------------------------------------------
    def bind_budget(self, budget: PrivacyBudget, own: bool = False) -> None:
        """Charge ``budget`` from now on: all of it (``own``), else ``budget_share`` of it,
        through a :class:`~stream_dp.privacy.budget.BudgetSlice` under ``"gaussian-scaler"``.
        Fixes the release steps and σ (a pure function of the budget and the parameters)."""
        if self._schema is None:
            raise ValueError("a PrivateScaler needs a declared schema before it can learn")
        self._budget = budget if own else budget.slice(self.budget_share, MECHANISM)
        n_rel = DEFAULT_RELEASES if self.release_at is None else len(self.release_at)
        schedule = HorizonSchedule(n_rel)
        sens = self.sensitivity
        self._sigmas = tuple(
            gaussian_sigma_zcdp(sens, self._budget.limit * schedule.share(i + 1))
            for i in range(n_rel)
        )
        if self.release_at is None:
            first = max(MIN_FIRST_RELEASE, math.ceil(self._sigmas[0] / FIRST_RELEASE_NOISE))
            self._steps = tuple(first * 2**i for i in range(n_rel))
        else:
            self._steps = tuple(int(s) for s in self.release_at)

    @property
    def budget(self) -> PrivacyBudget | BudgetSlice | None:
        """What the releases are charged to (None until bound)."""
        return self._budget

    @property
    def accountant(self):
        """The ledger the releases are charged to: ``accountant.spent()``."""
        return None if self._budget is None else self._budget.accountant

    @property
    def private(self) -> bool:
        """False for a reproducible (guessable) seed: nothing it releases is private then."""
        return self.seed is None

    @property
    def sensitivity(self) -> float:
        """Δ of one release (:func:`scaler_sensitivity`)."""
        return scaler_sensitivity(self._k, self._p > 0)

    def release_plan(self) -> list[dict]:
        """Step, Δ, σ and ρ of every release, before any data."""
        sens = self.sensitivity
        return [
            {"step": t, "sensitivity": sens, "sigma": s, "rho": gaussian_rho(sens, s)}
            for t, s in zip(self._steps, self._sigmas, strict=True)
        ]

    @property
    def release_step(self) -> int:
        """The step of the latest release (0: the prior statistics are in use)."""
        return self._released[-1][0] if self._released else 0

    @property
    def release_vector(self) -> np.ndarray | None:
        """The latest release ``Y`` itself (noisy sums; ``None`` before the first): public."""
        return self._released[-1][1].copy() if self._released else None

    @property
    def n_releases(self) -> int:
        return len(self._released)

    @property
    def n_seen(self) -> int:
        """Records learned so far."""
        return self._n

    # -- what a record contributes ----------------------------------------------------------------
    def _dict_row(self, x: Mapping) -> np.ndarray:
        """A validated dict record in schema order; a missing scaled feature is its centre."""
        self._transform_dict(x)  # validates every value as the transform does
        index = self._index
        row = np.zeros(len(self._schema))
        for j, c in zip(self._cols, self._center, strict=True):
            row[j] = c
        for k, v in x.items():
            i = index.get(k)
            if i is not None:
                row[i] = float(v)
        return row

    @property
    def _index(self) -> dict:
        cached = self.__dict__.get("_index_cache")
        if cached is None:
            cached = {n: i for i, n in enumerate(self._schema)}
            self.__dict__["_index_cache"] = cached
        return cached

    def _contributions(self, A: np.ndarray) -> tuple[np.ndarray, int]:
        """Each row's ``(u, u², q)`` (u ∈ [−1, 1]^k, q ∈ [0, 1]) and how many rows had a value
        outside its bounds; the same arithmetic for one record or many, so learning one at a
        time or in batches gives identical sums."""
        k = self._k
        C = np.empty((len(A), self._dims))
        X = A[:, self._cols]
        Xc = np.clip(X, self._lower, self._upper)
        n_out = int(np.count_nonzero((Xc != X).any(axis=1)))
        U = np.clip((Xc - self._c0) / self._h, -1.0, 1.0)
        C[:, :k] = U
        C[:, k : 2 * k] = U * U
        if self._p:
            B2 = float(self.passthrough_bound) ** 2
            P = np.minimum(A[:, self._other_cols] ** 2, B2)
            C[:, 2 * k] = np.cumsum(P, axis=1)[:, -1] / (self._p * B2)  # sequential order
        return C, n_out

    @property
    def _other_cols(self) -> np.ndarray:
        cached = self.__dict__.get("_other_cols_cache")
        if cached is None:
            index = self._index
            cached = np.array([index[n] for n in self._others], dtype=np.intp)
            self.__dict__["_other_cols_cache"] = cached
        return cached

    # -- learning -------------------------------------------------------------------------------
    def _require_budget(self) -> None:
        if self._budget is None:
            raise RuntimeError(
                "this PrivateScaler has no budget: give it epsilon=... to use it alone, or put "
                "it in a ScaledLearner (which charges the learner's ledger)"
            )

    def learn_one(self, x) -> None:
        """Add one record to the running sums; at a release step, release (charged first)."""
        self._require_budget()
        row = self._dict_row(x) if isinstance(x, Mapping) else self._array(x)
        self.learn_rows(row[None, :])

    def learn_many(self, X) -> None:
        """:meth:`learn_one` on each row of a 2-D array or DataFrame, in order, with identical
        sums and releases; an invalid row raises after the rows before it were learned."""
        self._require_budget()
        A, k = self.rows(X)
        if A is None:
            k = 0
        if k:
            self.learn_rows(A[:k])
        if A is None or k < len(A):
            for i in range(k, len(X)):
                self.learn_one(self.row(X, i))

    def learn_rows(self, A: np.ndarray) -> None:
        """Learn validated rows in schema order (from :meth:`rows`), releasing at each release
        step reached on the way."""
        i, m = 0, len(A)
        while i < m:
            nxt = self._next_release()
            j = m if nxt is None else min(m, i + nxt - self._n)
            C, n_out = self._contributions(A[i:j])
            self.n_out_of_bounds += n_out
            self._sums = np.add.accumulate(np.vstack([self._sums[None, :], C]), axis=0)[-1]
            self._n += j - i
            i = j
            if nxt is not None and self._n == nxt:
                self._release()

    def _next_release(self) -> int | None:
        if self._stopped:
            return None
        for t in self._steps:
            if t > self._n:
                return t
        return None

    def _release(self) -> None:
        step = self._n
        index = self._steps.index(step)
        sigma = self._sigmas[index]
        try:
            self._budget.charge(GaussianEvent(step, self.sensitivity, sigma, MECHANISM))
        except BudgetExhausted as exc:
            self._stopped = True
            warnings.warn(
                f"PrivateScaler: the release at step {step} was refused ({exc}); the scaler "
                f"keeps the statistics of step {self.release_step}",
                RuntimeWarning,
                stacklevel=4,
            )
            return
        weights = np.ones(self._dims)
        weights[self._k : 2 * self._k] = _SQRT2
        noise = self._noise.gaussian(step, (self._dims,), sigma, purpose=PURPOSE)
        released = self._sums * weights + noise
        self._released.append((step, released))
        self._set_released(released, step, sigma)

    # -- statistics from a release (post-processing) ----------------------------------------------
    def _set_prior(self) -> None:
        """The uniform distribution on the bounds: mean 0, variance 1/3 in u units; q = 1/3."""
        k = self._k
        self._set_stats(np.zeros(k), np.full(k, 1.0 / 3.0), 1.0 / 3.0)

    def _set_released(self, y: np.ndarray, n: int, sigma: float) -> None:
        k = self._k
        m = np.clip(y[:k] / n, -1.0, 1.0)
        second = y[k : 2 * k] / (_SQRT2 * n)
        floor = sigma / (_SQRT2 * n)  # the noise of the second moment: no smaller spread is known
        var = np.clip(second - m * m, floor, 1.0)
        q = float(np.clip(y[2 * k] / n, 0.0, 1.0)) if self._p else 0.0
        self._set_stats(m, var, q)

    def _set_stats(self, m: np.ndarray, var: np.ndarray, q: float) -> None:
        self._center = self._c0 + self._h * m
        self._spread = self._h * np.sqrt(var)
        if self.target_norm is None:
            self._norm = 1.0
        else:
            B2 = float(self.passthrough_bound) ** 2
            mean_square = self._k + (self._p * B2 * q if self._p else 0.0)
            self._norm = math.sqrt(mean_square) / float(self.target_norm)

    # -- what it says about itself ----------------------------------------------------------------
    def release_info(self) -> dict:
        """The statistics in use (released, or the prior): safe to publish with a model."""
        return {
            "step": self.release_step,
            "center": {str(k): v for k, v in self.center.items()},
            "spread": {str(k): v for k, v in self.spread.items()},
            "norm_scale": self.norm_scale,
            "private": self.private,
        }

    def describe(self) -> str:
        """Releases, Δ, σ and ρ before any data."""
        plan = self.release_plan()
        flag = "" if self.private else "NOT PRIVATE (reproducible seed): "
        if not plan:
            return f"{flag}PrivateScaler: no budget bound yet ({self._k} bounded features)"
        rho = sum(p["rho"] for p in plan)
        return (
            f"{flag}PrivateScaler: {self._k} bounded features"
            + (f", norm over {self._p} others" if self._p else "")
            + f"; releases at steps {[p['step'] for p in plan]}, Δ={plan[0]['sensitivity']:.4g}, "
            f"σ={plan[0]['sigma']:.4g} each; ρ={rho:.4g} in all"
        )

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to resume exactly. The running sums are raw statistics of the
        records and the secret keys the noise: store it like the data (mode 0600)."""
        return {
            "format": STATE_FORMAT,
            "class": type(self).__name__,
            "secret": self._noise.secret,
            "n": self._n,
            "sums": self._sums.tolist(),
            "released": [(t, y.tolist()) for t, y in self._released],
            "stopped": self._stopped,
            "n_out_of_bounds": self.n_out_of_bounds,
            "budget": self._budget.to_dict() if isinstance(self._budget, PrivacyBudget) else None,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`. A scaler in a ``ScaledLearner`` is re-bound to the
        learner's restored budget by the composite; one with its own budget restores it."""
        if state.get("format") != STATE_FORMAT or state.get("class") != type(self).__name__:
            raise ValueError("not a PrivateScaler state of this layout")
        self._noise = KeyedNoise(int(state["secret"]), self.model_id)
        self._n = int(state["n"])
        self._sums = np.asarray(state["sums"], dtype=float)
        self._released = [(int(t), np.asarray(y, dtype=float)) for t, y in state["released"]]
        self._stopped = bool(state["stopped"])
        self.n_out_of_bounds = int(state["n_out_of_bounds"])
        if state["budget"] is not None:
            self.bind_budget(budget_from_dict(state["budget"]), own=True)
        self._set_prior()
        if self._released:
            step, y = self._released[-1]
            self._set_released(y, step, self._sigmas[self._steps.index(step)])

    @classmethod
    def _unit_test_params(cls):
        yield {"bounds": {"gallup": (30.0, 60.0), "ipsos": (30.0, 60.0)},
               "features": ("gallup", "ipsos", "morning_consult", "ordinal_date", "rasmussen",
                            "you_gov"),
               "target_norm": None, "release_at": (5, 10), "epsilon": 4.0, "seed": 42,
               "reproducible": True}  # fmt: skip


def _check_params(s: PrivateScaler) -> None:
    tn = s.target_norm
    if tn is not None and not (
        isinstance(tn, int | float) and not isinstance(tn, bool) and 0 < tn < math.inf
    ):
        raise ValueError(f"target_norm must be a positive number or None, got {tn!r}")
    pb = s.passthrough_bound
    if isinstance(pb, bool) or not isinstance(pb, int | float) or not 0 < pb < math.inf:
        raise ValueError(f"passthrough_bound must be a positive number, got {pb!r}")
    if s.release_at is not None:
        steps = list(s.release_at)
        if (
            not steps
            or any(isinstance(t, bool) or int(t) != t or t < 1 for t in steps)
            or any(b <= a for a, b in zip(steps, steps[1:], strict=False))
        ):
            raise ValueError(f"release_at must be increasing positive ints, got {s.release_at!r}")
    share = s.budget_share
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1:
        raise ValueError(f"budget_share must be in (0, 1), got {share!r}")
    eps = s.epsilon
    if eps is not None and (isinstance(eps, bool) or not (0 < eps < math.inf)):
        raise ValueError(f"epsilon must be None or a positive finite number, got {eps!r}")
