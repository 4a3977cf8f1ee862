"""A learned metric in river's k-nearest neighbours: PrivateMetricKNN works, the pipeline refuses.

``metric learner | neighbors.KNNClassifier()`` would run at about chance (river's Pipeline
stores the neighbours untransformed and transforms the queries; the metric also changes with
every release), so the learner refuses to compose it, and ``check_pipeline`` refuses it in a
pipeline river composed without the learner, with an error that names the class to use.
"""

from __future__ import annotations

import itertools
import warnings

import pytest
from river import compose, datasets, evaluate, metrics, neighbors, preprocessing

from stream_dp.online import OnPairC, OnPairMF, OnPairStrC, PairwiseGIGA, PrivateMetricKNN
from stream_dp.online.composition import UnsupportedComposition
from stream_dp.preprocessing import check_pipeline

#: ImageSegments' 18 features: the declared schema.
SEGMENTS = tuple(sorted(next(iter(datasets.ImageSegments()))[0]))


def _metric(cls, **kw):
    if cls is PairwiseGIGA:
        return cls(task="metric", features=SEGMENTS)
    return cls(task="metric", epsilon=4.0, features=SEGMENTS, **kw)


@pytest.mark.parametrize("cls", [OnPairStrC, OnPairC, OnPairMF, PairwiseGIGA])
@pytest.mark.parametrize("scaled", [True, False])
def test_a_metric_learner_before_river_knn_is_refused_with_the_class_to_use(cls, scaled):
    kw = {"horizon": 2310} if cls is OnPairC else {}
    learner = _metric(cls, **kw)
    if scaled:  # river composes this one without asking the learner
        pipe = preprocessing.StandardScaler() | learner | neighbors.KNNClassifier()
        with pytest.raises(UnsupportedComposition, match="PrivateMetricKNN"):
            check_pipeline(pipe)
    else:
        with pytest.raises(UnsupportedComposition, match="PrivateMetricKNN"):
            learner | neighbors.KNNClassifier()
        with pytest.raises(UnsupportedComposition, match="PrivateMetricKNN"):
            learner | (preprocessing.StandardScaler() | neighbors.KNNClassifier())


def test_a_metric_learner_in_a_pipeline_without_knn_still_transforms():
    learner = _metric(OnPairStrC)
    pipe = compose.Pipeline(preprocessing.StandardScaler(), learner)
    for x, y in datasets.ImageSegments().take(30):
        pipe.learn_one(x, y)
        out = pipe.transform_one(x)
        assert set(out) == set(SEGMENTS)
    assert learner.step == 30


def _segments(n: int = 1200):
    """The first ``n`` of Image Segments' 2,310 records (the kNN search is the suite's cost)."""
    return itertools.islice(datasets.ImageSegments(), n)


def test_private_metric_knn_on_image_segments():
    """The supported composition: far above chance (≈ 14 %) at ε = 4; plain kNN on the same
    scaled features is the reference it is compared with."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        knn = preprocessing.StandardScaler() | PrivateMetricKNN(_metric(OnPairStrC))
        private = evaluate.progressive_val_score(_segments(), knn, metrics.Accuracy())
    plain = evaluate.progressive_val_score(
        _segments(),
        preprocessing.StandardScaler() | neighbors.KNNClassifier(),
        metrics.Accuracy(),
    )
    assert private.get() > 0.8 and private.get() > plain.get() - 0.05, (private, plain)
