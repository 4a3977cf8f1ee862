"""Shared additions made for the offline algorithms: all-pairs loss/gradient, ℓ1 row clipping,
and each paper's calibration (``docs/algorithms.md``), checked against the formulas written out
here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.losses import (
    ContrastiveLoss,
    HingeAUCLoss,
    HingeMetricLoss,
    LogisticAUCLoss,
    LogisticMetricLoss,
    Regularized,
)
from stream_dp.offline import huai, kang, li, pgd, xue, yang
from stream_dp.privacy import mechanisms as mech
from stream_dp.privacy.conversions import gaussian_delta_exact

LOSSES = [LogisticAUCLoss(), LogisticMetricLoss(), HingeAUCLoss(), HingeMetricLoss()]


def _data(loss, n, d, rng):
    X = rng.normal(size=(n, d))
    if loss.task == "auc":
        Y = rng.choice([-1.0, 1.0], n)
    else:
        Y = rng.integers(0, 3, n).astype(float)
    w = rng.normal(size=loss.param_shape(d))
    if w.ndim == 2:
        w = (w + w.T) / 2
    return X, Y, w


def _brute(loss, w, X, Y):
    """Eq. (1) of Xue et al. by an explicit loop over rows, with the buffer-path primitives."""
    n = len(Y)
    g, v = np.zeros_like(w), 0.0
    for i in range(n):
        others = np.arange(n) != i
        D, c = X[i] - X[others], loss.pair_coefficients(Y[i], Y[others])
        g += loss.pair_gradient_sum(w, D, c)
        v += float(loss.pair_values(w, D, c).sum())
    return v / (n * (n - 1)), g / (n * (n - 1))


@pytest.mark.parametrize("loss", [*LOSSES, Regularized(LogisticMetricLoss(), 0.3, np.eye(4))])
@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 30), block=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_all_pairs_equals_explicit_sum(loss, n, block, seed):
    X, Y, w = _data(loss, n, 4, np.random.default_rng(seed))
    v, g = _brute(loss, w, X, Y)
    np.testing.assert_allclose(loss.all_pairs_gradient(w, X, Y, block=block), g, atol=1e-12)
    assert loss.all_pairs_value(w, X, Y, block=block) == pytest.approx(v, abs=1e-12)


def test_all_pairs_degenerate_sizes():
    loss = LogisticAUCLoss()
    assert loss.all_pairs_value(np.ones(2), np.ones((1, 2)), np.ones(1)) == 0.0
    np.testing.assert_array_equal(loss.all_pairs_gradient(np.ones(2), np.ones((1, 2)), np.ones(1)),
                                  np.zeros(2))  # fmt: skip


def test_buffer_path_unchanged_for_auc_ties():
    """Tied AUC pairs (docs/algorithms.md, *Conventions shared by all learners*) cost log 2 and
    have no gradient."""
    loss = LogisticAUCLoss()
    w, x = np.array([1.0, 2.0]), np.array([0.5, 0.5])
    X, Y = np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([1.0, 1.0])
    assert loss.value(w, x, 1.0, X, Y) == pytest.approx(math.log(2.0))
    np.testing.assert_array_equal(loss.gradient(w, x, 1.0, X, Y), np.zeros(2))


def test_clip_rows_l1_and_default_l2():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(5, 3, 4)) * 10
    c1 = ContrastiveLoss.clip_rows(g, 0.5, norm=1)
    assert np.abs(c1).sum(axis=2).max() <= 0.5 + 1e-12
    c2 = ContrastiveLoss.clip_rows(g, 0.5)
    np.testing.assert_allclose(np.linalg.norm(c2, axis=2), 0.5)
    small = g * 1e-6
    np.testing.assert_array_equal(ContrastiveLoss.clip_rows(small, 0.5, norm=1), small)


# ------------------------------------------------------------------------------------------
# Calibrations: the papers' formulas, written out independently of the code
# ------------------------------------------------------------------------------------------
G, ALPHA, N, EPS, DELTA = 4.004, 1e-3, 256, 0.8, 1 / 256


def test_offpair_sigma_is_the_papers_formula():
    sens = huai.offpair_sensitivity(G, ALPHA, N)
    sigma = mech.gaussian_sigma_classic_safe(sens, EPS, DELTA)
    paper = math.sqrt(
        128 * G**2 * math.log(N) ** 2 * math.log(1.25 / DELTA) / (ALPHA**2 * N**2 * EPS**2)
    )
    assert sigma == pytest.approx(paper, rel=1e-12)


def test_dpgdsc_dpgdc_dpegd_formulas():
    s = mech.gaussian_sigma_classic_safe(xue.dpgdsc_sensitivity(G, ALPHA, N), EPS, DELTA)
    assert s == pytest.approx(8 * math.sqrt(2 * math.log(1.25 / DELTA)) * G / (ALPHA * N * EPS))
    b = mech.laplace_scale_from_l2(xue.dpgdsc_sensitivity(G, ALPHA, N), EPS, 64)
    assert b == pytest.approx(8 * G * math.sqrt(64) / (ALPHA * N * EPS))
    eta, T = 0.3, 17
    s = mech.gaussian_sigma_classic_safe(xue.dpgdc_sensitivity(G, eta, T, N), EPS, DELTA)
    assert s == pytest.approx(4 * math.sqrt(2 * math.log(1.25 / DELTA)) * G * T * eta / (N * EPS))
    b = mech.laplace_scale_from_l2(xue.dpgdc_sensitivity(G, eta, T, N), EPS, 8)
    assert b == pytest.approx(4 * G * eta * T * math.sqrt(8) / (N * EPS))
    s = mech.gaussian_sigma_classic_safe(xue.dpegd_sensitivity(G, eta), EPS, DELTA)
    assert s == pytest.approx(4 * math.sqrt(2 * math.log(1.25 / DELTA)) * G * eta / EPS)


def test_gradient_perturbation_sigmas():
    T = 40
    assert xue.dpgdc2_sigma(G, T, N, EPS, DELTA) == pytest.approx(
        4 * G * math.sqrt(1.25 * T * math.log(1 / DELTA)) / (N * EPS)
    )
    assert kang.gradperturb_sigma(G, T, N, EPS, DELTA) == pytest.approx(
        8 * G * math.sqrt(T * math.log(1 / DELTA)) / (N * EPS)
    )
    assert pgd.pairwise_gradient_sensitivity(G, N) == 4 * G / N


def test_pairwise_sgd_sigma_is_e_times_eq5_for_T_at_least_n():
    eta, T = 0.01, 3 * N
    eq5 = (8 * eta**2 * G**2 * math.log(2.5 / DELTA) / EPS**2) * (
        T + 3 * T**2 * math.log(math.e * T) ** 2 * math.log(2 / DELTA) ** 2 / N**2
    )
    sigma = yang.pairwise_sgd_sigma(G, eta, T, N, EPS, DELTA)
    assert sigma**2 == pytest.approx(math.e * eq5, rel=1e-12)


def test_pairwise_sgd_sensitivity_small_T_uses_general_bound():
    """For T < n, eq. (9) is not a valid bound; eq. (3) at t = T is used (it is larger there)."""
    eta, T, n, delta = 0.01, 10, 1000, 1e-5
    ell = math.log(2 / delta)
    eq3 = T + math.log(math.e * T) ** 2 * (T / n + ell + math.sqrt(T * ell / n)) ** 2
    eq9 = T + 3 * T**2 * math.log(math.e * T) ** 2 * ell**2 / n**2
    assert eq3 > eq9
    got = yang.pairwise_sgd_sensitivity(G, eta, T, n, delta)
    assert got == pytest.approx(math.sqrt(4 * math.e * eta**2 * G**2 * eq3))


def test_dppdml_scale_splits_epoch_budget_over_rows():
    b = li.dppdml_laplace_scale(kappa=3, clip=0.5, batch_size=50, n_rows=4, epsilon_epoch=0.5)
    assert b == pytest.approx(3 * (2 * 0.5 / 50) * 4 / 0.5)
    assert 3 * (2 * 0.5 / 50) * 4 / b <= 0.5


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-5), (0.9, 1e-3), (2.0, 1 / 256), (10.0, 1e-5)])
def test_classic_safe_is_dp_and_never_below_classic(eps, delta):
    s = mech.gaussian_sigma_classic_safe(1.0, eps, delta)
    assert s >= mech.gaussian_sigma_approx_dp(1.0, eps, delta)
    assert gaussian_delta_exact(1.0 / (2 * s**2), eps) <= delta * (1 + 1e-9)
    a = mech.gaussian_sigma_analytic(1.0, eps, delta)
    assert a <= s and gaussian_delta_exact(1.0 / (2 * a**2), eps) <= delta * (1 + 1e-9)


def test_classic_is_raised_where_not_dp():
    # ε = 10, δ = 1e-5: the classic σ leaves δ(ε) ≈ 2e-5 > δ.
    classic = mech.gaussian_sigma_approx_dp(1.0, 10.0, 1e-5)
    assert gaussian_delta_exact(1.0 / (2 * classic**2), 10.0) > 1e-5
    assert mech.gaussian_sigma_classic_safe(1.0, 10.0, 1e-5) > classic


@settings(max_examples=50, deadline=None)
@given(l2=st.floats(1e-6, 1e3), eps=st.floats(1e-3, 10), p=st.integers(1, 400))
def test_laplace_scale_from_l2_never_overspends(l2, eps, p):
    b = mech.laplace_scale_from_l2(l2, eps, p)
    assert math.sqrt(p) * l2 / b <= eps
    assert b == pytest.approx(math.sqrt(p) * l2 / eps, rel=1e-12)
