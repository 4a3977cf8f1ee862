"""The learners whose charges are all Gaussian account them exactly (μ-GDP) by default.

OnPairMF and OnPairStrC/OnPairC charge Gaussian releases only, so their ledger's Σρ is μ²/2 of
one μ-GDP guarantee whose (ε, δ) curve is exact (:mod:`stream_dp.privacy.gdp`): the budget's ρ
comes from that curve, σ is calibrated on it, and ``spent()`` reports it. These tests fail if
σ is calibrated below the exact curve, if the reported ε is not dp-accounting's PLD ε of the
same ledger, or if a Laplace release slips into such a ledger.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import GaussianDpEvent
from dp_accounting.pld import PLDAccountant

from stream_dp.online import OnPairMF, OnPairStrC
from stream_dp.privacy.accountant import ZCDPAccountant, accountant_from_dict
from stream_dp.privacy.budget import BudgetExhausted, zcdp_budget
from stream_dp.privacy.conversions import epsilon_from_rho, rho_from_epsilon
from stream_dp.privacy.events import GaussianEvent, LaplaceEvent
from stream_dp.privacy.gdp import GaussianDPAccountant, delta_for_epsilon, rho_budget

__all__: list[str] = []

DELTA = 1e-5


def _stream(n: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(scale=0.4, size=(n, d))
    return X, X[:, 0] + 0.5 * rng.normal(size=n) > 0


def _pld_epsilon(events, delta: float = DELTA) -> float:
    pld = PLDAccountant(value_discretization_interval=1e-4)
    for e in events:
        pld.compose(GaussianDpEvent(e.sigma / e.sensitivity))
    return pld.get_epsilon(delta)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0, 8.0])
def test_onpairmf_sigma_sits_on_the_exact_curve(epsilon: float) -> None:
    model = OnPairMF(task="auc", epsilon=epsilon, horizon=2_000, features=6)
    assert model.accountant.conversion == "exact"
    assert model.budget.limit == rho_budget(epsilon, DELTA)
    event = model.mf.event(1)
    mu = event.sensitivity / event.sigma
    # Calibrated on the curve: it holds at σ, and σ 1 % lower would break it — so a σ below
    # the exact curve fails here.
    assert delta_for_epsilon(mu, epsilon) <= DELTA
    assert delta_for_epsilon(mu * 1.01, epsilon) > DELTA
    # The one charge, once made, reports dp-accounting's PLD ε of the same event.
    X, y = _stream(5, 6)
    model.learn_many(X, y)
    (charged,) = model.accountant.ledger
    eps, delta = model.accountant.spent()
    assert delta == DELTA and eps <= epsilon
    assert eps == pytest.approx(_pld_epsilon([charged]), rel=1e-3)


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_the_claimed_epsilon_drops_by_at_least_seven_percent_at_the_same_sigma(
    epsilon: float,
) -> None:
    zcdp = OnPairMF(task="auc", epsilon=epsilon, horizon=35_169, features=48, conversion="tight")
    rho = zcdp.accountant.cost(zcdp.mf.event(1))
    claimed = epsilon_from_rho(rho, DELTA, "tight")
    exact = epsilon_from_rho(rho, DELTA, "exact")
    assert claimed == pytest.approx(epsilon, rel=1e-6)
    assert exact <= 0.93 * claimed
    # The new default spends the same (ε, δ) with a smaller σ.
    ours = OnPairMF(task="auc", epsilon=epsilon, horizon=35_169, features=48, conversion="exact",
                    data_radius=zcdp.data_radius_, model_radius=zcdp.model_radius_)  # fmt: skip
    assert ours.mf.sensitivity == zcdp.mf.sensitivity
    assert ours.mf.sigma < 0.94 * zcdp.mf.sigma


@pytest.mark.parametrize("task", ["auc", "metric"])
def test_onpairstrc_ledger_of_many_releases_is_accounted_exactly(task: str) -> None:
    n, d, epsilon = 400, 3, 2.0
    model = OnPairStrC(task=task, epsilon=epsilon, horizon=n, features=d, release_every=20)
    X, y = _stream(n, d, seed=1)
    labels = y if task == "auc" else np.where(y, "a", "b")
    model.learn_many(X, labels)
    ledger = model.accountant.ledger
    assert len(ledger) > 5 and all(type(e) is GaussianEvent for e in ledger)
    assert model.budget.limit == rho_budget(epsilon, DELTA)
    eps, _ = model.accountant.spent()
    gdp = GaussianDPAccountant()
    for e in ledger:
        gdp.compose(e)
    assert eps == pytest.approx(gdp.get_epsilon(DELTA), rel=1e-12)
    assert eps <= epsilon
    assert eps == pytest.approx(_pld_epsilon(ledger), rel=1e-3)
    # Every release's σ together sits under the curve: Σμ² within the budget's μ².
    assert delta_for_epsilon(math.sqrt(gdp.mu_squared), epsilon) <= DELTA


def test_an_exact_ledger_refuses_laplace_events_and_keeps_its_conversion() -> None:
    acc = ZCDPAccountant(DELTA, "exact")
    laplace = LaplaceEvent(step=1, sensitivity=1.0, scale=8.0)
    assert not acc.supports(laplace)
    with pytest.raises(TypeError):
        acc.compose(laplace)
    budget = zcdp_budget(1.0, DELTA, "exact")
    with pytest.raises(TypeError):
        budget.charge(laplace)
    # The zCDP route still composes mixed ledgers.
    mixed = zcdp_budget(1.0, DELTA, "tight")
    mixed.charge(laplace)
    assert mixed.accountant.spent()[0] > 0
    # A checkpoint keeps its accounting; a mixed stored ledger is refused by an exact one.
    budget.charge(GaussianEvent(step=2, sensitivity=1.0, sigma=20.0))
    back = accountant_from_dict(budget.accountant.to_dict())
    assert back.conversion == "exact" and back.spent() == budget.accountant.spent()
    with pytest.raises((TypeError, ValueError)):
        accountant_from_dict({**mixed.accountant.to_dict(), "conversion": "exact"})
    with pytest.raises(ValueError):
        ZCDPAccountant(DELTA, "exactly")


def test_the_exact_budget_refuses_what_would_exceed_the_curve() -> None:
    budget = zcdp_budget(1.0, DELTA, "exact")
    sens = 1.0
    sigma = sens / math.sqrt(2 * budget.limit)
    budget.charge(GaussianEvent(step=1, sensitivity=sens, sigma=sigma))
    assert budget.accountant.spent()[0] <= 1.0
    with pytest.raises(BudgetExhausted):
        budget.charge(GaussianEvent(step=2, sensitivity=sens, sigma=1e3))
    assert rho_from_epsilon(1.0, DELTA, "exact") == budget.limit


def test_a_checkpoint_whose_charge_is_another_mechanism_is_refused() -> None:
    # Same budget (the zCDP conversion pinned), other loss: the stream paid for the plain
    # loss's Δ and σ; resuming it under the capped loss's would run another mechanism.
    X, y = _stream(20, 3)
    pinned = dict(task="auc", epsilon=1.0, horizon=100, features=3, seed=1, reproducible=True,
                  conversion="tight", data_radius=1.0, model_radius=1.0)  # fmt: skip
    old = OnPairMF(**pinned, slope_cap=None)
    old.learn_many(X, y)
    new = OnPairMF(**pinned)
    with pytest.raises(ValueError, match="not this learner's mechanism"):
        new.load_state_dict(old.state_dict())
    same = OnPairMF(**old._get_params())
    same.load_state_dict(old.state_dict())
    assert same.step == old.step
