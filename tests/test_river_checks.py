"""Every learner passes river's own estimator checks (river.checks.check_estimator)."""

from __future__ import annotations

import copy

import pytest
from river import checks, datasets

from stream_dp.online import OnPairC, OnPairStrC, PairwiseGIGA, PrivateMetricKNN

LEARNERS = [
    (cls, task) for cls in (OnPairStrC, OnPairC, PairwiseGIGA) for task in ("auc", "metric")
]


def _make(cls, task):
    variant = cls._variants[task]
    return variant(**next(variant._unit_test_params()))


@pytest.mark.parametrize("cls,task", LEARNERS, ids=lambda v: getattr(v, "__name__", v))
def test_check_estimator(cls, task):
    model = _make(cls, task)
    assert isinstance(model, cls)
    checks.check_estimator(model)


def test_knn_check_estimator():
    knn = next(PrivateMetricKNN._unit_test_params())
    checks.check_estimator(PrivateMetricKNN(**knn))


@pytest.mark.parametrize("cls,task", LEARNERS, ids=lambda v: getattr(v, "__name__", v))
def test_learn_one_never_mutates_input(cls, task):
    model = _make(cls, task)
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
