"""Noise calibration: the ledger's σ_t is the schedule's (``docs/privacy.md``, *Accounting*),
the budget is never overrun, the release noise really has variance σ_t², and a step's release
is a pure function of (secret, step)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from stream_dp import _jit
from stream_dp.online import OnPairC, OnPairStrC
from stream_dp.privacy import (
    BudgetExhausted,
    DoubleCharge,
    GaussianEvent,
    KeyedNoise,
    budget_from_dict,
    gaussian_sigma_zcdp,
    rho_from_epsilon,
    zcdp_budget,
)

__all__: list[str] = []

R, D = 1.0, 1.0
EPS, DELTA = 1.0, 1e-5


def _stream(seed: int, n: int, d: int, task: str):
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=0.7, size=(n, d))
    y = rng.random(n) < 0.5 if task == "auc" else rng.integers(0, 3, size=n)
    return X, [bool(v) if task == "auc" else int(v) for v in y]


def _paper_rho(epsilon: float, delta: float) -> float:
    # The paper's conversion, written out: ρ = (√(ln(1/δ) + ε) − √(ln(1/δ)))².
    L = math.log(1 / delta)
    return (math.sqrt(L + epsilon) - math.sqrt(L)) ** 2


# --- σ_t against the formulas ------------------------------------------------------------------


@pytest.mark.parametrize("task", ["auc", "metric"])
@pytest.mark.parametrize("alg", [OnPairStrC, OnPairC])
def test_horizon_paper_sigma_matches_the_spec_formula(alg, task: str) -> None:
    n, alpha = 60, 2.0
    model = alg(
        release_every=1,
        task=task, epsilon=EPS, delta=DELTA, horizon=n, alpha=alpha, sensitivity="paper",
        conversion="paper", seed=1, reproducible=True, track_regret=False, features=3,
    )  # fmt: skip
    # G: AUC 4R, metric 4R²; OnPairStrC adds α·D, OnPairC α·diam(C) (docs/algorithms.md).
    G0 = 4 * R if task == "auc" else 4 * R**2
    diam = 2 * D if task == "auc" else math.sqrt(2) * D
    G = G0 + alpha * (D if alg is OnPairStrC else diam)
    L = (4 * R**2 if task == "auc" else 4 * R**4) + alpha
    T1 = max(math.ceil(16 * L / alpha**2), 7)
    assert model.T1 == T1
    rho = _paper_rho(EPS, DELTA)
    X, y = _stream(0, n, 3, task)
    for t in range(1, n + 1):
        model.learn_one(X[t - 1], y[t - 1])
        if t <= T1:
            assert model.last_sigma is None
            continue
        expected = 32 * G**2 * (n - T1) / (alpha**2 * t**2 * rho)
        # The schedule shaves shares by 1e-9 (so the ledger's float sum cannot overrun), which
        # changes σ² by 1e-9 relative.
        assert model.last_sigma**2 == pytest.approx(expected, rel=1e-8)
        event = model.accountant.ledger[-1]
        assert (event.step, event.sigma) == (t, model.last_sigma)
        assert event.sensitivity == pytest.approx(8 * G / (alpha * t), rel=1e-12)
    assert len(model.accountant.ledger) == n - T1


@pytest.mark.parametrize("p", [1.1, 1.5])
@pytest.mark.parametrize("buffer,release_every", [("all", 1), ("fifo:6", 3), ("reservoir:6", 2)])
def test_anytime_sigma_is_certified_sensitivity_over_root_two_rho_k(
    buffer: str, release_every: int, p: float
) -> None:
    model = OnPairStrC(
        task="auc",
        epsilon=EPS,
        delta=DELTA,
        horizon=None,
        alpha=1.0,
        buffer=buffer,
        warmup=8,
        anytime_p=p,
        release_every=release_every,
        seed=2,
        reproducible=True,
        track_regret=False,
        features=3,
    )
    rho = rho_from_epsilon(EPS, DELTA, model.conversion)  # the learner's accountant: exact
    zeta = float(special.zeta(p, 1))
    X, y = _stream(1, 70, 3, "auc")
    k = 0
    for t in range(1, 71):
        before = len(model.accountant.ledger)
        model.learn_one(X[t - 1], y[t - 1])
        if len(model.accountant.ledger) == before:
            continue
        k += 1
        assert t > 8 and (t - 8) % release_every == 0
        rho_k = rho * k ** (-p) / zeta
        delta_t = model.mechanism.tracker.current
        assert model.last_sensitivity == delta_t
        assert model.last_sigma == pytest.approx(delta_t / math.sqrt(2 * rho_k), rel=1e-8)
        assert model.accountant.cost(model.accountant.ledger[-1]) == pytest.approx(rho_k, rel=1e-8)
    assert k == (70 - 8) // release_every


@pytest.mark.parametrize("release_every", [1, 4])
def test_horizon_certified_sigma_splits_rho_over_the_releases(release_every: int) -> None:
    n = 50
    model = OnPairStrC(
        task="metric", epsilon=EPS, delta=DELTA, horizon=n, alpha=1.0, buffer="fifo:5",
        warmup=9, release_every=release_every, seed=3, reproducible=True, track_regret=False,
        features=3,
    )  # fmt: skip
    n_rel = math.ceil((n - 9) / release_every)
    rho = rho_from_epsilon(EPS, DELTA, model.conversion)  # the learner's accountant: exact
    X, y = _stream(2, n, 3, "metric")
    steps = []
    for t in range(1, n + 1):
        before = len(model.accountant.ledger)
        model.learn_one(X[t - 1], y[t - 1])
        if len(model.accountant.ledger) > before:
            steps.append(t)
            expected = model.mechanism.tracker.current / math.sqrt(2 * rho / n_rel)
            assert model.last_sigma == pytest.approx(expected, rel=1e-8)
    assert len(steps) == n_rel
    assert steps[-1] == n  # the horizon step always releases


# --- the budget ------------------------------------------------------------------------------


@pytest.mark.parametrize("conversion", ["tight", "paper"])
@pytest.mark.parametrize("release_every", [1, 7])
def test_budget_is_spent_by_the_horizon_and_never_overrun(
    conversion: str, release_every: int, quiet_exhaustion
) -> None:
    n = 40
    model = OnPairStrC(
        task="auc",
        epsilon=EPS,
        delta=DELTA,
        horizon=n,
        alpha=1.0,
        buffer="fifo:4",
        warmup=10,
        conversion=conversion,
        release_every=release_every,
        seed=4,
        reproducible=True,
        track_regret=False,
        features=3,
    )
    budget = model.budget.limit
    X, y = _stream(3, 2 * n, 3, "auc")
    for t in range(1, 2 * n + 1):
        model.learn_one(X[t - 1], y[t - 1])
        spent = math.fsum(map(model.accountant.cost, model.accountant.ledger))
        assert spent <= budget
        assert model.accountant.rho_spent() == spent  # spent() is the ledger's sum
        assert model.accountant.spent()[0] <= EPS
        if t == n:
            final_release = model.private_weights
            # The whole budget is used by the horizon (up to the schedule's 1e-9 shave).
            assert spent == pytest.approx(budget, rel=1e-8)
            assert not model.exhausted
    assert model.exhausted
    assert len(model.accountant.ledger) == math.ceil((n - 10) / release_every)
    np.testing.assert_array_equal(model.private_weights, final_release)
    assert model.step == n


def test_anytime_schedule_never_overruns_a_long_stream() -> None:
    model = OnPairStrC(
        release_every=1,
        task="auc",
        epsilon=0.5,
        delta=DELTA,
        alpha=1.0,
        buffer="fifo:4",
        warmup=5,
        seed=5,
        reproducible=True,
        anytime_p=1.01,
        track_regret=False,
        features=2,
    )
    X, y = _stream(4, 3000, 2, "auc")
    for t in range(3000):
        model.learn_one(X[t], y[t])
    assert math.fsum(map(model.accountant.cost, model.accountant.ledger)) < model.budget.limit
    assert not model.exhausted and len(model.accountant.ledger) == 3000 - 5


def test_ledger_refuses_overruns_and_double_charges() -> None:
    budget = zcdp_budget(epsilon=EPS, delta=DELTA)
    acc, limit = budget.accountant, budget.limit

    def event(step: int, share: float, sensitivity: float = 0.3) -> GaussianEvent:
        return GaussianEvent(step, sensitivity, gaussian_sigma_zcdp(sensitivity, share * limit))

    first = budget.charge(event(1, 0.6))
    assert budget.charge(event(1, 0.6)) == first and len(acc) == 1  # an identical replay: free
    with pytest.raises(DoubleCharge):
        budget.charge(event(1, 0.6, sensitivity=0.31))  # another release of a charged step
    with pytest.raises(BudgetExhausted):
        budget.charge(event(2, 0.5))
    assert acc.ledger == (first,)  # a refused charge leaves the ledger untouched
    budget.charge(event(2, 0.39))
    assert acc.rho_spent() <= limit and acc.spent()[0] <= EPS
    restored = budget_from_dict(budget.to_dict())
    assert restored.accountant.ledger == acc.ledger
    assert restored.accountant.rho_spent() == acc.rho_spent()
    # A hand-written ledger (the list-of-events form) that overruns its own budget.
    tampered = budget.to_dict()
    stored = {k: v for k, v in tampered["accountant"].items() if k != "columns"}
    stored["events"] = [e.to_dict() for e in (*acc.ledger, event(3, 0.5))]
    with pytest.raises(ValueError):
        budget_from_dict({**tampered, "accountant": stored})  # above its own budget: refused


def test_a_refused_release_exhausts_the_learner(quiet_exhaustion) -> None:
    # If the accountant refuses a release (here: its budget was mostly spent elsewhere), the
    # learner must not publish, must not charge, and keeps serving its last release.
    model = OnPairStrC(task="auc", epsilon=EPS, delta=DELTA, horizon=30, alpha=1.0, warmup=4,
                       buffer=4, seed=15, reproducible=True, track_regret=False,
                       features=3, release_every=1)  # fmt: skip
    rho = 0.999 * model.budget.limit
    model.budget.charge(GaussianEvent(0, 1.0, gaussian_sigma_zcdp(1.0, rho)))
    X, y = _stream(9, 10, 3, "auc")
    for t in range(4):
        model.learn_one(X[t], y[t])
    warmup_release = model.private_weights
    for t in range(4, 10):
        model.learn_one(X[t], y[t])
    assert model.exhausted and model.n_releases == 0
    assert len(model.accountant.ledger) == 1
    np.testing.assert_array_equal(model.private_weights, warmup_release)


@pytest.mark.parametrize("buffer", ["all", "fifo:5", "reservoir:5"])
def test_noise_plan_is_the_ledger_before_any_data(buffer: str) -> None:
    # σ_t depends only on steps, constants and (keyed) buffer membership: the plan computed
    # without data must be exactly what the run charges.
    kw = dict(task="auc", epsilon=EPS, delta=DELTA, horizon=40, alpha=1.0, buffer=buffer,
              warmup=6, release_every=3, seed=6, reproducible=True, track_regret=False,
              features=3)  # fmt: skip
    plan = OnPairStrC(**kw).noise_plan()
    model = OnPairStrC(**kw)
    X, y = _stream(5, 40, 3, "auc")
    for t in range(40):
        model.learn_one(X[t], y[t])
    acc = model.accountant
    got = [(e.step, e.sensitivity, e.sigma, acc.cost(e)) for e in acc.ledger]
    assert [(p["step"], p["sensitivity"], p["sigma"], p["rho"]) for p in plan] == got


# --- the noise itself -------------------------------------------------------------------------


@pytest.mark.slow
def test_release_noise_has_variance_sigma_squared_over_2000_seeds() -> None:
    # We measure the noise the learner actually added, release − w, which needs the final
    # projection to be inactive: a large model radius (D = 100) and a large ε keep
    # ‖w + noise‖ far below D, and the test asserts that for every seed (were the projection
    # active, the release would sit exactly on the sphere of radius D). This measures the real
    # release path rather than re-drawing KeyedNoise (which the next test ties to the release
    # bit for bit in the default, projected regime).
    n_seeds, d = 2000, 4
    X = np.array([[0.3, -0.2, 0.5, 0.1], [-0.4, 0.1, 0.0, 0.3], [0.2, 0.2, -0.6, 0.1]])
    y = [True, False, True]
    noises, sigmas = [], set()
    for seed in range(n_seeds):
        model = OnPairStrC(
            task="auc", epsilon=1000.0, delta=DELTA, horizon=3, warmup=2, alpha=1.0,
            model_radius=100.0, seed=seed, reproducible=True, track_regret=False, features=4,
        )  # fmt: skip
        for i in range(3):
            model.learn_one(X[i], y[i])
        release = model.private_weights
        assert np.linalg.norm(release) < 0.9 * 100.0  # Π_C was the identity
        noises.append(release - model.state_dict()["w"])
        sigmas.add(model.last_sigma)
    assert len(sigmas) == 1  # σ does not depend on the seed (nor on the data)
    sigma = sigmas.pop()
    z = np.concatenate(noises)
    assert z.size == n_seeds * d
    # 8000 draws: the sample variance has relative standard error √(2/8000) ≈ 1.6 %, so the 5 %
    # tolerance is > 3 standard errors; the mean's standard error is σ/√8000.
    assert z.var() == pytest.approx(sigma**2, rel=0.05)
    assert abs(z.mean()) < 4 * sigma / math.sqrt(z.size)
    # Coordinates and seeds are not correlated with each other (one lag, same tolerance logic).
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 4 / math.sqrt(z.size)


@pytest.mark.parametrize("numba", [False, True])
@pytest.mark.parametrize("task", ["auc", "metric"])
def test_release_is_projected_iterate_plus_keyed_noise_at_the_ledger_sigma(
    task: str, numba: bool
) -> None:
    with _jit.use_numba(numba):
        model = OnPairStrC(
            release_every=1,
            task=task, epsilon=EPS, delta=DELTA, horizon=30, alpha=1.0, warmup=5,
            buffer="fifo:5", seed=11, reproducible=True, model_id="m-7", track_regret=False,
            features=3,
        )  # fmt: skip
        keyed = KeyedNoise(secret=11, model_id="m-7")
        X, y = _stream(6, 30, 3, task)
        for t in range(1, 31):
            model.learn_one(X[t - 1], y[t - 1])
            if t <= 5:
                continue
            event = model.accountant.ledger[-1]
            w = model.state_dict()["w"]
            noise = keyed.gaussian(t, w.shape, event.sigma)
            expected = model.constraint.project(w + noise)  # NumPy code, LAPACK eigh
            if numba and task == "metric" and _jit.NUMBA_INSTALLED:
                # The compiled projection decomposes with its own eigensolver: the same exact
                # projection, rounded differently; any other noise would be off by far more.
                np.testing.assert_allclose(model.private_weights, expected, rtol=0, atol=1e-12)
            else:
                assert model.private_weights.tobytes() == expected.tobytes()


def test_noise_of_a_step_does_not_depend_on_the_data() -> None:
    # Two different streams, same secret: the noise added at each step is the same vector (the
    # number of draws never depends on the data). Projection kept inactive as above.
    def noises(seed_data: int) -> list[np.ndarray]:
        model = OnPairStrC(
            release_every=1,
            task="auc", epsilon=1000.0, delta=DELTA, horizon=12, warmup=2, alpha=1.0,
            model_radius=100.0, seed=9, reproducible=True, track_regret=False, features=3,
        )  # fmt: skip
        X, y = _stream(seed_data, 12, 3, "auc")
        out = []
        for t in range(12):
            model.learn_one(X[t] * (1 + 50 * seed_data), y[t])
            if t >= 2:
                assert np.linalg.norm(model.private_weights) < 90.0
                out.append(model.private_weights - model.state_dict()["w"])
        return out

    for a, b in zip(noises(0), noises(1), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


# --- replay: same secret, same step → the same release ----------------------------------------


@pytest.mark.parametrize("alg", [OnPairStrC, OnPairC])
@pytest.mark.parametrize("buffer", ["all", "reservoir:5"])
def test_same_seed_same_stream_gives_bit_identical_releases(alg, buffer: str) -> None:
    kw = dict(task="metric", epsilon=EPS, delta=DELTA, horizon=40, alpha=1.0, buffer=buffer,
              warmup=6, seed=12, reproducible=True, track_regret=False, features=3,
              release_every=1)  # fmt: skip
    a, b, other = alg(**kw), alg(**kw), alg(**{**kw, "seed": 13})
    X, y = _stream(7, 40, 3, "metric")
    differs = 0
    for t in range(40):
        for m in (a, b, other):
            m.learn_one(X[t], y[t])
        assert a.private_weights.tobytes() == b.private_weights.tobytes()
        differs += a.private_weights.tobytes() != other.private_weights.tobytes()
    assert differs == 40  # another secret: other warm-up models, other noise, every step
    assert a.accountant.ledger == b.accountant.ledger


@pytest.mark.parametrize("alg", [OnPairStrC, OnPairC])
@pytest.mark.parametrize("buffer", ["all", "fifo:5", "reservoir:5"])
def test_checkpoint_and_replay_reproduce_releases_and_ledger(alg, buffer: str) -> None:
    kw = dict(
        task="auc",
        epsilon=EPS,
        delta=DELTA,
        horizon=50,
        alpha=1.0,
        buffer=buffer,
        warmup=6,
        smoothing_window=3,
        seed=14,
        reproducible=True,
        track_regret=False,
        features=3,
    )
    X, y = _stream(8, 50, 3, "auc")
    original = alg(**kw)
    for t in range(20):
        original.learn_one(X[t], y[t])
    checkpoint = original.state_dict()
    releases = []
    for t in range(20, 50):
        original.learn_one(X[t], y[t])
        releases.append((original.private_weights.tobytes(), original.smoothed_weights.tobytes()))
    # A crash after step 20: a new process (constructed with another seed, which the checkpoint
    # overrides) restores and replays the uncommitted records 21..50.
    restored = alg(**{**kw, "seed": 999})
    restored.load_state_dict(checkpoint)
    for t in range(20, 50):
        restored.learn_one(X[t], y[t])
        pw, sw = releases[t - 20]
        assert restored.private_weights.tobytes() == pw
        assert restored.smoothed_weights.tobytes() == sw
    assert restored.accountant.ledger == original.accountant.ledger
    assert restored.accountant.rho_spent() == original.accountant.rho_spent()
    # Re-delivering an already charged release (same step, same event) costs nothing.
    for event in original.accountant.ledger:
        restored.budget.charge(event)
    assert restored.accountant.ledger == original.accountant.ledger
