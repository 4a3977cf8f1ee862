"""The schedules of Huai et al. (AAAI 2020), shared by their online and offline algorithms.

Algorithms 1–4 (OnPairStrC, OnPairC, OffPairStrC, OffPairC) run the same Pairwise GIGA pass:
a random, data-independent warm-up of ``T1`` steps, then projected gradient steps with
``η_t = 2(t−1)/(α t (t−2))``. Lemma 4 bounds the sensitivity of the iterate of that pass on the
full buffer. The online learners (:mod:`stream_dp.online`) and the offline ones
(:mod:`stream_dp.offline.huai`) both read these rules from here; ``docs/algorithms.md`` (*Warm-up
T1*, *Step size*) says where the project departs from them and why.
"""

from __future__ import annotations

import math

from stream_dp._jit import jitable

__all__ = [
    "alpha_for_warmup",
    "huai_sensitivity",
    "huai_step_size",
    "huai_warmup",
    "is_release_step",
]


def huai_warmup(smoothness: float, alpha: float) -> int:
    """Huai et al. (2020) Alg. 1: ``T1 = max(⌈16L/α²⌉, 7)``.

    Examples
    --------
    >>> huai_warmup(smoothness=5.0, alpha=1.0)
    80

    """
    return max(math.ceil(16.0 * smoothness / alpha**2), 7)


def alpha_for_warmup(base_smoothness: float, max_warmup: float) -> float:
    """The smallest α whose warm-up ``T1 = max(⌈16(L + α)/α²⌉, 7)`` is at most ``max_warmup``.

    ``L`` is the smoothness of the unregularised loss (the regulariser adds α to it). The
    positive root of ``16(L + α) = T·α²``, raised by ulps until the ceiling agrees.

    Examples
    --------
    >>> a = alpha_for_warmup(4.0, 100)
    >>> huai_warmup(4.0 + a, a) <= 100 < huai_warmup(4.0 + a * 0.999, a * 0.999)
    True
    >>> huai_warmup(4.0 + (b := alpha_for_warmup(4.0, 409.6)), b)
    409

    """
    T = float(math.floor(max_warmup))  # T1 is a whole number of steps
    if T < 7:
        raise ValueError(f"the warm-up is at least 7 steps (Huai et al. Alg. 1), got {max_warmup}")
    L = float(base_smoothness)
    alpha = (16.0 + math.sqrt(256.0 + 64.0 * T * L)) / (2.0 * T)
    while huai_warmup(L + alpha, alpha) > T:
        alpha = math.nextafter(alpha, math.inf)
    return alpha


@jitable
def huai_step_size(t, alpha):
    """Huai et al. (2020) Alg. 1: ``η_t = 2(t − 1) / (α t (t − 2))`` for t ≥ 3.

    The formula is infinite at t = 2 and negative at t = 1; those steps (reachable only by
    PairwiseGIGA, which has no warm-up, or a user warm-up below 2) use ``1/α``.

    Examples
    --------
    >>> huai_step_size(3, 1.0), huai_step_size(2, 0.5)
    (1.3333333333333333, 2.0)

    """
    if t <= 2:
        return 1.0 / alpha
    return 2.0 * (t - 1) / (alpha * t * (t - 2))


@jitable
def huai_sensitivity(lipschitz: float, alpha: float, t: int) -> float:
    """Huai et al. (2020) Lemma 4: ``‖w_t − w'_t‖ ≤ 8G/(αt)`` (full buffer, T1 as in Alg. 1).

    Examples
    --------
    >>> huai_sensitivity(4.0, 1.0, 100)
    0.32

    """
    return 8.0 * lipschitz / (alpha * t)


@jitable
def is_release_step(t, T1, every, horizon):
    """Whether step t publishes a model.

    Alg. 1 releases at every step; with ``release_every = k`` (``docs/privacy.md``, *Making
    private models usable*) every k-th step of the warm-up and step T1 release, then every k-th
    step after T1 and the horizon itself (``horizon < 0``: no horizon).

    Examples
    --------
    >>> [t for t in range(1, 12) if is_release_step(t, T1=4, every=3, horizon=11)]
    [3, 4, 7, 10, 11]

    """
    if t <= T1:
        return t % every == 0 or t == T1
    return (t - T1) % every == 0 or t == horizon
