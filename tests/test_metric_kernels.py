"""The metric learner's compiled linear algebra, on both backends.

The compiled path decomposes symmetric matrices with its own eigensolver (Householder + implicit
QL, :func:`stream_dp.linalg._eigh_ql`), the reference with LAPACK ``dsyevd``; the release is the
Euclidean projection onto ``{W ⪰ 0, ‖W‖_F ≤ D}`` either way, so the two agree to rounding. The
noise blocks are NumPy's standard normals on both backends, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp import _jit, constraints, linalg
from stream_dp.linalg import psd_sqrt, sqrt_factors, sqrt_from_eigh
from stream_dp.online import OnPairStrC
from stream_dp.privacy import noise as noise_mod
from stream_dp.privacy.noise import KeyedNoise, rows_per_block
from stream_dp.privacy.secrets import derive_key

__all__: list[str] = []

needs_numba = pytest.mark.skipif(not _jit.NUMBA_INSTALLED, reason="numba is not installed")


def _symmetric_cases(rng: np.random.Generator, d: int) -> list[np.ndarray]:
    """Random, rank-deficient, zero, repeated-eigenvalue, badly scaled and graded matrices."""
    A = rng.normal(size=(d, d))
    B = rng.normal(size=(d, max(1, d // 3)))
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    repeated = (Q * rng.choice([-1.0, 0.0, 2.0], size=d)) @ Q.T
    graded = np.diag(10.0 ** -np.arange(d, dtype=float)) + 1e-3 * (A + A.T)
    return [
        13.0 * (A + A.T),
        B @ B.T,  # PSD, rank d/3
        -(B @ B.T),  # NSD: projects to 0
        np.zeros((d, d)),
        np.diag(rng.integers(-2, 3, size=d).astype(float)),
        0.5 * (repeated + repeated.T),
        1e-200 * (A + A.T),
        1e150 * (A + A.T),
        0.5 * (graded + graded.T),
    ]


def _reference_projection(S: np.ndarray, radius: float) -> np.ndarray:
    lam, V = np.linalg.eigh(S)
    lam = np.maximum(lam, 0.0)
    norm = np.linalg.norm(lam)
    if norm > radius:
        lam *= radius / norm
    return (V * lam) @ V.T


@needs_numba
@pytest.mark.parametrize("d", [1, 2, 3, 5, 8, 32])
def test_compiled_eigensolver_is_an_eigendecomposition(d: int) -> None:
    rng = np.random.default_rng(100 + d)
    for S in _symmetric_cases(rng, d):
        lam, V = linalg._eigh_ql_compiled(S)
        scale = max(float(np.abs(S).max()), np.finfo(float).tiny)
        tol = 50 * d * np.finfo(float).eps * scale
        assert np.all(np.diff(lam) >= 0.0)  # ascending, as np.linalg.eigh
        np.testing.assert_allclose(lam, np.linalg.eigvalsh(S), rtol=0, atol=tol)
        np.testing.assert_allclose(V.T @ V, np.eye(d), rtol=0, atol=50 * d * np.finfo(float).eps)
        np.testing.assert_allclose((V * lam) @ V.T, S, rtol=0, atol=tol)
        assert V.flags.c_contiguous


# One compiled (and cached) kernel for every case: a new dispatcher per case compiles again.
_compiled_projection = _jit.njit(constraints.project_psd_frobenius)


@pytest.mark.parametrize("numba", [False, True])
@pytest.mark.parametrize("d", [4, 32])
def test_psd_projection_is_the_euclidean_projection_on_both_backends(d: int, numba: bool) -> None:
    project = constraints.project_psd_frobenius
    if numba and _jit.NUMBA_INSTALLED:
        project = _compiled_projection
    rng = np.random.default_rng(7 * d)
    radius = 1.0
    cases = [S / np.abs(S).max() if np.abs(S).max() > 0 else S for S in _symmetric_cases(rng, d)]
    B = rng.normal(size=(d, d))
    inside = B @ B.T
    cases += [0.5 * inside / np.linalg.norm(inside), 3.0 * inside / np.linalg.norm(inside)]
    cases += [0.01 * rng.normal(size=(d, d))]  # not symmetric: symmetrised first
    for S in cases:
        w = S.reshape(-1).copy()
        lam_out, V_out = np.full(d, np.nan), np.full((d, d), np.nan)
        has_factors = project(w, d, radius, lam_out, V_out)
        P = w.reshape(d, d)
        ref = _reference_projection(0.5 * (S + S.T), radius)
        np.testing.assert_allclose(P, ref, rtol=0, atol=1e-12)
        assert np.array_equal(P, P.T)
        # Optimality of the Euclidean projection onto a convex set: ⟨S − P, Q − P⟩ ≤ 0 for
        # every Q in the set (checked on random members and on 0).
        Ssym = 0.5 * (S + S.T)
        for _ in range(20):
            C = rng.normal(size=(d, d))
            Q = C @ C.T
            Q *= rng.uniform(0.0, radius) / np.linalg.norm(Q)
            assert np.sum((Ssym - P) * (Q - P)) <= 1e-12 * max(1.0, np.abs(Ssym).max())
        assert np.sum((Ssym - P) * (0.0 - P)) <= 1e-12 * max(1.0, np.abs(Ssym).max())
        if has_factors:  # the eigenpairs handed to the transform are those of the result
            assert np.all(lam_out >= 0.0) and np.all(np.diff(lam_out) >= 0.0)
            np.testing.assert_allclose((V_out * lam_out) @ V_out.T, P, rtol=0, atol=1e-12)


def test_square_root_from_factors_is_the_square_root() -> None:
    rng = np.random.default_rng(3)
    for d in (1, 4, 32):
        for S in _symmetric_cases(rng, d)[:6]:
            P = _reference_projection(S / max(1.0, np.abs(S).max()), 1.0)
            lam, V = np.linalg.eigh(P)
            L, R = sqrt_factors(lam, V)
            root = sqrt_from_eigh(lam, V)
            np.testing.assert_allclose(L @ R, root, rtol=0, atol=1e-15)
            np.testing.assert_allclose(root @ root, P, rtol=0, atol=1e-12)
            np.testing.assert_allclose(psd_sqrt(P), root, rtol=0, atol=1e-7)  # cut at rounding
            x = rng.normal(size=d)
            np.testing.assert_allclose(L @ (R @ x), root @ x, rtol=0, atol=1e-14)


def test_root_factors_are_the_same_on_both_backends() -> None:
    rng = np.random.default_rng(4)
    for d in (1, 3, 32):
        for S in _symmetric_cases(rng, d)[:6]:
            lam, V = np.linalg.eigh(_reference_projection(S / max(1.0, np.abs(S).max()), 1.0))
            x = rng.normal(size=d)
            for Vx in (V, np.ascontiguousarray(V)):  # LAPACK's layout and the kernel's
                with _jit.use_numba(False):
                    L0, R0 = sqrt_factors(lam, Vx)
                with _jit.use_numba(True):
                    L1, R1 = sqrt_factors(lam, Vx)
                assert L0.tobytes() == L1.tobytes() and R0.tobytes() == R1.tobytes()
                if linalg._compiled_root() is not None:
                    y = linalg._compiled_root()[1](L1, R1, x)
                    np.testing.assert_allclose(y, L0 @ (R0 @ x), rtol=0, atol=1e-14)


def test_compiled_noise_blocks_are_numpys_bit_for_bit() -> None:
    if _jit.NUMBA_INSTALLED:
        assert noise_mod._compiled_fill() is not None
    for size in (3, 32, 64 * 64, 32 * 32):
        B = rows_per_block(size)
        steps = [0, 1, B - 1, B, 5 * B + 3]
        for purpose in ("release", "warmup"):
            with _jit.use_numba(True):
                fast = [KeyedNoise(secret=21, model_id="q").standard_row(t, size, purpose)
                        for t in steps]  # fmt: skip
            with _jit.use_numba(False):
                ref = [KeyedNoise(secret=21, model_id="q").standard_row(t, size, purpose)
                       for t in steps]  # fmt: skip
            for a, b in zip(fast, ref, strict=True):
                assert a.tobytes() == b.tobytes()
    # and both are NumPy's own standard normals for the block's Philox stream
    noise = KeyedNoise(secret=21, model_id="q")
    counter = np.array([0, 0, 1, 1], dtype=np.uint64)  # block 1, the blocked lane
    key = derive_key(21, "release", "q")
    gen = np.random.Generator(np.random.Philox(key=key, counter=counter))
    expected = gen.standard_normal((rows_per_block(1024), 1024))
    with _jit.use_numba(True):
        got = noise.standard_row(rows_per_block(1024) + 2, 1024)
    assert got.tobytes() == expected[2].tobytes()


def _run(numba: bool, X: np.ndarray, y: np.ndarray, batched: bool):
    names = tuple(f"f{i:02d}" for i in range(X.shape[1]))
    with _jit.use_numba(numba):
        m = OnPairStrC(
            task="metric", epsilon=1.0, delta=1e-5, horizon=None, alpha=1.0, warmup=10,
            buffer="fifo:64", release_every=1, seed=2026, reproducible=True, features=names,
            predict_with="release",
        )  # fmt: skip
        releases, transforms = [], []
        if batched:
            for a in range(0, len(y), 37):
                m.learn_many(X[a : a + 37], y[a : a + 37])
                releases.append(m.private_weights)
        else:
            for x, label in zip(X, y, strict=True):
                m.learn_one(dict(zip(names, x, strict=True)), label)
                releases.append(m.private_weights)
                transforms.append(m.transform_one(dict(zip(names, x, strict=True))))
        return m, releases, transforms


@pytest.mark.parametrize("batched", [False, True])
def test_metric_learner_at_d32_is_the_same_on_both_backends(batched: bool) -> None:
    rng = np.random.default_rng(5)
    X = 0.8 * rng.normal(size=(150, 32)) / np.sqrt(32)
    y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.1, 0.1])
    ref, ref_rel, ref_tr = _run(False, X, y, batched=False)
    got, got_rel, got_tr = _run(True, X, y, batched=batched)
    assert got.accountant.ledger == ref.accountant.ledger  # bit for bit
    assert got.last_sigma == ref.last_sigma
    np.testing.assert_allclose(got.state_dict()["w"], ref.state_dict()["w"], rtol=0, atol=1e-12)
    if not batched:
        for a, b in zip(got_rel, ref_rel, strict=True):
            if b is None:
                assert a is None
            else:
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
        for a, b in zip(got_tr, ref_tr, strict=True):
            np.testing.assert_allclose(list(a.values()), list(b.values()), rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.private_weights, ref.private_weights, rtol=0, atol=1e-12)
    x = dict(zip(got.feature_names, X[0], strict=True))
    root = psd_sqrt(ref.private_weights)
    v = got._model_input(x)
    np.testing.assert_allclose(list(got.transform_one(x).values()), root @ v, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.regret.cumulative, ref.regret.cumulative, rtol=1e-12)
