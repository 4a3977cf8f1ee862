"""The plain-NumPy correlated-noise learner: accounting, secrets, replay, horizon, averaging."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp
from mf_reference import MFReference

from stream_dp.constraints import PSDFrobeniusBall
from stream_dp.privacy.conversions import epsilon_from_rho
from stream_dp.privacy.events import GaussianEvent
from stream_dp.privacy.mf import MECHANISM_NAME

ORDERS = list(1.0 + np.geomspace(1e-3, 1e5, 2000))


def _stream(n: int = 400, d: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) / 2
    return X, X[:, 0] + 0.5 * rng.normal(size=n) > 0.6


def _learner(**kw) -> MFReference:
    params = {"horizon": 400, "epsilon": 1.0, "window": 16, "seed": 3, "reproducible": True}
    return MFReference("auc", **{**params, **kw})


@pytest.mark.parametrize("noise", ["blt", "tree", "independent"])
def test_one_charge_for_the_whole_horizon_before_the_first_step(noise: str) -> None:
    X, y = _stream()
    m = _learner(noise=noise)
    assert len(m.accountant.ledger) == 0
    m.learn_one(X[0], y[0])
    (event,) = m.accountant.ledger
    mech = m.mechanism
    assert event == GaussianEvent(
        step=1, sensitivity=mech.sensitivity, sigma=mech.sigma, mechanism=MECHANISM_NAME
    )
    budget = m.budget.limit
    assert budget * (1 - 1e-8) <= m.accountant.rho_spent() <= budget
    m.learn_many(X[1:], y[1:])
    assert len(m.accountant.ledger) == 1  # every later release is post-processing: free
    eps, delta = m.accountant.spent()
    assert eps <= 1.0 and delta == 1e-5
    # dp-accounting composes the same Gaussian mechanism (noise multiplier σ/Δ) to the same ε:
    # exactly by PLD (the default, exact accounting), by RDP for the zCDP conversion.
    exact = pld.PLDAccountant(value_discretization_interval=1e-4)
    exact.compose(dp_accounting.GaussianDpEvent(event.sigma / event.sensitivity))
    assert eps == pytest.approx(exact.get_epsilon(1e-5), rel=1e-3)
    assert epsilon_from_rho(m.accountant.cost(event), 1e-5, "exact") == pytest.approx(eps)
    tight = _learner(noise=noise, conversion="tight")
    tight.learn_one(X[0], y[0])
    (event,) = tight.accountant.ledger
    theirs = rdp.RdpAccountant(ORDERS)
    theirs.compose(dp_accounting.GaussianDpEvent(event.sigma / event.sensitivity))
    assert tight.accountant.spent()[0] == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-3)


def test_integer_seeds_need_reproducible_and_say_so() -> None:
    with pytest.raises(ValueError, match="reproducible=True"):
        MFReference("auc", horizon=10, seed=3)
    assert _learner().describe()["private"] is False
    assert MFReference("auc", horizon=10).describe()["private"] is True
    a, b = MFReference("auc", horizon=50, window=4), MFReference("auc", horizon=50, window=4)
    X, y = _stream(50)
    a.learn_many(X, y)
    b.learn_many(X, y)
    assert a.keyed.secret != b.keyed.secret and not np.array_equal(a.weights, b.weights)


def test_the_plan_is_data_independent() -> None:
    X, y = _stream()
    a, b = _learner(), _learner()
    a.learn_many(X, y)
    b.learn_many(-3 * X[::-1], ~y)
    assert a.describe() == b.describe()
    d = a.describe()
    assert d["sensitivity"] == a.mechanism.sensitivity and d["epsilon"] <= 1.0


@pytest.mark.parametrize("stop", [1, 150, 399])
def test_replay_from_a_checkpoint_inside_a_noise_block_is_bit_identical(stop: int) -> None:
    X, y = _stream()
    full = _learner()
    full.learn_many(X, y)
    first = _learner()
    first.learn_many(X[:stop], y[:stop])
    state = first.state_dict()
    resumed = _learner(seed=99)  # the secret comes from the checkpoint
    resumed.load_state_dict(state)
    resumed.learn_many(X[stop:], y[stop:])
    np.testing.assert_array_equal(resumed.w, full.w)
    np.testing.assert_array_equal(resumed.weights, full.weights)
    assert resumed.accountant.ledger == full.accountant.ledger


def test_learning_stops_at_the_horizon() -> None:
    X, y = _stream(500)
    m = _learner()
    m.learn_many(X, y)
    assert m.step == 400
    frozen = m.weights.copy()
    m.learn_one(X[0], y[0])
    np.testing.assert_array_equal(m.weights, frozen)


def test_predictions_use_the_served_average() -> None:
    X, y = _stream()
    m = _learner()
    m.learn_many(X, y)
    assert not np.array_equal(m.weights, m.w)  # the average differs from the last iterate
    assert m.score_one(X[0]) == pytest.approx(float(m.weights @ X[0]))
    assert np.linalg.norm(m.weights) <= m.D * (1 + 1e-12)


def test_noise_free_run_charges_nothing() -> None:
    X, y = _stream()
    m = _learner(epsilon=None)
    m.learn_many(X, y)
    assert m.accountant is None and m.mechanism.sigma == 0.0
    assert m.eta == pytest.approx(m.D / (4 * m.R * m.loss.cap * np.sqrt(400)))


def test_metric_iterates_stay_in_the_model_set() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 3))
    y = rng.integers(0, 3, size=120)
    m = MFReference("metric", horizon=120, epsilon=2.0, window=8, seed=1, reproducible=True)
    m.learn_many(X, y)
    ball = PSDFrobeniusBall(m.D)
    assert ball.contains(m.w) and ball.contains(m.weights)
    with pytest.raises(ValueError, match="metric uses a window"):
        MFReference("metric", horizon=10, buffer="class")


def test_private_runs_beat_chance_on_a_separable_stream() -> None:
    X, y = _stream(2000, seed=5)
    m = _learner(horizon=2000, epsilon=4.0, window=32)
    m.learn_many(X, y)
    assert m.weights[0] > 0.5 * np.linalg.norm(m.weights)  # aligned with the true direction
