"""OnPairMF: the learner core with correlated gradient noise.

Held against the plain-NumPy reference (``tests/mf_reference.py``) release by release; its one
charge made before step 1 and never again; the noise it injects calibrated
across secrets (a test that fails for σ/2); its gradient stream's sensitivity audited on
neighbouring streams; its checkpoints resumed exactly; its horizon honoured.
"""

from __future__ import annotations

import warnings

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp
from mf_reference import MFReference

from stream_dp.online import OnPairMF
from stream_dp.privacy.correlated_noise import CorrelatedNoise
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.records import clip_norm

__all__: list[str] = []


def _stream(seed: int, task: str, n: int, d: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=0.6, size=(n, d))
    if task == "auc":
        return X, X[:, 0] + 0.5 * rng.normal(size=n) > 0.3
    return X, np.where(X[:, 0] > 0, "a", np.where(X[:, 1] > 0, "b", "c"))


def _learner(task="auc", n=150, d=3, **kw) -> OnPairMF:
    params = dict(task=task, epsilon=2.0, horizon=n, buffer=8, features=d, seed=5,
                  reproducible=True)  # fmt: skip
    params.update(kw)
    return OnPairMF(**params)


@pytest.mark.parametrize("task", ["auc", "metric"])
@pytest.mark.parametrize("noise", ["blt", "tree", "independent"])
def test_releases_are_the_reference_learners(task: str, noise: str) -> None:
    n, d = 150, 3
    X, y = _stream(1, task, n, d)
    ours = _learner(task, n, d, noise=noise)
    ref = MFReference(task, horizon=n, epsilon=2.0, noise=noise, window=8, seed=5,
                      reproducible=True, model_id="onpairmf")  # fmt: skip
    for i in range(n):
        ours.learn_one(X[i], y[i])
        ref.learn_one(X[i], y[i])
        np.testing.assert_allclose(ours.private_weights, ref.weights, rtol=1e-10, atol=1e-12)
    assert ours.mf.sensitivity == ref.mechanism.sensitivity
    assert ours.mf.sigma == ref.mechanism.sigma
    assert ours.step_size_ == ref.eta
    assert ours.accountant.ledger == ref.accountant.ledger


def test_one_charge_before_the_first_step_and_a_release_at_every_step() -> None:
    X, y = _stream(2, "auc", 150, 3)
    m = _learner()
    assert len(m.accountant) == 0  # nothing is charged before data arrives
    m.learn_one(X[0], y[0])
    (event,) = m.accountant.ledger
    assert event.step == 1 and event.mechanism == "gaussian-correlated"
    assert m.accountant.cost(event) == pytest.approx(m.budget.limit, rel=1e-8)
    assert m.accountant.cost(event) <= m.budget.limit
    steps = []
    for i in range(1, 150):
        m.learn_one(X[i], y[i])
        steps.append(m.release_step)
    assert steps == list(range(2, 151))
    assert len(m.accountant) == 1 and m.n_releases == 150
    eps, delta = m.accountant.spent()
    assert eps <= 2.0 and delta == 1e-5
    # Google's dp-accounting composes the same Gaussian mechanism (noise multiplier σ/Δ, the
    # whole stream's one charge) to the same ε: exactly by its PLD accountant (the default
    # accounting is the exact Gaussian curve), and by RDP for the zCDP conversion.
    exact = pld.PLDAccountant(value_discretization_interval=1e-4)
    exact.compose(dp_accounting.GaussianDpEvent(event.sigma / event.sensitivity))
    assert eps == pytest.approx(exact.get_epsilon(1e-5), rel=1e-3)
    tight = _learner(conversion="tight")
    tight.learn_one(X[0], y[0])
    (event,) = tight.accountant.ledger
    theirs = rdp.RdpAccountant([1 + k / 20 for k in range(1, 400)] + list(range(21, 200)))
    theirs.compose(dp_accounting.GaussianDpEvent(event.sigma / event.sensitivity))
    assert tight.accountant.spent()[0] == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-3)


def test_the_horizon_ends_learning_and_the_last_release_is_served() -> None:
    X, y = _stream(3, "auc", 60, 3)
    m = _learner(n=50)
    m.learn_many(X[:50], y[:50])
    last = m.private_weights.copy()
    with pytest.warns(RuntimeWarning, match="horizon n=50"):
        m.learn_one(X[50], y[50])
    assert m.exhausted and m.step == 50 and m.n_rejected == 1
    np.testing.assert_array_equal(m.private_weights, last)
    assert len(m.accountant) == 1


def test_a_budget_that_cannot_pay_the_charge_learns_nothing() -> None:
    from stream_dp.privacy.events import GaussianEvent

    X, y = _stream(4, "auc", 20, 3)
    m = _learner(budget_share=0.5)
    m.budget.charge(GaussianEvent(1, 1.0, 1.0 / np.sqrt(2 * 0.6 * m.budget.limit)))
    with pytest.warns(RuntimeWarning, match="exhausted"):
        m.learn_one(X[0], y[0])
    assert m.step == 0 and m.private_weights is None
    assert [e.mechanism for e in m.accountant.ledger] == ["gaussian"]


def test_budget_share_charges_its_slice_under_the_correlated_name() -> None:
    X, y = _stream(5, "auc", 30, 3)
    m = _learner(budget_share=0.25)
    m.learn_many(X, y)
    (event,) = m.accountant.ledger
    assert event.mechanism == "gaussian-correlated"
    assert m.accountant.cost(event) == pytest.approx(0.25 * m.budget.limit, rel=1e-8)


@pytest.mark.parametrize("noise", ["blt", "tree"])
def test_resuming_a_checkpoint_continues_bit_for_bit(noise: str) -> None:
    n = 300
    X, y = _stream(6, "metric", n, 3)
    whole = _learner("metric", n, noise=noise)
    whole.learn_many(X, y)
    first = _learner("metric", n, noise=noise)
    first.learn_many(X[:137], y[:137])
    state = first.state_dict()
    resumed = _learner("metric", n, noise=noise, seed=999)  # the secret comes from the state
    resumed.load_state_dict(state)
    resumed.learn_many(X[137:], y[137:])
    np.testing.assert_array_equal(resumed.private_weights, whole.private_weights)
    assert resumed.accountant.ledger == whole.accountant.ledger  # no second charge


def test_a_checkpoint_of_another_budget_is_refused() -> None:
    X, y = _stream(7, "auc", 20, 3)
    m = _learner()
    m.learn_many(X, y)
    other = _learner(epsilon=1.0)
    with pytest.raises(ValueError, match="budget"):
        other.load_state_dict(m.state_dict())
    noise_free = _learner(epsilon=None)
    with pytest.raises(ValueError, match="privacy setting"):
        noise_free.load_state_dict(m.state_dict())


def test_noise_free_runs_charge_nothing_and_say_so() -> None:
    X, y = _stream(8, "auc", 100, 3)
    m = _learner(epsilon=None)
    m.learn_many(X, y)
    assert m.accountant is None and not m.private
    assert m.private_weights is not None
    assert "NOT PRIVATE" in m.describe()
    assert m.release_message()["epsilon_spent"] is None


def test_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="noise must be one of"):
        _learner(noise="sqrt-toeplitz")
    with pytest.raises(ValueError, match="needs noise='blt'"):
        _learner(n=None, noise="tree")
    with pytest.raises(ValueError, match="buffer"):
        _learner(buffer=0)
    with pytest.raises(ValueError, match="averaging"):
        _learner(averaging=-1.0)
    with pytest.raises(ValueError, match="reproducible"):
        OnPairMF(epsilon=1.0, horizon=10, features=2, seed=3)


def test_the_rules_never_read_data() -> None:
    a, b = _learner(), _learner()
    X, y = _stream(9, "auc", 150, 3)
    b.learn_many(X, y)
    assert (a.step_size_, a.window, a.mf.sensitivity, a.mf.sigma) == (
        b.step_size_, b.window, b.mf.sensitivity, b.mf.sigma,
    )  # fmt: skip
    plan = a.noise_plan()
    assert plan[0]["sigma"] == a.mf.sigma and plan[0]["mechanism"] == "gaussian-correlated"
    assert [p["step"] for p in plan[1:]] == [1, 37, 75, 150]


# -- calibration: the noise the learner injects ---------------------------------------------------


_UNPROJECTED = dict(model_radius=1e9, step_size=1.0, averaging=None)


def _injected_prefix_sums(secrets: int, n: int, d: int) -> np.ndarray:
    """``(w_0 − w_t)/η`` for every step, when every gradient is zero: the learner's injected
    noise summed up to t. One class only (AUC pairs of one class have no gradient) and a model
    ball too large to project, so the iterate is exactly −η·Σσ(MZ)."""
    out = np.zeros((secrets, n, d))
    X = np.full((n, d), 0.1)
    y = np.ones(n, dtype=bool)
    for s in range(secrets):
        m = _learner(n=n, d=d, seed=1000 + s, **_UNPROJECTED)
        for t in range(n):
            m.learn_one(X[t], y[t])
            out[s, t] = -m.private_weights
    return out


def test_injected_noise_has_the_mechanisms_covariance_across_200_secrets() -> None:
    n, d, secrets = 24, 3, 200
    template = _learner(n=n, d=d, **_UNPROJECTED)  # the samples' own mechanism
    mf = template.mf
    factorization = mf.factorization
    # Var of the prefix sum at t of σ·(M·Z): σ²·(A M Mᵀ Aᵀ)_tt = σ²·E_t.
    A = np.tril(np.ones((n, n)))
    M = factorization.noise_matrix(n)
    expected = mf.sigma**2 * np.diag(A @ M @ M.T @ A.T)

    def matches(samples: np.ndarray) -> bool:
        var = np.mean(samples**2, axis=(0, 2))  # per step, over secrets and coordinates
        # 600 samples per step: the relative standard error of a variance is √(2/600) ≈ 6 %;
        # the steps share their Z, so their mean is hardly more precise than one of them.
        return (
            bool(np.all(np.abs(var / expected - 1.0) < 0.25))
            and abs(float(np.mean(var / expected)) - 1.0) < 0.15
        )

    samples = _injected_prefix_sums(secrets, n, d)
    assert matches(samples)
    assert not matches(samples / 2)  # noise at σ/2 is caught
    assert not matches(samples * 0.75)  # and at 3σ/4


def test_a_learner_whose_sigma_was_lowered_cannot_pay_for_it() -> None:
    m = _learner()
    m._state.mechanism.mf.sigma /= 2  # ρ = Δ²/(2σ²) is now 4× the budget
    with pytest.warns(RuntimeWarning, match="exhausted"):
        m.learn_one(np.zeros(3), True)
    assert m.step == 0 and len(m.accountant) == 0


# -- sensitivity: the gradient stream on neighbouring streams ----------------------------------


def _gradient_rows(m: OnPairMF, stream, forced) -> np.ndarray:
    """g_t of the learner's own step rule at the iterate ``forced[t]``, along the stream."""
    s = m._state
    rows = []
    for t, (x, y) in enumerate(stream):
        if s.w is None:
            m._bind()
        xc = clip_norm(np.asarray(x, dtype=float), m.data_radius_)
        yv = m._input.validate(x, y)[1]
        X, Y = s.buffer.view()
        rows.append(s.gradient(forced[t].reshape(s.shape), xc, yv, X, Y).ravel())
        s.buffer.add(xc, yv, t + 1, s.noise)
        s.t = t + 1
    return np.array(rows)


@pytest.mark.parametrize("task", ["auc", "metric"])
def test_neighbouring_streams_never_exceed_the_certified_sensitivity(task: str) -> None:
    n, d, window = 48, 3, 6
    rng = np.random.default_rng(11)
    worst = 0.0
    for trial in range(30):
        X = rng.normal(size=(n, d)) * rng.choice([0.2, 3.0])
        y = (rng.random(n) < rng.choice([0.1, 0.5])) if task == "auc" else rng.integers(0, 3, n)
        i = int(rng.integers(0, n))
        X2, y2 = X.copy(), y.copy()
        X2[i] = -X[i] * 5 if trial % 2 else rng.normal(size=d) * 5
        if trial % 3 == 0:
            y2[i] = (not y[i]) if task == "auc" else (y[i] + 1) % 3
        a = _learner(task, n, d, buffer=window, noise="blt")
        b = _learner(task, n, d, buffer=window, noise="blt")
        D = a.model_radius_
        shape = (d,) if task == "auc" else (d, d)
        forced = []
        for _ in range(n):  # an adversarial iterate per step, on the boundary of C
            w = rng.normal(size=shape)
            if task == "metric":
                w = w @ w.T
            forced.append(D * w / np.linalg.norm(w))
        G = _gradient_rows(a, zip(X, y, strict=True), forced)
        G2 = _gradient_rows(b, zip(X2, y2, strict=True), forced)
        C = a.mf.factorization.strategy_matrix(n)
        worst = max(worst, float(np.linalg.norm(C @ (G - G2))) / a.mf.sensitivity)
    assert worst <= 1.0
    assert worst > 0.1  # measured ≈ 0.34 (AUC), 0.14 (metric)


# -- the model it serves --------------------------------------------------------------------------


def test_the_private_ranking_beats_chance_on_a_separable_stream() -> None:
    n, d = 2000, 4
    X, y = _stream(12, "auc", n, d)
    m = OnPairMF(task="auc", epsilon=4.0, horizon=n, features=d)  # fresh OS secret
    m.learn_many(X, y)
    scores = X @ m.private_weights
    pos, neg = scores[y], scores[~y]
    auc = float(np.mean(pos[:, None] > neg[None, :]))
    assert auc > 0.75
    assert m.private


def test_river_interface_predicts_from_the_release() -> None:
    X, y = _stream(13, "auc", 200, 3)
    m = _learner(n=200)
    for xi, yi in zip(X, y, strict=True):
        m.learn_one({f"x{j}": v for j, v in enumerate(xi)}, bool(yi))
    w = m.private_weights
    x = {"x0": 0.3, "x1": -0.2, "x2": 0.1}
    assert m.score_one(x) == pytest.approx(float(w @ np.array([0.3, -0.2, 0.1])))
    metric = _learner("metric", n=200)
    Xm, ym = _stream(13, "metric", 200, 3)
    metric.learn_many(Xm, ym)
    out = metric.transform_one({"x0": 0.3, "x1": -0.2, "x2": 0.1})
    assert len(out) == 3


def test_keyed_noise_is_the_correlated_rows_of_the_learners_secret() -> None:
    n, d = 40, 3
    m = _learner(n=n, d=d, model_radius=1e9, step_size=1.0, averaging=None)
    X = np.full((n, d), 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in range(n):
            m.learn_one(X[t], True)
    rows = CorrelatedNoise(m.mf.factorization, KeyedNoise(m.state_dict()["secret"], "onpairmf"),
                           d).next_rows(n)  # fmt: skip
    np.testing.assert_allclose(-m.private_weights, m.mf.sigma * rows.sum(axis=0), rtol=1e-12)
