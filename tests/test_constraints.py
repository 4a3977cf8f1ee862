"""Constraint sets: the projections are exact, non-expansive, and land in the set.

Each projection agrees to 1e-6 with a brute-force convex
solve, for the L2 ball, PSD ∩ Frobenius ball and PSD ∩ nuclear ball, at small d (2–4).

The brute-force solvers are chosen so that they do not rely on what they check:

* L2 ball: SLSQP on ``min ‖w − a‖²`` s.t. ``‖w‖² ≤ D²`` (smooth, convex), several random starts.
* PSD ∩ ball: Dykstra's alternating-projection algorithm over the two *separate* sets (PSD cone
  by eigenvalue clipping; Frobenius ball by scaling, or the half-space ``tr W ≤ D`` for the
  nuclear ball, since ``‖W‖_{S1} = tr W`` on the cone). Dykstra provably converges to the
  projection onto the intersection of closed convex sets, so it checks the claim "PSD first,
  then the ball, is exact" and the simplex step of the nuclear projection independently.
  (SLSQP with ``eigvalsh(W) ≥ 0`` constraints was tried: the constraint is non-smooth exactly
  where PSD projections land — repeated zero eigenvalues — and it stalls at ~1e-4.)
* A solver-free certificate as well: P = Π_C(A) iff ``⟨A − P, Z − P⟩ ≤ 0`` for every Z ∈ C.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize

from stream_dp.constraints import (
    ConstraintSet,
    L2Ball,
    PSDFrobeniusBall,
    PSDNuclearBall,
    project_simplex_leq,
)

__all__: list[str] = []

DIMS = [2, 3, 4]


def _psd_cone(W: np.ndarray) -> np.ndarray:
    lam, V = np.linalg.eigh(0.5 * (W + W.T))
    return (V * np.maximum(lam, 0.0)) @ V.T


def _frobenius_ball(radius: float):
    def proj(W: np.ndarray) -> np.ndarray:
        n = np.linalg.norm(W)
        return W if n <= radius else W * (radius / n)

    return proj


def _trace_halfspace(radius: float):
    def proj(W: np.ndarray) -> np.ndarray:
        excess = np.trace(W) - radius
        return W if excess <= 0 else W - (excess / W.shape[0]) * np.eye(W.shape[0])

    return proj


def _dykstra(S: np.ndarray, proj_a, proj_b, tol: float = 1e-14) -> np.ndarray:
    x, p, q = S.copy(), np.zeros_like(S), np.zeros_like(S)
    for _ in range(100_000):
        y = proj_a(x + p)
        p = x + p - y
        x_new = proj_b(y + q)
        q = y + q - x_new
        if np.linalg.norm(x_new - x) < tol and np.linalg.norm(x_new - y) < tol:
            return x_new
        x = x_new
    raise AssertionError("Dykstra did not converge")  # pragma: no cover


def _random_matrices(rng: np.random.Generator, d: int, n: int) -> list[np.ndarray]:
    """Unsymmetric matrices at several scales: inside the set, outside it, indefinite."""
    return [rng.normal(size=(d, d)) * s for s in (0.1, 0.5, 1.0, 3.0) for _ in range(n)]


@pytest.mark.parametrize("d", DIMS)
def test_l2_ball_matches_slsqp(d: int) -> None:
    rng = np.random.default_rng(d)
    ball = L2Ball(1.3)
    for a in (rng.normal(size=d) * s for s in (0.2, 1.0, 4.0) for _ in range(4)):
        best = None
        for _ in range(3):
            res = optimize.minimize(
                lambda w, a=a: float(np.sum((w - a) ** 2)),
                rng.normal(size=d) * 0.3,
                jac=lambda w, a=a: 2 * (w - a),
                method="SLSQP",
                constraints=[
                    {"type": "ineq", "fun": lambda w: 1.3**2 - w @ w, "jac": lambda w: -2 * w}
                ],
                options={"ftol": 1e-15, "maxiter": 500},
            )
            if best is None or res.fun < best.fun:
                best = res
        np.testing.assert_allclose(ball.project(a), best.x, atol=1e-6)


@pytest.mark.parametrize("d", DIMS)
def test_psd_frobenius_projection_matches_dykstra(d: int) -> None:
    rng = np.random.default_rng(10 + d)
    C = PSDFrobeniusBall(1.2)
    for A in _random_matrices(rng, d, 3):
        brute = _dykstra(0.5 * (A + A.T), _psd_cone, _frobenius_ball(1.2))
        np.testing.assert_allclose(C.project(A), brute, atol=1e-6)


@pytest.mark.parametrize("d", DIMS)
def test_psd_nuclear_projection_matches_dykstra(d: int) -> None:
    rng = np.random.default_rng(20 + d)
    C = PSDNuclearBall(1.2)
    for A in _random_matrices(rng, d, 3):
        brute = _dykstra(0.5 * (A + A.T), _psd_cone, _trace_halfspace(1.2))
        np.testing.assert_allclose(C.project(A), brute, atol=1e-6)


def test_the_reverse_order_is_not_the_projection() -> None:
    # Sanity of the brute-force check: ball first, then the cone, is *not* exact in general
    # (an indefinite matrix scaled into the ball loses mass when its negative part is cut),
    # and the Dykstra solver tells the two orders apart.
    A = np.diag([3.0, -3.0])
    brute = _dykstra(A, _psd_cone, _frobenius_ball(1.0))
    wrong = _psd_cone(_frobenius_ball(1.0)(A))
    assert np.linalg.norm(wrong - brute) > 0.1
    np.testing.assert_allclose(PSDFrobeniusBall(1.0).project(A), brute, atol=1e-9)


def _sets(d: int) -> list[tuple[ConstraintSet, tuple[int, ...]]]:
    return [
        (L2Ball(0.9), (d,)),
        (L2Ball(0.9), (d, d)),  # the Frobenius ball of matrices, used with a vector shape too
        (PSDFrobeniusBall(0.9), (d, d)),
        (PSDNuclearBall(0.9), (d, d)),
    ]


@pytest.mark.parametrize("d", DIMS)
def test_variational_inequality_certifies_optimality(d: int) -> None:
    rng = np.random.default_rng(30 + d)
    for C, shape in _sets(d):
        Zs = [C.sample(rng, shape) for _ in range(200)]
        for A in (rng.normal(size=shape) * s for s in (0.3, 2.0) for _ in range(3)):
            P = C.project(A)
            assert C.contains(P)
            # Only the symmetric part of A matters for symmetric Z and P.
            G = A - P
            worst = max(float(np.sum(G * (Z - P))) for Z in Zs)
            assert worst <= 1e-9


@pytest.mark.parametrize("d", DIMS)
def test_projections_are_non_expansive_and_idempotent(d: int) -> None:
    rng = np.random.default_rng(40 + d)
    for C, shape in _sets(d):
        for _ in range(100):
            a, b = rng.normal(size=shape) * 2, rng.normal(size=shape) * 2
            pa, pb = C.project(a), C.project(b)
            assert np.linalg.norm(pa - pb) <= np.linalg.norm(a - b) * (1 + 1e-12)
            np.testing.assert_allclose(C.project(pa), pa, atol=1e-12)


@pytest.mark.parametrize("d", DIMS)
def test_samples_lie_in_the_set_and_diameter_bounds_distances(d: int) -> None:
    rng = np.random.default_rng(50 + d)
    for C, shape in _sets(d):
        pts = [C.sample(rng, shape) for _ in range(100)]
        assert all(C.contains(p) for p in pts)
        far = max(np.linalg.norm(p - q) for p in pts[:30] for q in pts[30:60])
        assert far <= C.diameter
        assert C.max_norm == C.radius
    # The diameters are attained: antipodes of the ball; orthogonal rank-one matrices of norm D.
    ball = L2Ball(0.9)
    far_apart = ball.project(np.array([5.0, 0.0])) - ball.project(np.array([-5.0, 0.0]))
    assert np.linalg.norm(far_apart) == pytest.approx(ball.diameter)
    E1, E2 = np.diag([0.9, 0.0]), np.diag([0.0, 0.9])
    for C in (PSDFrobeniusBall(0.9), PSDNuclearBall(0.9)):
        assert C.contains(E1) and C.contains(E2)
        assert np.linalg.norm(E1 - E2) == pytest.approx(C.diameter)
        assert C.diameter == pytest.approx(math.sqrt(2) * 0.9)


def test_sample_depends_only_on_the_generator() -> None:
    for C, shape in _sets(3):
        a = C.sample(np.random.default_rng(7), shape)
        b = C.sample(np.random.default_rng(7), shape)
        np.testing.assert_array_equal(a, b)


def test_simplex_projection_matches_slsqp() -> None:
    rng = np.random.default_rng(60)
    for _ in range(20):
        n = int(rng.integers(2, 6))
        v, z = rng.normal(size=n) * 2, float(rng.uniform(0.2, 2.0))
        res = optimize.minimize(
            lambda x, v=v: float(np.sum((x - v) ** 2)),
            np.full(n, z / (2 * n)),
            jac=lambda x, v=v: 2 * (x - v),
            method="SLSQP",
            bounds=[(0, None)] * n,
            constraints=[
                {
                    "type": "ineq",
                    "fun": lambda x, z=z: z - x.sum(),
                    "jac": lambda x: -np.ones_like(x),
                }
            ],
            options={"ftol": 1e-15, "maxiter": 500},
        )
        np.testing.assert_allclose(project_simplex_leq(v, z), res.x, atol=1e-6)


@pytest.mark.parametrize("cls", [L2Ball, PSDFrobeniusBall, PSDNuclearBall])
@pytest.mark.parametrize("radius", [0.0, -1.0, math.inf, math.nan])
def test_invalid_radius_raises(cls, radius: float) -> None:
    with pytest.raises(ValueError):
        cls(radius)


def test_contains_rejects_points_outside() -> None:
    assert not L2Ball(1.0).contains(np.array([1.0, 0.1]))
    assert not PSDFrobeniusBall(1.0).contains(np.diag([0.5, -0.1]))
    assert not PSDFrobeniusBall(1.0).contains(np.array([[0.1, 0.2], [0.0, 0.1]]))
    assert not PSDNuclearBall(1.0).contains(np.diag([0.6, 0.6]))  # trace 1.2 > 1, Frobenius < 1
    assert PSDFrobeniusBall(1.0).contains(np.diag([0.6, 0.6]))
