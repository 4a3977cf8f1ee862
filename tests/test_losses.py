"""Pairwise losses: gradients, and the constants G and L the privacy proof relies on.

Finite-difference gradient checks for the four pairwise losses,
``Regularized`` and the contrastive per-pair gradients; on random clipped data, including
adversarial extreme-norm pairs, no per-pair gradient exceeds G and no gradient difference
exceeds ``L·‖w − w'‖``.
"""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.constraints import L2Ball, PSDFrobeniusBall
from stream_dp.losses import (
    ContrastiveLoss,
    HingeAUCLoss,
    HingeMetricLoss,
    LogisticAUCLoss,
    LogisticMetricLoss,
    PairwiseLoss,
    Regularized,
    get_loss,
)
from stream_dp.records import clip_norm

__all__: list[str] = []

D_DIM = 3
R = 0.8  # data radius; not 1 so that a wrong power of R in a constant would show
RADIUS = 1.5  # model radius D
FD_STEP = 1e-6
# Central differences have O(h²) truncation and O(ε_mach/h) rounding error: with h = 1e-6 and
# O(1) values both are ~1e-10, so 1e-6 absolute leaves four orders of margin.
FD_TOL = 1e-6


def _pairs(
    rng: np.random.Generator, task: str, n: int
) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """A new point x, its label, the buffer's labels Y and rows X (n rows), all clipped to R."""
    x = clip_norm(rng.normal(size=D_DIM), R)
    X = np.array([clip_norm(v, R) for v in rng.normal(size=(n, D_DIM))])
    if task == "auc":
        return x, 1.0, np.where(rng.random(n) < 0.5, 1.0, -1.0), X
    return x, 1.0, rng.integers(0, 3, size=n).astype(float), X


def _param(rng: np.random.Generator, task: str, scale: float = 0.5) -> np.ndarray:
    if task == "auc":
        return rng.normal(scale=scale, size=D_DIM)
    A = rng.normal(scale=scale, size=(D_DIM, D_DIM))
    return A @ A.T / D_DIM


def _fd_gradient(f, w: np.ndarray) -> np.ndarray:
    g = np.zeros_like(w)
    for idx in np.ndindex(w.shape):
        e = np.zeros_like(w)
        e[idx] = FD_STEP
        g[idx] = (f(w + e) - f(w - e)) / (2 * FD_STEP)
    return g


SMOOTH_LOSSES = [LogisticAUCLoss(), LogisticMetricLoss()]
HINGE_LOSSES = [HingeAUCLoss(), HingeMetricLoss()]


@pytest.mark.parametrize("loss", SMOOTH_LOSSES, ids=lambda v: type(v).__name__)
def test_smooth_losses_match_finite_differences(loss: PairwiseLoss) -> None:
    rng = np.random.default_rng(0)
    for _ in range(10):
        x, y, Y, X = _pairs(rng, loss.task, 12)
        w = _param(rng, loss.task)
        g = loss.gradient(w, x, y, X, Y)
        fd = _fd_gradient(lambda v, x=x, y=y, X=X, Y=Y: loss.value(v, x, y, X, Y), w)
        np.testing.assert_allclose(g, fd, atol=FD_TOL)


@pytest.mark.parametrize("loss", HINGE_LOSSES, ids=lambda v: type(v).__name__)
def test_hinge_losses_match_finite_differences_away_from_kinks(loss: PairwiseLoss) -> None:
    rng = np.random.default_rng(1)
    checked = 0
    for _ in range(30):
        x, y, Y, X = _pairs(rng, loss.task, 8)
        w = _param(rng, loss.task, scale=2.0)
        D, c = x - X, loss.pair_coefficients(y, Y)
        # The hinge is differentiable off its kink; stay 1e-3 away from it (≫ FD_STEP·‖D‖).
        if loss.task == "auc":
            margin = 1.0 - (c / 2.0) * (D @ w)
        else:
            margin = 1.0 + c * np.einsum("ij,jk,ik->i", D, w, D)
        if np.any(np.abs(margin) < 1e-3):
            continue
        g = loss.gradient(w, x, y, X, Y)
        fd = _fd_gradient(lambda v, x=x, y=y, X=X, Y=Y: loss.value(v, x, y, X, Y), w)
        np.testing.assert_allclose(g, fd, atol=FD_TOL)
        checked += 1
    assert checked >= 20  # the kink filter must not silently skip the whole test


@pytest.mark.parametrize("task", ["auc", "metric"])
def test_regularized_with_center_matches_finite_differences(task: str) -> None:
    rng = np.random.default_rng(2)
    w0 = _param(rng, task)
    loss = Regularized(get_loss(task), alpha=0.7, center=w0, center_radius=2 * RADIUS)
    for _ in range(5):
        x, y, Y, X = _pairs(rng, task, 10)
        w = _param(rng, task)
        g = loss.gradient(w, x, y, X, Y)
        fd = _fd_gradient(lambda v, x=x, y=y, X=X, Y=Y: loss.value(v, x, y, X, Y), w)
        np.testing.assert_allclose(g, fd, atol=FD_TOL)
        # The per-pair path (pair_values / pair_gradient_sum) carries the regulariser per pair.
        D, c = x - X, loss.pair_coefficients(y, Y)
        fd_sum = _fd_gradient(lambda v, D=D, c=c: float(loss.pair_values(v, D, c).sum()), w)
        np.testing.assert_allclose(loss.pair_gradient_sum(w, D, c), fd_sum, atol=10 * FD_TOL)


def test_contrastive_per_pair_gradients_match_finite_differences() -> None:
    rng = np.random.default_rng(3)
    loss = ContrastiveLoss(margin=1.0)
    d_out = 2
    for _ in range(5):
        W = rng.normal(scale=0.7, size=(d_out, D_DIM))
        D = rng.normal(scale=0.6, size=(8, D_DIM))
        y = (rng.random(8) < 0.5).astype(float)
        dist = np.linalg.norm(D @ W.T, axis=1)
        keep = np.abs(dist - loss.margin) > 1e-3  # off the margin's kink
        D, y = D[keep], y[keep]
        grads = loss.per_pair_gradients(W, D, y)
        assert grads.shape == (len(y), d_out, D_DIM)
        for k in range(len(y)):
            fd = _fd_gradient(
                lambda V, k=k, D=D, y=y: float(loss.pair_values(V, D[k : k + 1], y[k : k + 1])[0]),
                W,
            )
            np.testing.assert_allclose(grads[k], fd, atol=FD_TOL)


def test_contrastive_row_clipping_bounds_every_row() -> None:
    rng = np.random.default_rng(4)
    grads = rng.normal(scale=5.0, size=(50, 3, 4))
    clipped = ContrastiveLoss.clip_rows(grads, h=0.3)
    norms = np.linalg.norm(clipped, axis=2)
    assert norms.max() <= 0.3 * (1 + 1e-12)
    small = np.linalg.norm(grads, axis=2) <= 0.3
    np.testing.assert_array_equal(clipped[small], grads[small])  # short rows are untouched


@pytest.mark.parametrize("loss", SMOOTH_LOSSES + HINGE_LOSSES, ids=lambda v: type(v).__name__)
def test_buffer_gradient_is_the_mean_of_per_pair_gradients(loss: PairwiseLoss) -> None:
    rng = np.random.default_rng(5)
    x, y, Y, X = _pairs(rng, loss.task, 20)
    w = _param(rng, loss.task)
    D, c = x - X, loss.pair_coefficients(y, Y)
    one_by_one = [loss.pair_gradient_sum(w, D[k : k + 1], c[k : k + 1]) for k in range(20)]
    np.testing.assert_allclose(loss.gradient(w, x, y, X, Y), np.mean(one_by_one, axis=0))
    np.testing.assert_array_equal(loss.gradient(w, x, y, X[:0], Y[:0]), np.zeros_like(w))


def test_tied_auc_pairs_have_zero_gradient() -> None:
    rng = np.random.default_rng(6)
    for loss in (LogisticAUCLoss(), HingeAUCLoss()):
        X = rng.normal(size=(5, D_DIM))
        g = loss.gradient(rng.normal(size=D_DIM), rng.normal(size=D_DIM), 1.0, X, np.ones(5))
        np.testing.assert_array_equal(g, 0.0)


def test_constants_follow_the_documented_table() -> None:
    # The constants (G, L) written out with R and D (docs/algorithms.md), not read from the code.
    expected = {
        LogisticAUCLoss: (4 * R, 4 * R**2),
        LogisticMetricLoss: (4 * R**2, 4 * R**4),
        HingeAUCLoss: (2 * R, np.inf),
        HingeMetricLoss: (4 * R**2, np.inf),
    }
    for cls, (G, L) in expected.items():
        c = cls().constants(R, RADIUS)
        assert (c.lipschitz, c.smoothness, c.strong_convexity) == pytest.approx((G, L, 0.0))
        reg = Regularized(cls(), alpha=0.3).constants(R, RADIUS)
        assert reg.lipschitz == pytest.approx(G + 0.3 * RADIUS)
        assert reg.smoothness == pytest.approx(L + 0.3)
        assert reg.strong_convexity == pytest.approx(0.3)
        centred = Regularized(cls(), alpha=0.3, center_radius=2 * RADIUS).constants(R, RADIUS)
        assert centred.lipschitz == pytest.approx(G + 0.3 * 2 * RADIUS)


# --- G and L are never exceeded ---------------------------------------------------------------


def _extreme_pairs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Pair differences from raw records of huge norm (1e6·R), clipped as the learners do.

    After the clip every record has norm exactly R, and x' = −x gives ‖x − x'‖ = 2R: the
    largest difference clipped data allows.
    """
    raw = rng.normal(size=(n, D_DIM)) * 1e6 * R
    Xc = np.array([clip_norm(v, R) for v in raw])
    opposite = -Xc
    mixed = np.array([clip_norm(v, R) for v in rng.normal(size=(n, D_DIM)) * 1e6])
    return np.concatenate([Xc - opposite, Xc - mixed]), Xc


def _random_pairs(rng: np.random.Generator, n: int) -> np.ndarray:
    a = np.array([clip_norm(v, R) for v in rng.normal(scale=0.6, size=(n, D_DIM))])
    b = np.array([clip_norm(v, R) for v in rng.normal(scale=0.6, size=(n, D_DIM))])
    return a - b


def _params_in_set(rng: np.random.Generator, task: str, n: int, D: np.ndarray) -> list:
    """Random points of C, points on its boundary, and points aligned with the data (where
    |φ'| is largest)."""
    C = L2Ball(RADIUS) if task == "auc" else PSDFrobeniusBall(RADIUS)
    shape = (D_DIM,) if task == "auc" else (D_DIM, D_DIM)
    pts = [C.sample(rng, shape) for _ in range(n)]
    for k in range(n):
        u = D[k] / np.linalg.norm(D[k])
        pts.append(RADIUS * (u if task == "auc" else np.outer(u, u)))
        pts.append(-RADIUS * u if task == "auc" else np.zeros((D_DIM, D_DIM)))
    return pts


@pytest.mark.parametrize("loss", SMOOTH_LOSSES + HINGE_LOSSES, ids=lambda v: type(v).__name__)
def test_per_pair_gradients_never_exceed_G(loss: PairwiseLoss) -> None:
    rng = np.random.default_rng(7)
    ext, _ = _extreme_pairs(rng, 40)
    D = np.concatenate([ext, _random_pairs(rng, 80)])
    coefs = [2.0, -2.0] if loss.task == "auc" else [1.0, -1.0]
    G = loss.constants(R, RADIUS).lipschitz
    worst = 0.0
    for w in _params_in_set(rng, loss.task, 15, D):
        for c in coefs:
            cc = np.full(len(D), c)
            for k in range(len(D)):
                g = loss.pair_gradient_sum(w, D[k : k + 1], cc[k : k + 1])
                worst = max(worst, float(np.linalg.norm(g)))
    assert worst <= G * (1 + 1e-12)
    # The adversarial pairs really probe the constant (else the check above would be vacuous).
    assert worst >= 0.8 * G


@pytest.mark.parametrize("task", ["auc", "metric"])
def test_regularized_per_pair_gradients_never_exceed_G(task: str) -> None:
    rng = np.random.default_rng(8)
    C = L2Ball(RADIUS) if task == "auc" else PSDFrobeniusBall(RADIUS)
    shape = (D_DIM,) if task == "auc" else (D_DIM, D_DIM)
    w0 = C.sample(rng, shape)
    loss = Regularized(get_loss(task), alpha=0.9, center=w0, center_radius=C.diameter)
    G = loss.constants(R, RADIUS).lipschitz
    ext, _ = _extreme_pairs(rng, 30)
    D = np.concatenate([ext, _random_pairs(rng, 30)])
    c = np.full(len(D), 2.0 if task == "auc" else -1.0)
    worst = 0.0
    for w in _params_in_set(rng, task, 10, D) + [C.project(-10 * w0)]:
        for k in range(len(D)):
            g = loss.pair_gradient_sum(w, D[k : k + 1], c[k : k + 1])
            worst = max(worst, float(np.linalg.norm(g)))
    assert worst <= G * (1 + 1e-12)


@pytest.mark.parametrize("loss", SMOOTH_LOSSES, ids=lambda v: type(v).__name__)
def test_gradient_differences_never_exceed_L(loss: PairwiseLoss) -> None:
    rng = np.random.default_rng(9)
    L = loss.constants(R, RADIUS).smoothness
    ext, _ = _extreme_pairs(rng, 30)
    D = np.concatenate([ext, _random_pairs(rng, 60)])
    c_values = [2.0, -2.0] if loss.task == "auc" else [1.0, -1.0]
    worst = 0.0
    for k in range(len(D)):
        d = D[k : k + 1]
        u = D[k] / np.linalg.norm(D[k])
        # Random parameters, plus the adversarial spot where φ'' = 1/4 is reached: the argument
        # of φ at 0 and the perturbation along the pair's own direction.
        if loss.task == "auc":
            centre, direction = np.zeros(D_DIM), u
        else:
            q = float(D[k] @ D[k])
            centre, direction = np.outer(u, u) / q, np.outer(u, u)
        for c in c_values:
            cc = np.array([c])
            cand = [(_param(rng, loss.task), _param(rng, loss.task)) for _ in range(3)]
            cand += [(centre + s * direction, centre - s * direction) for s in (1e-4, 1e-2)]
            for w, v in cand:
                num = np.linalg.norm(
                    loss.pair_gradient_sum(w, d, cc) - loss.pair_gradient_sum(v, d, cc)
                )
                worst = max(worst, float(num / np.linalg.norm(w - v)))
    assert worst <= L * (1 + 1e-9)
    assert worst >= 0.9 * L  # the adversarial spot makes the check tight


def test_regularized_smoothness_adds_alpha() -> None:
    rng = np.random.default_rng(10)
    loss = Regularized(LogisticAUCLoss(), alpha=0.5)
    L = loss.constants(R, RADIUS).smoothness
    for _ in range(200):
        x, y, Y, X = _pairs(rng, "auc", 6)
        w, v = _param(rng, "auc"), _param(rng, "auc")
        diff = loss.gradient(w, x, y, X, Y) - loss.gradient(v, x, y, X, Y)
        assert np.linalg.norm(diff) <= L * np.linalg.norm(w - v) * (1 + 1e-9)
        # Strong convexity α: ⟨∇f(w) − ∇f(v), w − v⟩ ≥ α‖w − v‖².
        assert diff @ (w - v) >= 0.5 * np.sum((w - v) ** 2) * (1 - 1e-9)


def test_get_loss_rejects_unknown_names() -> None:
    with pytest.raises(ValueError):
        get_loss("auc", "squared")
    assert isinstance(get_loss("metric", "hinge"), HingeMetricLoss)
