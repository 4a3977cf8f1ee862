"""A scaler and a private learner as one river estimator with one budget.

The learner owns the model's zCDP budget (built in its constructor); the composite binds a
:class:`~stream_dp.preprocessing.PrivateScaler` to a :class:`~stream_dp.privacy.budget.
BudgetSlice` of that same budget. Why this shape (``docs/privacy.md``, *Private
preprocessing*):

- river's ``clone()`` rebuilds an estimator from its parameters, deep-copying nested ones. A
  budget passed as a parameter would be copied, and two clones would then each believe they own
  the whole ε. Here no budget is a parameter: ``clone()`` rebuilds the learner (a fresh budget,
  fresh secrets) and the scaler, and the composite's constructor binds the new scaler to the new
  learner's budget — one budget per model, whatever river copies.
- The split is explicit: the learner is built with ``budget_share`` (its fraction of ρ) and the
  scaler spends at most the rest, so the learner's release schedule is planned on what it may
  really spend, and ``learner.accountant.spent()`` is the guarantee of both.
- Record ``t`` is scaled with the statistics released before it, then learned by the learner,
  then added to the scaler's running sums: the learner sees a fixed function of each record given
  public (released) statistics — post-processing of the scaler's releases.
- A unit-level learner (``unit_key``) takes a ``PublicScaler`` only: a ``PrivateScaler``'s
  charge is per event, the learner's guarantee per unit, and the composite would claim the
  latter for both. The unit field goes around the scaler to the learner.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from river import base

from stream_dp.online.composition import PRIVATE_LEARNER, refuse_before_unit_level
from stream_dp.preprocessing.affine import AffineScaler
from stream_dp.preprocessing.private_scaler import PrivateScaler

__all__ = ["ScaledLearner"]


def _check_components(scaler, learner) -> None:
    if not isinstance(scaler, AffineScaler):
        raise TypeError(
            f"ScaledLearner needs a PrivateScaler or a PublicScaler, got {type(scaler).__name__}: "
            "a scaler that learns from the stream without a privacy charge (e.g. river's "
            "StandardScaler) would void the learner's guarantee"
        )
    if not hasattr(learner, "budget") or not hasattr(learner, "release_message"):
        raise TypeError(f"ScaledLearner needs a private stream_dp learner, got {learner!r}")
    if getattr(learner, "step", 0) or getattr(learner, "n_rejected", 0):
        raise ValueError("the learner has already learned: give ScaledLearner a fresh one")
    if not isinstance(scaler, PrivateScaler):
        return
    if getattr(learner, "privacy_unit", None) is not None:
        refuse_before_unit_level(scaler, learner)
    if scaler.budget is not None:
        raise ValueError(
            "this PrivateScaler already has a budget (its own epsilon, or another learner's): "
            "give ScaledLearner a scaler built without epsilon"
        )
    if learner.budget is None:
        raise ValueError(f"{type(learner).__name__} has no budget for a private scaler to share")
    # What the learner itself may spend: its releases' share and its operator metrics' share.
    learner_share = learner._release_share() + float(getattr(learner, "metrics_share", 0.0))
    if learner_share + float(scaler.budget_share) > 1.0 + 1e-12:
        raise ValueError(
            f"the learner may spend {learner_share:g} of the budget and the scaler "
            f"{scaler.budget_share:g}: together more than all of it. Build the learner with "
            f"budget_share={1.0 - float(scaler.budget_share):g} (1 − the scaler's share)"
        )


class ScaledLearner(base.Estimator):
    """A scaler in front of a private learner, with one budget and one ledger for both.

    The safe form of ``StandardScaler() | learner``: records are standardised with statistics
    that cost no privacy (:class:`~stream_dp.preprocessing.PublicScaler`) or are released under
    zCDP on the learner's own ledger (:class:`~stream_dp.preprocessing.PrivateScaler`, charged
    under ``"gaussian-scaler"`` within its ``budget_share``). The learner is built with
    ``budget_share`` = 1 − the scaler's share, so ``accountant.spent()`` is the guarantee of
    everything the model publishes. ``ScaledLearner(scaler, OnPairStrC(task="auc", ...))`` is a
    river classifier; with a metric learner it is a supervised transformer.

    Parameters
    ----------
    scaler
        A ``PrivateScaler`` (without ``epsilon``) or a ``PublicScaler``. Its ``features``
        default to the learner's.
    learner
        A fresh private learner (``OnPairStrC``, ``OnPairC``, …). A unit-level one
        (``unit_key``) takes a ``PublicScaler`` only (a ``PrivateScaler`` is refused: its
        charge is per event); its unit field bypasses the scaler.

    Examples
    --------
    >>> from river import evaluate, metrics
    >>> from stream_dp.online import OnPairStrC
    >>> from stream_dp.preprocessing import PrivateScaler, ScaledLearner
    >>> model = ScaledLearner(
    ...     PrivateScaler(bounds={"age": (18, 100), "income": (0, 200_000)}, budget_share=0.1),
    ...     OnPairStrC(task="auc", epsilon=4.0, horizon=2000, features=["age", "income"],
    ...                budget_share=0.9),
    ... )
    >>> stream = (({"age": 20 + i % 60, "income": 1000.0 * (i % 150)}, i % 150 > 70)
    ...           for i in range(2000))
    >>> _ = evaluate.progressive_val_score(stream, model, metrics.ROCAUC())
    >>> sorted({e.mechanism for e in model.accountant.ledger})
    ['gaussian', 'gaussian-scaler']
    >>> model.accountant.spent()[0] <= 4.0
    True

    """

    _variants: dict[str, type] = {}

    def _more_tags(self) -> set[str]:
        return {PRIVATE_LEARNER}

    def __new__(cls, scaler=None, learner=None):
        # river recognises a classifier or a transformer by its class, as for the learners.
        if cls is ScaledLearner:
            kind = "transformer" if isinstance(learner, base.Transformer) else "classifier"
            cls = cls._variants[kind]
        return object.__new__(cls)

    def __init__(self, scaler: AffineScaler, learner) -> None:
        self.scaler = scaler
        self.learner = learner
        _check_components(scaler, learner)
        scaler.adopt_features(learner.feature_names or learner.features)
        if isinstance(scaler, PrivateScaler):
            scaler.bind_budget(learner.budget)

    # -- what the model is ------------------------------------------------------------------------
    @property
    def budget(self):
        """The one zCDP budget of the model (the learner's); both components charge it."""
        return self.learner.budget

    @property
    def accountant(self):
        """The shared ledger: ``accountant.spent()`` is the guarantee of scaler and learner."""
        return self.learner.accountant

    @property
    def private(self) -> bool:
        return self.learner.private and getattr(self.scaler, "private", True)

    @property
    def release_step(self) -> int:
        return self.learner.release_step

    @property
    def step(self) -> int:
        return self.learner.step

    @property
    def privacy_unit(self):
        """The learner's unit field and contribution bound (None: event-level)."""
        return self.learner.privacy_unit

    def _scaled(self, x):
        """``x`` scaled, its unit field (a unit-level learner's) passed around the scaler."""
        unit = self.learner.privacy_unit
        if unit is None or not isinstance(x, Mapping) or unit.key not in x:
            return self.scaler.transform_one(x)
        key, rest = unit.split(x)
        return {**self.scaler.transform_one(rest), unit.key: key}

    def describe(self) -> str:
        """Both components' plans, before any data."""
        scaler = self.scaler.describe() if hasattr(self.scaler, "describe") else repr(self.scaler)
        return f"{scaler}\n{self.learner.describe()}"

    def release_message(self) -> dict:
        """The learner's release fields and the scaler's statistics in use (both private)."""
        msg = self.learner.release_message()
        if isinstance(self.scaler, PrivateScaler):
            msg["scaler"] = self.scaler.release_info()
            msg["private"] = msg["private"] and self.scaler.private
        return msg

    # -- learning -------------------------------------------------------------------------------
    def learn_one(self, x, y, **kwargs) -> None:
        """Scale ``x`` with the statistics released so far, learn it, then add it to the
        scaler's sums. An invalid record raises before either component changes."""
        xs = self._scaled(x)
        self.learner.learn_one(xs, y, **kwargs)
        if isinstance(self.scaler, PrivateScaler):
            self.scaler.learn_one(x)

    def learn_many(self, X, y, units=None) -> None:
        """:meth:`learn_one` on each row, in order, with the same releases of both components;
        runs of rows between two scaler releases go through each component in one call. A
        unit-level learner takes the rows' units as its own ``learn_many`` does (``units``, or
        the DataFrame's unit column)."""
        labels = list(y)
        if len(X) != len(labels):
            raise ValueError(f"X has {len(X)} rows but y has {len(labels)} labels")
        unit = self.learner.privacy_unit
        if unit is not None:
            # Only a PublicScaler gets here (_check_components): it learns nothing.
            units, rest = unit.split_batch(X, units)
            self.learner.learn_many(self.scaler.transform_many(rest), labels, units=units)
            return
        if units is not None:
            raise ValueError("units=... is for a unit-level learner (give it unit_key)")
        scaler = self.scaler
        A, k = scaler.rows(X)
        if A is None:
            k = 0
        i = 0
        while i < k:
            nxt = scaler._next_release() if isinstance(scaler, PrivateScaler) else None
            j = k if nxt is None else min(k, i + nxt - scaler.n_seen)
            before = self.learner.step + self.learner.n_rejected
            try:
                self.learner.learn_many(scaler._apply(A[i:j]), labels[i:j])
            finally:
                done = self.learner.step + self.learner.n_rejected - before
                if isinstance(scaler, PrivateScaler) and done:
                    scaler.learn_rows(A[i : i + done])
            i = j
        for r in range(k, len(labels)):
            self.learn_one(scaler.row(X, r), labels[r])

    # -- serving --------------------------------------------------------------------------------
    def transform_many(self, X):
        return self._serve_many(X, "transform_many")

    def _serve_many(self, X, method: str):
        return getattr(self.learner, method)(self.scaler.transform_many(X))

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Both components' states (the learner's holds the shared ledger)."""
        scaler = self.scaler.state_dict() if isinstance(self.scaler, PrivateScaler) else None
        return {"learner": self.learner.state_dict(), "scaler": scaler}

    def load_state_dict(self, state: dict) -> None:
        """Restore both; the scaler is re-bound to the learner's restored budget."""
        self.learner.load_state_dict(state["learner"])
        if isinstance(self.scaler, PrivateScaler):
            self.scaler.bind_budget(self.learner.budget)
            self.scaler.load_state_dict(state["scaler"])

    @property
    def _multiclass(self) -> bool:
        return False

    @classmethod
    def _unit_test_params(cls):
        from stream_dp.online import OnPairStrC
        from stream_dp.online.params import river_check_params

        task = "metric" if issubclass(cls, base.Transformer) else "auc"
        params = river_check_params(task)
        first = params["features"][0]
        bounds = {first: (0.0, 1.0)} if task == "auc" else {first: (30.0, 60.0)}
        yield {
            "scaler": PrivateScaler(bounds=bounds, release_at=(20, 40), budget_share=0.2,
                                    seed=43, reproducible=True),
            "learner": OnPairStrC(**params, budget_share=0.8),
        }  # fmt: skip


class ScaledClassifier(ScaledLearner, base.Classifier):
    """``ScaledLearner`` with a ranking learner: a river binary classifier."""

    def score_one(self, x) -> float:
        return self.learner.score_one(self._scaled(x))

    def predict_proba_one(self, x, **kwargs) -> dict[bool, float]:
        return self.learner.predict_proba_one(self._scaled(x))

    def predict_one(self, x, **kwargs) -> bool:
        return self.learner.predict_one(self._scaled(x))

    def transform_one(self, x):
        """The scaled record the learner sees."""
        return self._scaled(x)

    def score_many(self, X) -> np.ndarray:
        return self._serve_many(X, "score_many")

    def predict_proba_many(self, X):
        return self._serve_many(X, "predict_proba_many")

    def predict_many(self, X):
        return self._serve_many(X, "predict_many")

    def transform_many(self, X):
        return self.scaler.transform_many(X)


class ScaledTransformer(ScaledLearner, base.SupervisedTransformer):
    """``ScaledLearner`` with a metric learner: ``transform_one`` is the learned metric's
    embedding of the scaled record."""

    def transform_one(self, x) -> dict:
        xs = self._scaled(x)
        if not isinstance(xs, Mapping):
            xs = dict(zip(self.scaler._schema, np.asarray(xs).tolist(), strict=True))
        return self.learner.transform_one(xs)

    def distance(self, a, b) -> float:
        return self.learner.distance(self._scaled(a), self._scaled(b))


ScaledLearner._variants.update(classifier=ScaledClassifier, transformer=ScaledTransformer)
