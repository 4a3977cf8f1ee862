"""Pairwise influence patterns: how much one replaced record can change the gradient stream.

The correlated-noise learner's gradient at step t is ``g_t = (1/B) Σ_{j ∈ P_t} ∇ℓ(w_{t−1}; z_t,
z_j)`` over the partners ``P_t`` its buffer offers, with a *fixed* divisor B. Replace one record
``z_i`` by ``z′_i`` (any features, any label, any position) and evaluate both streams' gradients at
the same iterates — the adaptive setting of Denisov et al. (NeurIPS 2022), in which every
``w_{t−1}`` is a function of earlier outputs. The *influence pattern* ``u`` bounds the rows:
``‖g_{i+k} − g′_{i+k}‖ ≤ u[k]``, and the mechanism's sensitivity is then ``sup ‖C D‖_F`` over such D
(:meth:`stream_dp.privacy.factorizations.Factorization.sensitivity`). ``docs/privacy.md``
(*Sensitivity of the gradient stream*) derives every bound used here.

Two kinds of pair terms differ between the streams:

* **one-sided**: a term present on one stream only (a pairing the other stream does not make);
  its norm is at most ``one_sided``;
* **two-sided**: the same pairing on both streams, with ``z_i`` in one and ``z′_i`` in the other;
  the difference is at most ``two_sided``.

:func:`pair_term_bounds` gives both for the logistic losses, on the model set the iterates stay
in; :func:`window_pattern` turns OnPairMF's buffer policy (a FIFO window) into ``u``.

"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special

__all__ = [
    "PairTermBounds",
    "pair_term_bounds",
    "window_pattern",
]


@dataclasses.dataclass(frozen=True)
class PairTermBounds:
    """Bounds on one pair term's gradient: present on one stream, or on both with z_i ≠ z′_i."""

    one_sided: float
    two_sided: float

    @property
    def largest(self) -> float:
        return max(self.one_sided, self.two_sided)


def pair_term_bounds(
    task: str,
    data_radius: float,
    model_radius: float,
    slope_cap: float | None = None,
    metric: str = "full",
) -> PairTermBounds:
    """Term bounds of the logistic pairwise losses for ``‖x‖ ≤ R`` and models in the ball ``D``.

    The gradient of a pair is ``s·c·φ(δ)`` with ``s = −φ'(·) = expit(−argument) ∈ (0, 1)``.
    Because the iterate stays in C, the argument is bounded, so ``s ≤ s_max < 1``:

    * AUC, ``φ(c·wᵀδ)`` with ``c ∈ {±2}``, ``‖w‖ ≤ D``, ``‖δ‖ ≤ 2R``: the argument is in
      ``[−4RD, 4RD]``, ``s_max = expit(4RD)``; one-sided ``≤ 2·2R·s_max = 4R·s_max``. Two-sided
      (same labels: c is the same on both streams, ``δ − δ′ = x_i − x′_i``):
      ``‖c(sδ − s′δ′)‖ ≤ 2·max over the box s, s′ ∈ [s_min, s_max] ≤ 2·2R·s_max`` — the norm is
      convex in (s, s′), so the maximum sits at a corner, and at every corner it is at most
      ``s_max·max(‖δ‖, ‖δ′‖, ‖δ − δ′‖)``. A changed label never leaves a pairing on both
      streams with the same partner (the pair is valid on exactly one), so two-sided = one-sided.
      With the slope cap κ of the capped logistic loss (:class:`stream_dp.losses.LogisticAUCLoss`)
      every slope is at most κ too: ``s_max = min(κ, expit(4RD))``, and the same argument over
      the box ``[0, s_max]²`` gives both bounds — ``4R·κ`` for every D once ``κ ≤ ½``.
    * metric, ``φ(c(1 − δᵀWδ))`` with ``c = ±1``, ``W ⪰ 0``, ``‖W‖_F ≤ D``: ``δᵀWδ ∈ [0, 4R²D]``,
      ``s_max = expit(max(1, 4R²D − 1))``; one-sided ``≤ 4R²·s_max``. A changed label flips c
      while the pairing stays: two-sided ``≤ ‖sδδᵀ‖ + ‖s′δ′δ′ᵀ‖ ≤ 2·4R²·s_max``.
    * diagonal metric (``metric="diagonal"``), ``φ(c(1 − wᵀ(δ∘δ)))`` with ``w ≥ 0``,
      ``‖w‖ ≤ D``: the pair feature is ``δ∘δ`` with ``‖δ∘δ‖₂ = (Σ δ_k⁴)^{1/2} ≤ Σ δ_k² =
      ‖δ‖² ≤ 4R²``, and ``0 ≤ wᵀ(δ∘δ) ≤ ‖w‖·‖δ∘δ‖ ≤ 4R²D`` (Cauchy–Schwarz), so ``s_max`` and
      both bounds are the full metric's. They are attained (δ along one axis, w = D·e_k), so
      the diagonal saves nothing per term: it saves coordinates — the noise moves d of them,
      not d(d+1)/2.

    These are the constants of :mod:`stream_dp.losses` (``G = 4R`` and ``4R²``) times
    ``s_max``; the ``2G`` per differing pair of the certified recurrence
    (:mod:`stream_dp.sensitivity`) is the two-sided bound without the convexity argument
    (``docs/privacy.md``, *Known problems in the papers*, item 8).

    Examples
    --------
    >>> b = pair_term_bounds("auc", data_radius=1.0, model_radius=1.0)
    >>> round(b.one_sided, 4), b.two_sided == b.one_sided
    (3.9281, True)
    >>> pair_term_bounds("auc", data_radius=0.5, model_radius=1e4, slope_cap=0.5).one_sided
    1.0
    >>> m = pair_term_bounds("metric", data_radius=1.0, model_radius=1.0)
    >>> round(m.one_sided, 4), round(m.two_sided / m.one_sided, 6)
    (3.8103, 2.0)
    >>> pair_term_bounds("metric", 1.0, 1.0, metric="diagonal") == m
    True

    """
    R, D = float(data_radius), float(model_radius)
    if not (R > 0 and D > 0 and math.isfinite(R) and math.isfinite(D)):
        raise ValueError(f"radii must be positive and finite, got R={R!r}, D={D!r}")
    if slope_cap is not None and not (0.0 < slope_cap <= 1.0 and task == "auc"):
        raise ValueError(f"a slope cap in (0, 1] bounds the AUC loss only, got {slope_cap!r}")
    if task == "auc":
        s_max = float(special.expit(4.0 * R * D))
        if slope_cap is not None:
            s_max = min(float(slope_cap), s_max)
        one = 4.0 * R * s_max
        return PairTermBounds(one, one)
    if metric not in ("full", "diagonal") or (metric == "diagonal" and task != "metric"):
        raise ValueError(f"metric must be 'full' or 'diagonal' (metric task), got {metric!r}")
    if task == "metric":
        # The diagonal's feature δ∘δ and statistic wᵀ(δ∘δ) obey the full metric's bounds.
        s_max = float(special.expit(max(1.0, 4.0 * R * R * D - 1.0)))
        one = 4.0 * R * R * s_max
        return PairTermBounds(one, 2.0 * one)
    raise ValueError(f"task must be 'auc' or 'metric', got {task!r}")


def window_pattern(window: int, divisor: int, bounds: PairTermBounds) -> np.ndarray:
    """``u`` for a label-agnostic window of the last ``window`` records (a FIFO of that size).

    Partners are the window's records of the other class (AUC) or all of them (metric).
    Membership is a function of arrival indices only, so a replaced record changes no one
    else's membership. Record i meets at most ``window`` partners at its own step and is a
    partner at most once at each of the next ``window`` steps, with one term differing per
    pairing (one-sided if its label changed the pair's validity, two-sided otherwise):

        u = (largest term / B) · [window, 1, 1, …, 1]        (window ones)

    Examples
    --------
    >>> window_pattern(3, 3, PairTermBounds(1.0, 1.0)).tolist()
    [1.0, 0.3333333333333333, 0.3333333333333333, 0.3333333333333333]

    """
    window, divisor = _positive(window, "window"), _positive(divisor, "divisor")
    unit = bounds.largest / divisor
    u = np.full(window + 1, unit)
    u[0] = window * unit
    return u


def _positive(v: int, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)
