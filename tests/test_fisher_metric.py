"""FisherMetric: calibration, sensitivity, ledger, input handling and river's interface."""

from __future__ import annotations

import contextlib
import itertools
import math

import numpy as np
import pytest
from river import checks

from stream_dp.online import FisherMetric, PrivateMetricKNN
from stream_dp.online.fisher import (
    FAMILY_ERROR,
    class_statistics_sensitivity,
    fisher_weights,
    noise_threshold,
    released_class_moments,
    shrunk_variance,
    statistics_vector,
)
from stream_dp.privacy.events import GaussianEvent, gaussian_rho
from stream_dp.privacy.gdp import rho_budget
from stream_dp.privacy.mf import MECHANISM_NAME

__all__: list[str] = []

R = 0.5


def _stream(n: int = 64, d: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.5
    X = rng.normal(size=(n, d)) * 0.3
    X[:, 0] += np.where(y, 0.2, -0.2)
    return X, y


def _clip(X: np.ndarray, r: float = R) -> np.ndarray:
    norms = np.linalg.norm(X, axis=1)
    return X * np.minimum(1.0, r / np.maximum(norms, 1e-300))[:, None]


def _record(row) -> dict:
    return {f"x{k}": float(v) for k, v in enumerate(row)}  # the schema of features=d


def _metric(seed: int = 1, epsilon: float | None = 1.0, n: int = 64, d: int = 3, **kw):
    return FisherMetric(epsilon=epsilon, horizon=n, features=d, seed=seed, reproducible=True, **kw)


def test_sigma_is_calibrated_on_the_exact_budget_and_the_one_step_pattern():
    m = _metric()
    mf = m.mf
    # Δ = sup ‖C·D‖ over one-step differences of norm Δ_v: the factorization's own bound.
    delta_v = class_statistics_sensitivity(R)
    assert mf.pattern.tolist() == [delta_v]
    assert mf.sensitivity == pytest.approx(mf.factorization.sensitivity(np.array([delta_v]), 64))
    rho = rho_budget(1.0, 1e-5)  # the exact (μ-GDP) budget of the default conversion
    assert m.budget.limit == pytest.approx(rho, rel=1e-12)
    # σ = Δ/√(2ρ): the one charge spends the budget, never more.
    assert gaussian_rho(mf.sensitivity, mf.sigma) <= m.budget.limit
    assert mf.sigma == pytest.approx(mf.sensitivity / math.sqrt(2.0 * rho), rel=1e-6)


def test_the_injected_noise_has_the_calibrated_variance():
    """Released sums minus the true ones, over 40 secrets × 10 coordinates: variance
    σ²·E_n (the factorization's prefix-noise factor). At σ/2 the ratio would be ¼."""
    n, d = 64, 2
    X, y = _stream(n, d)
    truth = statistics_vector(_clip(X), y, R).sum(0)
    noise = []
    for secret in range(40):
        m = _metric(secret, n=n, d=d)
        m.learn_many(X, y)
        noise.append(m.release_vector - truth)
    expected = m.mf.sigma**2 * m.mf.factorization.max_error(n)
    assert m.noise_std == pytest.approx(math.sqrt(expected))
    ratio = float(np.mean(np.square(noise))) / expected
    assert 0.7 < ratio < 1.4, ratio  # 400 draws: ±0.07 one sd; σ/2 gives 0.25


@pytest.mark.parametrize("radius", [0.25, 0.5, 1.0, 3.0])
def test_delta_v_is_the_largest_replace_one_difference(radius):
    d = 3
    e = np.eye(d) * radius

    def diff(x, px, x2, px2):
        v = statistics_vector(np.array([x, x2]), np.array([px, px2]), radius)
        return float(np.linalg.norm(v[0] - v[1]))

    bound = class_statistics_sensitivity(radius)
    # Different classes, along two axes at the radius: attains Δ_v (λ = R).
    assert diff(e[0], True, e[1], False) == pytest.approx(bound, rel=1e-12)
    # The same class: x′ = −x (4R²) and orthogonal axes (2R² + 2R⁴), both within it.
    assert diff(e[0], True, -e[0], True) ** 2 == pytest.approx(4 * radius**2)
    assert diff(e[0], True, e[1], True) ** 2 == pytest.approx(2 * radius**2 + 2 * radius**4)
    # Random pairs on the sphere of radius R, every label combination: never above.
    rng = np.random.default_rng(0)
    P = _clip(rng.normal(size=(400, d)) * 10, radius)
    for (i, j), (a, b) in zip(
        itertools.combinations(range(40), 2), itertools.cycle([(1, 1), (1, 0), (0, 0)])
    ):
        assert diff(P[i], bool(a), P[j], bool(b)) <= bound * (1 + 1e-12)


def test_neighbouring_streams_with_a_shared_secret_differ_by_at_most_delta_v():
    """Replace record i by the adversarial one: with the same secret the released sums differ
    by v(z_i) − v(z′_i) from step i on, and by nothing before — never above Δ_v."""
    n, d, i = 32, 3, 10
    X, y = _stream(n, d)
    X2, y2 = X.copy(), y.copy()
    X[i], y[i] = [R, 0.0, 0.0], True
    X2[i], y2[i] = [0.0, R, 0.0], False
    a, b = _metric(7, n=n, d=d), _metric(7, n=n, d=d)
    gaps = []
    for t in range(n):
        a.learn_one(_record(X[t]), bool(y[t]))
        b.learn_many(X2[t : t + 1], y2[t : t + 1])
        gaps.append(float(np.linalg.norm(a.release_vector - b.release_vector)))
    delta_v = class_statistics_sensitivity(R)
    assert max(gaps[:i]) == 0.0
    assert max(gaps) <= delta_v * (1 + 1e-9)
    assert min(gaps[i:]) == pytest.approx(delta_v, rel=1e-9)  # the bound is attained


def test_the_ledger_is_charged_before_the_first_release_and_a_refusal_learns_nothing():
    X, y = _stream()
    m = _metric()
    assert not m.accountant.ledger and m.private_weights.tolist() == [1.0, 1.0, 1.0]
    m.learn_many(X[:1], y[:1])
    (event,) = m.accountant.ledger
    assert (event.step, event.mechanism, event.sigma) == (1, MECHANISM_NAME, m.mf.sigma)
    m.learn_many(X[1:], y[1:])
    assert len(m.accountant.ledger) == 1 and m.accountant.spent()[0] <= 1.0
    # A budget that cannot take the charge: no step, no noise, Euclidean distance.
    full = _metric()
    sigma = 1.0 / math.sqrt(2.0 * 0.9 * full.budget.limit)
    full.budget.charge(GaussianEvent(1, 1.0, sigma, "gaussian-scaler"))
    with pytest.warns(RuntimeWarning, match="exhausted"):
        full.learn_many(X, y)
    assert full.step == 0 and not full.release_vector.any() and full.n_rejected == len(y)
    assert full.private_weights.tolist() == [1.0, 1.0, 1.0]


def test_bad_input_is_refused_and_nothing_is_learned():
    m = _metric()
    for x, label in [({"x0": math.nan}, True), ({"x0": 0.1}, None), ({"x0": "a"}, True),
                     ({"x0": 0.1}, [1]), ({"x0": math.inf}, False)]:  # fmt: skip
        with pytest.raises(ValueError):
            m.learn_one(x, label)
    assert m.step == 0 and not m.accountant.ledger and not m.release_vector.any()
    X, y = _stream(8)
    X[5, 1] = math.inf
    with pytest.raises(ValueError):
        m.learn_many(X, y)
    assert m.step == 5  # the rows before the bad one, then the error
    with pytest.raises(ValueError, match="features"):
        FisherMetric(epsilon=1.0)
    with pytest.raises(ValueError, match="epsilon"):
        FisherMetric(epsilon=-1.0, features=2)


def test_learn_many_is_learn_one_and_the_horizon_stops_learning():
    X, y = _stream(40)
    a, b = _metric(3, n=30), _metric(3, n=30)
    for t in range(40):
        with pytest.warns(RuntimeWarning) if t == 30 else contextlib.nullcontext():
            a.learn_one(_record(X[t]), bool(y[t]))
    with pytest.warns(RuntimeWarning, match="horizon"):
        b.learn_many(X, y)
    assert a.step == b.step == 30 and a.exhausted and b.exhausted
    assert np.array_equal(a.release_vector, b.release_vector)
    assert np.array_equal(a.private_weights, b.private_weights)


def test_weights_are_post_processing_and_the_transform_is_the_metric():
    X, y = _stream(64)
    free = _metric(epsilon=None)
    free.learn_many(X, y)
    exact = statistics_vector(_clip(X), y, R).sum(0)
    assert np.allclose(free.release_vector, exact)  # no noise: the sums themselves
    assert np.allclose(free.private_weights, fisher_weights(exact, 3, R, 0.0))
    m = _metric(5)
    m.learn_many(X, y)
    w = fisher_weights(m.release_vector, 3, R, m.noise_std)
    assert np.array_equal(m.private_weights, w)
    a, b = _record([0.1, -0.2, 0.05]), _record([-0.1, 0.1, 0.0])
    ta, tb = m.transform_one(a), m.transform_one(b)
    gap = math.sqrt(sum((ta[k] - tb[k]) ** 2 for k in ta))
    assert gap == pytest.approx(m.distance(a, b))
    diff = np.array([a[k] - b[k] for k in a])
    assert m.distance(a, b) == pytest.approx(math.sqrt(float(w @ diff**2)))


def test_under_pure_noise_the_metric_is_euclidean():
    """Labels independent of the features at a small ε: no feature passes the threshold."""
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(64, 3)) * 0.3, rng.random(64) < 0.5
    ones = 0
    for secret in range(10):
        m = _metric(secret, epsilon=0.5)
        m.learn_many(X, y)
        ones += m.private_weights.tolist() == [1.0, 1.0, 1.0]
    assert ones >= 8


def _balanced_sums(d: int, n: int = 200) -> np.ndarray:
    """Exact sums of n records per class with the same class means (0) and variances."""
    rng = np.random.default_rng(3)
    half = rng.normal(size=(n // 2, d)) * 0.05
    X = np.vstack([half, -half, half, -half])  # each class: ±half, mean exactly 0
    y = np.repeat([True, False], n)
    return statistics_vector(X, y, R).sum(0)


def test_the_noise_threshold_holds_its_family_wise_error():
    """Equal class means, released with noise of the stated σ_N: the metric leaves Euclidean
    distance in about α of the releases (Bonferroni over d features is nearly exact at small
    α). A threshold on τ instead of τ², or on the wrong noise, lands far outside."""
    d, sigma_n, draws = 20, 2.0, 1500
    exact = _balanced_sums(d)
    rng = np.random.default_rng(4)
    moved = 0
    for _ in range(draws):
        w = fisher_weights(exact + sigma_n * rng.normal(size=exact.shape), d, R, sigma_n)
        moved += not np.all(w == 1.0)
    rate = moved / draws
    assert 0.5 * FAMILY_ERROR < rate < 1.5 * FAMILY_ERROR, rate  # ±0.006 one sd at 1500
    # c_d's two-sided tail is α/d (Bonferroni).
    tail = math.erfc(math.sqrt(noise_threshold(d) / 2.0))
    assert tail == pytest.approx(FAMILY_ERROR / d, rel=1e-9)


def test_a_real_difference_passes_and_a_zeroed_variance_takes_no_weight():
    d, sigma_n = 20, 2.0
    exact = _balanced_sums(d)
    diff, _, tau2, _ = released_class_moments(exact, d, R, sigma_n)
    assert not np.any(diff)
    shifted = exact.copy()
    shifted[1] += 200 * 2.0 * math.sqrt(noise_threshold(d) * tau2)  # class 0, feature 0: 2·c_d·τ
    rng = np.random.default_rng(5)
    w = fisher_weights(shifted + sigma_n * rng.normal(size=exact.shape), d, R, sigma_n)
    assert int(np.argmax(w)) == 0 and w[0] > 2.0 and np.all(w[1:] < w[0])
    # Shrinkage: under noise far above the spread every feature gets the common variance; a
    # noisy zero is pulled up to it. Without noise the estimate is untouched.
    pooled = np.array([0.0, 0.01, 0.012, 0.008])
    assert np.allclose(shrunk_variance(pooled, 1.0), pooled.mean(), rtol=1e-3)
    assert np.array_equal(shrunk_variance(pooled, 0.0), pooled)


def test_released_moments_are_unbiased_with_the_stated_noise():
    """Over noise draws: D's variance is τ² and the pooled variance is unbiased (the noise in
    μ̂² added back); at σ/2 the variance ratio would be ¼."""
    d, sigma_n, draws = 5, 1.0, 800
    exact = _balanced_sums(d)
    truth = released_class_moments(exact, d, R, 0.0)[1]
    rng = np.random.default_rng(6)
    D, P = [], []
    for _ in range(draws):
        diff, pooled, tau2, nu2 = released_class_moments(
            exact + sigma_n * rng.normal(size=exact.shape), d, R, sigma_n
        )
        D.append(diff)
        P.append(pooled)
    ratio = float(np.mean(np.square(D))) / tau2
    assert 0.85 < ratio < 1.15, ratio  # 4000 draws: ±0.03 one sd
    bias = (np.mean(P, axis=0) - truth) / math.sqrt(nu2 / draws)
    assert np.all(np.abs(bias) < 4.0), bias
    assert float(np.mean(np.var(P, axis=0))) / nu2 == pytest.approx(1.0, rel=0.25)


def test_private_metric_knn_uses_it():
    from river import evaluate, metrics

    knn = PrivateMetricKNN(
        FisherMetric(epsilon=4.0, horizon=200, features=["a", "b"]), n_neighbors=3
    )
    data = [({"a": float(i % 4) / 8, "b": float(i % 3) / 8}, i % 2 == 0) for i in range(60)]
    score = evaluate.progressive_val_score(data, knn, metrics.Accuracy())
    assert knn.metric.step == 60 and 0.0 <= score.get() <= 1.0


@pytest.mark.parametrize("reproducible", [False, True])
def test_river_check_estimator(reproducible):
    params = next(FisherMetric._unit_test_params())
    if not reproducible:
        params = {**params, "seed": None, "reproducible": False}
    checks.check_estimator(FisherMetric(**params))


def test_a_checkpoint_resumes_with_the_same_noise_and_one_charge():
    X, y = _stream(60)
    straight = _metric(4, n=60)
    straight.learn_many(X, y)
    first = _metric(4, n=60)
    first.learn_many(X[:25], y[:25])
    state = first.state_dict()
    resumed = _metric(4, n=60)
    resumed.load_state_dict(state)
    resumed.learn_many(X[25:], y[25:])
    assert np.array_equal(resumed.release_vector, straight.release_vector)
    assert len(resumed.accountant.ledger) == 1 and resumed.step == 60
    with pytest.raises(ValueError, match="parameters"):
        _metric(4, n=61).load_state_dict(state)
