"""Online private pairwise learners with river's interface.

``OnPairStrC``, ``OnPairC`` (Huai et al. 2020, Algorithms 1–2), ``OnPairMF`` (correlated
gradient noise: a release at every step for one charge) and the non-private ``PairwiseGIGA``,
each a river classifier (``task="auc"``) or supervised transformer (``task="metric"``), and
``FisherMetric``, a diagonal metric from privately released class statistics, and
``PrivateMetricKNN``, a kNN classifier on a private learned metric.
"""

from __future__ import annotations

from stream_dp.online.fisher import FisherMetric
from stream_dp.online.giga import PairwiseGIGA
from stream_dp.online.interfaces import PrivateMetricDistance
from stream_dp.online.knn import PrivateMetricKNN
from stream_dp.online.onpairc import OnPairC
from stream_dp.online.onpairmf import OnPairMF
from stream_dp.online.onpairstrc import OnPairStrC

__all__ = [
    "FisherMetric",
    "OnPairC",
    "OnPairMF",
    "OnPairStrC",
    "PairwiseGIGA",
    "PrivateMetricDistance",
    "PrivateMetricKNN",
]
