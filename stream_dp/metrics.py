"""Ranking quality of a released model: the ROC AUC of scores, and of pair distances.

Both are Mann–Whitney statistics (ties count one half), computed exactly from ranks. They
evaluate a model on the records they are given; on private data the number itself is not
private (``docs/privacy.md``, *Threat model*).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.spatial.distance import pdist
from scipy.stats import rankdata

__all__ = ["auc_standard_error", "pair_roc_auc", "roc_auc"]


def roc_auc(scores, positive) -> float:
    """Area under the ROC curve of ``scores`` for the boolean labels ``positive``.

    The probability that a random positive scores above a random negative, ties counted one
    half; NaN when one of the two classes is empty.

    Examples
    --------
    >>> roc_auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True])
    0.75
    >>> roc_auc([1.0, 1.0], [False, True])
    0.5

    """
    positive = np.asarray(positive, dtype=bool)
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranks = rankdata(np.asarray(scores, dtype=float))
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def pair_roc_auc(Z, labels) -> float:
    """ROC AUC of Euclidean distances between the rows of ``Z`` for "same label" pairs.

    Every unordered pair ``i < j`` is scored by ``−‖z_i − z_j‖`` and is positive when
    ``labels[i] == labels[j]``: the result is the probability that a random same-label pair is
    closer than a random different-label pair (ties one half), the quantity a metric learner
    ranks by. NaN when there is no same-label or no different-label pair. O(n²) time and
    memory (the n(n−1)/2 distances).

    Examples
    --------
    >>> pair_roc_auc([[0.0], [0.1], [5.0], [5.2]], ["a", "a", "b", "b"])
    1.0
    >>> pair_roc_auc([[0.0], [5.0], [0.1], [5.2]], ["a", "a", "b", "b"])  # classes interleaved
    0.25

    """
    Z = np.asarray(Z, dtype=float)
    codes = np.unique(np.asarray(labels), return_inverse=True)[1].ravel()
    if Z.ndim != 2 or len(Z) != len(codes):
        raise ValueError(f"Z must be 2-D with one row per label, got {Z.shape} and {len(codes)}")
    i, j = np.triu_indices(len(codes), k=1)
    return roc_auc(-pdist(Z), codes[i] == codes[j])


def auc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley & McNeil (1982) standard error of an AUC estimate from ``n_pos`` positives and
    ``n_neg`` negatives.

    Examples
    --------
    >>> round(auc_standard_error(0.8, 50, 50), 4)
    0.0445
    """
    if not math.isfinite(auc):
        return math.nan
    q1 = auc / (2 - auc)
    q2 = 2 * auc**2 / (1 + auc)
    var = auc * (1 - auc) + (n_pos - 1) * (q1 - auc**2) + (n_neg - 1) * (q2 - auc**2)
    return math.sqrt(max(var, 0.0) / (n_pos * n_neg))
