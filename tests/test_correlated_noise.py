"""Keyed correlated noise: blocks equal single steps, replays are exact, the covariance is σ²MMᵀ."""

from __future__ import annotations

import numpy as np
import pytest
from mf_reference import MFReference

from stream_dp import _jit
from stream_dp.privacy.blt import BLT
from stream_dp.privacy.correlated_noise import CorrelatedNoise, blt_rows, standard_rows
from stream_dp.privacy.factorizations import BinaryTree, Independent, SqrtToeplitz
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.records import clip_norm

FACTORIZATIONS = [BLT.fit(200), BinaryTree(), Independent(), SqrtToeplitz()]


def _rows(factorization, secret: int, size: int, n: int, blocks=None) -> np.ndarray:
    noise = CorrelatedNoise(factorization, KeyedNoise(secret, "m"), size)
    if blocks is None:
        return noise.next_rows(n)
    return np.concatenate([noise.next_rows(m) for m in blocks])


@pytest.mark.parametrize("factorization", FACTORIZATIONS, ids=lambda f: f.name)
def test_blocks_are_bit_identical_to_single_steps(factorization) -> None:
    blocks = _rows(factorization, 11, 5, 0, blocks=[1, 7, 64, 1, 50, 3])
    single = _rows(factorization, 11, 5, 0, blocks=[1] * len(blocks))
    np.testing.assert_array_equal(blocks, single)
    np.testing.assert_array_equal(blocks, _rows(factorization, 11, 5, len(blocks)))


def test_tree_rows_drawn_in_chunks_are_the_single_steps() -> None:
    """The tree draws its node rows a chunk of steps at a time (2 · size values per step at
    most 2²⁰): at 32 768 values per row (still drawn in keyed blocks) 40 steps are three chunks."""
    blocks = _rows(BinaryTree(), 11, 32_768, 0, blocks=[40])
    np.testing.assert_array_equal(blocks, _rows(BinaryTree(), 11, 32_768, 0, blocks=[1] * 40))


@pytest.mark.parametrize("factorization", FACTORIZATIONS, ids=lambda f: f.name)
def test_rows_are_the_noise_matrix_times_keyed_standard_rows(factorization) -> None:
    n, size = 40, 3
    rows = _rows(factorization, 5, size, n)
    keyed = KeyedNoise(5, "m")
    if isinstance(factorization, BinaryTree):
        keys = [(q << 6) | lv for lv, q in factorization.nodes(n)]
        Z = standard_rows(keyed, np.array(keys), size, "gradient")
    else:
        Z = standard_rows(keyed, np.arange(1, n + 1), size, "gradient")
    np.testing.assert_allclose(rows, factorization.noise_matrix(n) @ Z, atol=1e-12)
    # Z_t is the keyed standard row of step t: a pure function of (secret, model id, t).
    np.testing.assert_array_equal(
        standard_rows(keyed, np.array([7]), size, "gradient")[0],
        keyed.standard_row(7, size, "gradient"),
    )
    assert not np.array_equal(rows, _rows(factorization, 6, size, n))


def test_large_rows_are_drawn_per_step() -> None:
    keyed = KeyedNoise(3, "m")
    rows = standard_rows(keyed, np.array([4, 9]), 40_000, "gradient")
    np.testing.assert_array_equal(rows[1], keyed.generator(9, "gradient").standard_normal(40_000))


@pytest.mark.skipif(not _jit.NUMBA_INSTALLED, reason="numba is not installed")
def test_compiled_and_numpy_recurrences_are_bit_identical() -> None:
    blt = BLT.fit(10**6)
    rng = np.random.default_rng(0)
    Z, R = rng.normal(size=(700, 33)), rng.normal(size=(blt.buffers, 33))
    a = blt_rows(Z, R, blt.lam, blt.beta, compiled=False)
    b = blt_rows(Z, R, blt.lam, blt.beta, compiled=True)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    with _jit.use_numba(False):
        numpy_rows = _rows(blt, 2, 6, 300)
    np.testing.assert_array_equal(numpy_rows, _rows(blt, 2, 6, 300))


@pytest.mark.parametrize("factorization", FACTORIZATIONS, ids=lambda f: f.name)
def test_state_inside_a_block_replays_identical_rows(factorization) -> None:
    noise = CorrelatedNoise(factorization, KeyedNoise(9, "m"), 4)
    noise.next_rows(30)
    block = noise.next_rows(64)  # steps 31 … 94
    for at in (31, 50, 94, 95):
        state = noise.state_dict(at=at)
        replay = CorrelatedNoise(factorization, KeyedNoise(9, "m"), 4)
        replay.load_state_dict(state)
        got = replay.next_rows(95 - at) if at < 95 else np.zeros((0, 4))
        np.testing.assert_array_equal(got, block[at - 31 :])
    if isinstance(factorization, BLT):
        with pytest.raises(ValueError, match="outside the last block"):
            noise.state_dict(at=20)
    other = CorrelatedNoise(factorization, KeyedNoise(9, "m"), 5)
    with pytest.raises(ValueError):
        other.load_state_dict(noise.state_dict())


def _whitened(samples: np.ndarray, sigma: float, M: np.ndarray) -> np.ndarray:
    """Samples (secrets, n, p) mapped by M⁻¹/σ: i.i.d. N(0, 1) iff the covariance is σ²MMᵀ."""
    return np.einsum("ts,ksp->ktp", np.linalg.inv(M), samples) / sigma


def covariance_matches(samples: np.ndarray, sigma: float, M: np.ndarray) -> bool:
    """Is the empirical covariance of ``samples`` (over secrets and coordinates) σ²MMᵀ?

    Four checks, with tolerances of about six standard errors for 400 secrets × 48 steps × 4
    coordinates: the whitened values have variance 1 (±0.03) and lag-1 correlation 0 (±0.02);
    the empirical n × n covariance has the trace of σ²MMᵀ (±5 %) and is within 30 % of it in
    Frobenius norm (the sampling error of a 48 × 48 covariance from 1 600 rows is ~17 %).
    """
    X = _whitened(samples, sigma, M)
    variance_ok = abs(float(np.mean(X**2)) - 1.0) < 0.03
    lag_ok = abs(float(np.mean(X[:, 1:] * X[:, :-1]))) < 0.02
    return variance_ok and lag_ok and _empirical_covariance_close(samples, sigma, M)


def _empirical_covariance_close(samples: np.ndarray, sigma: float, M: np.ndarray) -> bool:
    K_hat = np.einsum("ktp,ksp->ts", samples, samples) / (samples.shape[0] * samples.shape[2])
    K = sigma**2 * M @ M.T
    trace_ok = abs(np.trace(K_hat) / np.trace(K) - 1.0) < 0.05
    return trace_ok and np.linalg.norm(K_hat - K) / np.linalg.norm(K) < 0.30


@pytest.mark.slow
@pytest.mark.parametrize("factorization", FACTORIZATIONS, ids=lambda f: f.name)
def test_calibration_covariance_over_400_secrets(factorization) -> None:
    n, size, sigma, secrets = 48, 4, 2.5, 400
    samples = np.stack([sigma * _rows(factorization, s, size, n) for s in range(secrets)])
    M = factorization.noise_matrix(n)
    if isinstance(factorization, BinaryTree):  # M is not square (Z lives on the nodes)
        assert _empirical_covariance_close(samples, sigma, M)
        assert not _empirical_covariance_close(samples / 2, sigma, M)  # σ/2 fails
        return
    assert covariance_matches(samples, sigma, M)
    assert not covariance_matches(samples / 2, sigma, M)  # the test fails for σ/2


def test_the_learner_injects_exactly_sigma_times_the_correlated_rows() -> None:
    # With a model ball too large to project, w_{t−1} − w_t = η·(g_t + σ·(M·Z)_t): recover the
    # injected noise from the iterates and compare it with σ·(M·Z) for the learner's own secret.
    rng = np.random.default_rng(3)
    n, d = 60, 3
    X, y = rng.normal(size=(n, d)) / 2, rng.random(n) < 0.4

    def learner() -> MFReference:
        return MFReference(
            "auc", horizon=n, epsilon=2.0, window=8, model_radius=1e9, step_size=1e-3,
            seed=21, reproducible=True, model_id="m",
        )  # fmt: skip

    m, twin = learner(), learner()
    injected = []
    for xi, yi in zip(X, y, strict=True):
        xc = clip_norm(np.asarray(xi, dtype=float), m.R)
        if m.w is None:
            m._bind(d)
        w_prev = m.w.copy()
        g = m.gradient(w_prev, xc, 1.0 if yi else -1.0)  # the buffer as learn_one will see it
        m.learn_one(xi, yi)
        injected.append((w_prev - m.w) / m.eta - g)
        twin.learn_one(xi, yi)
    expected = m.mechanism.sigma * _rows(m.mechanism.factorization, 21, d, n)
    np.testing.assert_allclose(np.array(injected), expected, rtol=0, atol=1e-6 * m.mechanism.sigma)
    np.testing.assert_array_equal(m.w, twin.w)  # same secret, same stream: bit-identical
