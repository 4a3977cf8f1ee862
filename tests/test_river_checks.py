"""Every learner passes river's own estimator checks (river.checks.check_estimator).

Twice: constructed as the README shows — private (``seed=None``), a declared schema, defaults
for the rest — and constructed reproducibly (``_unit_test_params``: ``seed=42,
reproducible=True``), which also runs the checks that re-seed the model.
"""

from __future__ import annotations

import copy

import pytest
from river import checks, datasets

from stream_dp.online import OnPairC, OnPairMF, OnPairStrC, PairwiseGIGA, PrivateMetricKNN
from stream_dp.online.interfaces import SEEDED_RIVER_CHECKS
from stream_dp.online.params import river_check_params

CLASSES = (OnPairStrC, OnPairC, OnPairMF, PairwiseGIGA)
LEARNERS = [(cls, task) for cls in CLASSES for task in ("auc", "metric")]


def _ids(v):
    return getattr(v, "__name__", v)


def _as_in_the_readme(cls, task, multiclass: bool = False):
    """``cls(task=..., epsilon=..., delta=..., horizon=..., features=[...])``: the README's
    construction (seed=None: a private run), with the features of the data river checks on."""
    features = river_check_params(task, multiclass=multiclass)["features"]
    if cls is PairwiseGIGA:
        return cls(task=task, features=features)
    return cls(task=task, epsilon=4.0, delta=1e-5, horizon=20_000, features=features)


def _reproducible(cls, task):
    variant = cls._variants[task]
    return variant(**next(variant._unit_test_params()))


@pytest.mark.parametrize("cls,task", LEARNERS, ids=_ids)
def test_check_estimator_as_the_readme_constructs(cls, task):
    model = _as_in_the_readme(cls, task)
    assert isinstance(model, cls) and model.seed is None and not model.reproducible
    checks.check_estimator(model)


@pytest.mark.parametrize("cls,task", LEARNERS, ids=_ids)
def test_check_estimator_reproducible_runs_every_check(cls, task):
    model = _reproducible(cls, task)
    assert isinstance(model, cls) and model._unit_test_skips() == set()
    checks.check_estimator(model)


@pytest.mark.parametrize("cls", CLASSES, ids=_ids)
def test_a_private_learner_skips_only_the_checks_that_set_an_integer_seed(cls):
    """The skipped checks really cannot run on a private learner: river's seeding check sets
    seed=42, which a private learner refuses (its noise would be guessable)."""
    model = _as_in_the_readme(cls, "auc")
    assert model._unit_test_skips() == set(SEEDED_RIVER_CHECKS)
    yielded = {check.__name__ for check in checks.yield_checks(model)}
    assert "check_seeding_is_idempotent" in yielded
    seeding = next(
        c for c in checks.yield_checks(model) if c.__name__ == "check_seeding_is_idempotent"
    )
    with pytest.raises(ValueError, match="reproducible=True"):
        seeding(model.clone())


def test_knn_check_estimator_as_the_readme_constructs():
    knn = PrivateMetricKNN(_as_in_the_readme(OnPairStrC, "metric", multiclass=True))
    assert knn._unit_test_skips() == set(SEEDED_RIVER_CHECKS)
    checks.check_estimator(knn)


def test_knn_check_estimator_reproducible():
    knn = next(PrivateMetricKNN._unit_test_params())
    checks.check_estimator(PrivateMetricKNN(**knn))


@pytest.mark.parametrize("cls,task", LEARNERS, ids=_ids)
def test_learn_one_never_mutates_input(cls, task):
    model = _reproducible(cls, task)
    data = datasets.Phishing() if task == "auc" else datasets.TrumpApproval()
    for x, y in data.take(120):
        xx, yy = copy.deepcopy(x), copy.deepcopy(y)
        model.learn_one(x, y)
        assert x == xx and y == yy
        before = copy.deepcopy(x)
        if task == "auc":
            model.predict_proba_one(x)
        else:
            model.transform_one(x)
        assert x == before
