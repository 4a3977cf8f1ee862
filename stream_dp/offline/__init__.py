"""Offline private pairwise learners: one finite dataset in, one private model and a ledger out.

=================  ==========================  =====================  ==========================
class              paper                       mechanism              ledger
=================  ==========================  =====================  ==========================
``OffPairStrC``    Huai et al. 2020, Alg. 3    output (GIGA average)  (ε,δ) or ε (Laplace, δ=0)
``OffPairC``       Huai et al. 2020, Alg. 4    output (GIGA average)  (ε,δ) or ε (Laplace, δ=0)
``DPGDSC``         Xue et al. 2021, Alg. 1     output (PGD, w_T)      (ε,δ) or ε
``DPGDC``          Xue et al. 2021, Alg. 4     output (PGD average)   (ε,δ) or ε
``DPGDC2``         Xue et al. 2021, Alg. 2     gradient (T noisy)     zCDP, T Gaussian events
``DPEGD``          Xue et al. 2021, Alg. 3     output per epoch       (ε,δ) or ε, parallel
``GradPerturb``    Kang et al., Alg. 1         gradient (T noisy)     zCDP, T Gaussian events
``PairwiseSGD``    Yang et al. 2021, Alg. 2    output (SGD average)   (ε,δ)
``DPPDML``         Li et al. 2020, Alg. 1      minibatch gradient     ε, one event per epoch
=================  ==========================  =====================  ==========================

Each paper's sensitivities and noise calibrations live in its module, next to its algorithm
(``huai``, ``xue``, ``kang``, ``yang``, ``li``; ``pgd`` holds the full-gradient optimiser Xue
et al. and Kang et al. share); the generic mechanisms are in
:mod:`stream_dp.privacy.mechanisms`. With scikit-learn installed (optional, 1.6 or newer) every
class is a scikit-learn estimator: a classifier for ``task="auc"``, a transformer for
``task="metric"`` (:mod:`stream_dp.offline._sklearn`). See ``docs/algorithms.md`` for when to use
which, and what works with scikit-learn.
"""

from __future__ import annotations

from stream_dp.offline._sklearn import expected_failed_checks
from stream_dp.offline.base import OfflinePairwiseBase
from stream_dp.offline.huai import OffPairC, OffPairStrC
from stream_dp.offline.kang import GradPerturb
from stream_dp.offline.li import (
    DPPDML,
    appendix_kappa,
    degree_kappa,
    pair_graph_kappa,
    random_pair_graph,
)
from stream_dp.offline.xue import DPEGD, DPGDC, DPGDC2, DPGDSC
from stream_dp.offline.yang import PairwiseSGD

__all__ = [
    "DPEGD",
    "DPGDC",
    "DPGDC2",
    "DPGDSC",
    "DPPDML",
    "GradPerturb",
    "OffPairC",
    "OffPairStrC",
    "OfflinePairwiseBase",
    "PairwiseSGD",
    "appendix_kappa",
    "degree_kappa",
    "expected_failed_checks",
    "pair_graph_kappa",
    "random_pair_graph",
]
