"""OnPairMF's diagonal metric (``metric="diagonal"``): W = diag(w), w ≥ 0, ‖w‖ ≤ D.

Its noise is calibrated on the pair-term bound derived for the diagonal (a test that fails at
σ/2), its gradient stream's sensitivity is audited on neighbouring streams with a shared
secret, its start is the identity, and its release serves river's transform and distance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from stream_dp import _jit
from stream_dp.constraints import NonnegativeBall
from stream_dp.losses import DiagonalMetricLoss, LogisticMetricLoss
from stream_dp.online import OnPairMF, PrivateMetricKNN
from stream_dp.online.onpairmf import OnPairMFMetric
from stream_dp.privacy.gdp import rho_budget
from stream_dp.records import clip_norm

__all__: list[str] = []


def _learner(n=60, d=3, **kw) -> OnPairMF:
    params = dict(task="metric", metric="diagonal", epsilon=2.0, horizon=n, buffer=6,
                  features=d, seed=5, reproducible=True, track_regret=False)  # fmt: skip
    params.update(kw)
    return OnPairMF(**params)


def _stream(seed: int, n: int, d: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=0.6, size=(n, d))
    return X, np.where(X[:, 0] > 0, "a", "b")


# -- the loss, the set, the start --------------------------------------------------------------


def test_the_loss_is_the_full_metric_loss_on_diagonal_matrices() -> None:
    rng = np.random.default_rng(0)
    d, n = 4, 30
    X, Y = rng.normal(size=(n, d)), rng.integers(0, 2, n)
    w = rng.random(d)
    diag, full = DiagonalMetricLoss(), LogisticMetricLoss()
    g = diag.gradient(w, X[0], Y[0], X[1:], Y[1:])
    G = full.gradient(np.diag(w), X[0], Y[0], X[1:], Y[1:])
    np.testing.assert_allclose(g, np.diag(G), rtol=1e-12)
    assert diag.value(w, X[0], Y[0], X[1:], Y[1:]) == pytest.approx(
        full.value(np.diag(w), X[0], Y[0], X[1:], Y[1:]), rel=1e-12
    )
    np.testing.assert_allclose(
        diag.all_pairs_gradient(w, X, Y), np.diag(full.all_pairs_gradient(np.diag(w), X, Y)),
        rtol=1e-10, atol=1e-14,
    )  # fmt: skip


def test_the_projection_is_the_nearest_point_of_the_set() -> None:
    rng = np.random.default_rng(1)
    C = NonnegativeBall(2.0)
    for _ in range(50):
        v = rng.normal(size=5) * 3
        p = C.project(v)
        assert C.contains(p)
        for _ in range(20):  # no point of the set is nearer
            q = C.project(rng.normal(size=5) * 3)
            assert np.linalg.norm(v - p) <= np.linalg.norm(v - q) + 1e-12


def test_starts_at_the_identity_and_refuses_other_tasks() -> None:
    m = _learner(d=4)
    assert m.model_radius_ == 2.0 and m.mf.size == 4  # D = √d; d noisy coordinates
    m.learn_one(np.zeros(4), "a")  # no partner: the first release is the start plus noise
    assert m._state.constraint.contains(m.private_weights)
    assert (m._fast is not None) == _jit.numba_active()  # the compiled step runs it too
    with pytest.raises(ValueError, match="metric must be one of"):
        OnPairMF(task="auc", metric="diagonal", epsilon=1.0, horizon=10, features=2)
    with pytest.raises(ValueError, match="metric must be one of"):
        OnPairMF(task="metric", metric="lowrank", epsilon=1.0, horizon=10, features=2)


# -- calibration: σ from the derived bound, and the noise actually injected -----------------


def test_sigma_is_the_formula_of_the_diagonal_bound() -> None:
    n, d, B = 60, 3, 6
    m = _learner(n=n, d=d)
    R, D = m.data_radius_, m.model_radius_
    # The pair term s·(δ∘δ): ‖δ∘δ‖ ≤ ‖δ‖² ≤ 4R², 0 ≤ wᵀ(δ∘δ) ≤ 4R²D; a label change flips c.
    term = 2.0 * 4.0 * R * R * float(special.expit(max(1.0, 4.0 * R * R * D - 1.0)))
    u = (term / B) * np.array([B] + [1] * B, dtype=float)
    C = m.mf.factorization.strategy_matrix(n)
    cols = np.zeros((n, n))
    for i in range(n):  # the placement of the record's pattern at every step i
        k = min(len(u), n - i)
        cols[i : i + k, i] = u[:k]
    delta = max(float(np.linalg.norm(C @ cols[:, i])) for i in range(n))
    assert m.mf.sensitivity == pytest.approx(delta, rel=1e-6)
    rho = rho_budget(2.0, 1e-5)
    assert m.mf.sigma >= delta / math.sqrt(2.0 * rho) * (1 - 1e-9)
    assert m.mf.sigma == pytest.approx(delta / math.sqrt(2.0 * rho), rel=1e-3)


class _Inside(OnPairMFMetric):
    """Starts at half the identity's radius: the ball's sphere never projects the noise."""

    def _start(self, dim: int) -> np.ndarray:
        return super()._start(dim) / 2


def test_injected_noise_has_the_mechanisms_variance_and_sigma_over_two_fails() -> None:
    # Identical records: every pair feature δ∘δ is 0, so the gradient is 0 and the iterate is
    # w₀ − η·Σσ(MZ) (w₀ far inside the ball, far from the cone's faces: nothing projects).
    n, d, secrets = 12, 3, 120
    kw = dict(task="metric", metric="diagonal", epsilon=2.0, horizon=n, buffer=6, features=d,
              reproducible=True, track_regret=False, model_radius=1e9, step_size=1.0,
              averaging=None)  # fmt: skip
    template = _Inside(seed=5, **kw)
    mf = template.mf
    A = np.tril(np.ones((n, n)))
    M = mf.factorization.noise_matrix(n)
    expected = mf.sigma**2 * np.diag(A @ M @ M.T @ A.T)
    samples = np.zeros((secrets, n, d))
    for s in range(secrets):
        m = _Inside(seed=2000 + s, **kw)
        w0 = np.full(d, 0.5e9 / math.sqrt(d))
        for t in range(n):
            m.learn_one(np.full(d, 0.1), "a")
            samples[s, t] = w0 - m.private_weights

    def matches(x: np.ndarray) -> bool:
        var = np.mean(x**2, axis=(0, 2))  # 360 samples a step: relative s.e. ≈ 7.5 %
        return bool(np.all(np.abs(var / expected - 1.0) < 0.3)) and (
            abs(float(np.mean(var / expected)) - 1.0) < 0.2
        )

    assert matches(samples)
    assert not matches(samples / 2)  # noise at σ/2 is caught
    assert not matches(samples * 0.75)  # and at 3σ/4


# -- sensitivity: neighbouring streams, one secret, the same iterates ------------------------


def _gradient_rows(m: OnPairMF, X, y, forced) -> np.ndarray:
    s = m._state
    if s.w is None:
        m._bind()
    rows = []
    for t in range(len(y)):
        xc = clip_norm(np.asarray(X[t], dtype=float), m.data_radius_)
        yv = m._input.validate(X[t], y[t])[1]
        m._input.accept(y[t])  # registers a new class: its code is provisional until then
        BX, BY = s.buffer.view()
        rows.append(s.gradient(forced[t], xc, yv, BX, BY))
        s.buffer.add(xc, yv, t + 1, s.noise)
        s.t = t + 1
    return np.array(rows)


def test_neighbouring_streams_never_exceed_the_certified_sensitivity() -> None:
    n, d, window = 40, 3, 6
    rng = np.random.default_rng(12)
    worst = 0.0
    for trial in range(24):
        X = rng.normal(size=(n, d)) * rng.choice([0.2, 3.0])
        y = rng.integers(0, 3, n)
        i = int(rng.integers(0, n))
        X2, y2 = X.copy(), y.copy()
        if trial % 4 == 0:  # saturating: the record and its window on one axis, a label flip
            i = window
            X[:, :] = 0.0
            X[:, 0] = -5.0
            X2[:, :] = X
            X[i, 0] = X2[i, 0] = 5.0
            y[:] = 0
            y2[:] = 0
            y2[i] = 1
        else:
            X2[i] = -X[i] * 5 if trial % 2 else rng.normal(size=d) * 5
            if trial % 3 == 0:
                y2[i] = (y[i] + 1) % 3
        a = _learner(n=n, d=d, buffer=window)
        b = _learner(n=n, d=d, buffer=window)
        D = a.model_radius_
        forced = []
        for _ in range(n):  # an adversarial iterate per step, on the boundary of C
            w = np.abs(rng.normal(size=d)) if trial % 4 else np.eye(d)[0]
            forced.append(D * w / np.linalg.norm(w))
        G = _gradient_rows(a, X, y, forced)
        G2 = _gradient_rows(b, X2, y2, forced)
        C = a.mf.factorization.strategy_matrix(n)
        worst = max(worst, float(np.linalg.norm(C @ (G - G2))) / a.mf.sensitivity)
    assert worst <= 1.0
    # The saturating flip reaches s + s′ = 1 of the bound's 2·s_max: about half of Δ.
    assert worst > 0.4


# -- the release in river ---------------------------------------------------------------------


def test_transform_and_distance_use_the_released_diagonal() -> None:
    from river import compose, preprocessing

    X, y = _stream(3, 60, 3)
    names = ["x0", "x1", "x2"]
    m = _learner(features=names)
    a, b = np.array([0.3, -0.2, 0.1]), np.array([-0.1, 0.4, 0.0])
    ra, rb = dict(zip(names, a, strict=True)), dict(zip(names, b, strict=True))
    m.learn_many(X, y)
    w = m.private_weights
    out = m.transform_one(ra)
    np.testing.assert_allclose([out[k] for k in names], np.sqrt(w) * a, rtol=1e-12)
    assert m.distance(ra, rb) == pytest.approx(math.sqrt(float(w @ (a - b) ** 2)), rel=1e-12)
    pipe = compose.Pipeline(preprocessing.StandardScaler(), _learner(features=names))
    knn = PrivateMetricKNN(_learner(features=names), n_neighbors=3)
    for xi, yi in zip(X, y, strict=True):
        rec = dict(zip(names, xi, strict=True))
        pipe.learn_one(rec, yi)
        knn.learn_one(rec, yi)
    assert set(pipe.transform_one(dict(zip(names, a, strict=True)))) == set(names)
    assert knn.predict_one(dict(zip(names, a, strict=True))) in {"a", "b"}


def test_when_the_noise_wins_the_release_stays_near_euclidean() -> None:
    # ε = 0.05 on 200 records: the release is the identity plus noise at a quarter of D.
    X, y = _stream(4, 200, 5)
    m = _learner(n=200, d=5, epsilon=0.05, buffer=None)
    m.learn_many(X, y)
    w = m.private_weights
    cos = float(w @ np.ones(5)) / (np.linalg.norm(w) * math.sqrt(5))
    assert cos > 0.9
