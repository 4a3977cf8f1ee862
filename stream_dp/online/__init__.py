"""Online private pairwise learners with river's interface."""

from __future__ import annotations

from stream_dp.online.base import huai_step_size, huai_warmup
from stream_dp.online.giga import PairwiseGIGA
from stream_dp.online.interfaces import PrivateMetricDistance
from stream_dp.online.knn import PrivateMetricKNN
from stream_dp.online.onpairc import OnPairC
from stream_dp.online.onpairstrc import OnPairStrC

__all__ = [
    "OnPairC",
    "OnPairStrC",
    "PairwiseGIGA",
    "PrivateMetricDistance",
    "PrivateMetricKNN",
    "huai_step_size",
    "huai_warmup",
]
