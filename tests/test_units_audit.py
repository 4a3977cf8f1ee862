"""Unit-level noise: calibrated to the certified k-event Δ, and audited on one unit's events.

Issue criterion 2's learner side: the noise a unit-level OnPairMF adds is σ = Δ_k/√(2ρ) with
Δ_k :func:`~stream_dp.privacy.unit_sensitivity.unit_sensitivity` (a check that fails at σ/2),
the ledger charges Δ_k, and ``stream-dp audit --algorithm onpairmf-units`` audits neighbouring
streams that differ in k events of one unit: its design catches σ/2 (marked slow).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from stream_dp.audit import audit
from stream_dp.audit.design import canary_design
from stream_dp.audit.targets import _WeakenedNoise, audit_settings, online_target
from stream_dp.online import OnPairMF
from stream_dp.privacy.events import gaussian_rho
from stream_dp.privacy.mechanisms import gaussian_sigma_zcdp
from stream_dp.privacy.unit_sensitivity import placement_sensitivity, unit_sensitivity

EPS, DELTA = 1.0, 1e-5


def _learner(k: int = 4, b: int | None = None, noise_source=None, d: int = 400, seed=None):
    return OnPairMF(task="auc", epsilon=EPS, delta=DELTA, horizon=2000, buffer=16, features=d,
                    unit_key="u", max_events_per_unit=k, min_separation=b,
                    noise_source=noise_source, seed=seed,
                    reproducible=seed is not None)  # fmt: skip


def test_sigma_is_the_certified_unit_sensitivity_over_root_two_rho() -> None:
    model = _learner(k=4)
    mf = model.mf
    cert = unit_sensitivity(mf.factorization, mf.pattern, 2000, 4, model.min_separation_)
    assert mf.sensitivity == cert.sensitivity and cert.exact
    # Attained: the placement b apart from the start is within rounding of Δ_k.
    steps = [1 + i * model.min_separation_ for i in range(4)]
    worst = placement_sensitivity(mf.factorization, mf.pattern, steps, 2000)
    assert worst <= mf.sensitivity <= worst * (1 + 1e-8)
    rho = model.budget.limit
    assert mf.sigma == pytest.approx(gaussian_sigma_zcdp(cert.sensitivity, rho), rel=1e-3)
    model.learn_one({"x0": 0.1, "u": "a"}, True)
    (event,) = model.accountant.ledger
    assert event.sensitivity == mf.sensitivity and event.sigma == mf.sigma
    assert gaussian_rho(event.sensitivity, event.sigma) <= rho * (1 + 1e-12)
    # k events cost more than one at the same σ: the event-level Δ is well below Δ_4.
    assert 2.0 * mf.event_sensitivity < mf.sensitivity < 4.0 * mf.event_sensitivity


def _first_row_std(noise_source=None) -> float:
    """The empirical std of step 1's gradient noise (C's first row is e₁: it is σ·Z₁)."""
    rows = []
    for seed in range(5):
        model = _learner(noise_source=noise_source, seed=seed)
        model.learn_one({"x0": 0.1, "u": "a"}, True)
        mech = model._state.mechanism
        rows.append(mech.block[1 - mech.block_first].copy())
    return float(np.std(np.concatenate(rows))) / _learner().mf.sigma


def test_released_noise_has_the_unit_level_sigma_and_the_check_fails_at_half() -> None:
    # 2000 draws: the std is within ±5 % (≈ 3 standard errors) of σ.
    assert abs(_first_row_std() - 1.0) < 0.05
    halved = functools.partial(_WeakenedNoise, multiplier=0.5)
    assert abs(_first_row_std(halved) - 1.0) > 0.4


def _target(multiplier: float):
    settings = audit_settings("onpairmf-units")
    design = canary_design("auc", **settings.design)
    return online_target("onpairmf-units", design, EPS, DELTA, multiplier, **settings.params)


def test_the_unit_design_differs_in_one_units_events() -> None:
    design = canary_design("auc", **audit_settings("onpairmf-units").design)
    assert design.positions == [2, 5]
    units = design.units()
    assert units[2] == units[5] == "canary" and len(set(units)) == design.length - 1
    target = _target(1.0)
    assert "max_events_per_unit=2" in target.description


def test_the_unit_design_reaches_the_certified_sensitivity() -> None:
    """The releases are a linear image of the one Gaussian mechanism; the canary unit's μ along
    the probe (noise-free mean gap, covariance from 200 secrets) is ≥ 0.85 of the ledger's
    Δ_k/σ: a σ/2 variant (μ ≥ 1.7·Δ_k/σ) is far above the claim."""
    target, free = _target(1.0), _target(0.0)
    gap = free.observe(True, 1) - free.observe(False, 1)
    draws = np.array([target.observe(False, s) - free.observe(False, s) for s in range(200)])
    cov = draws.T @ draws / len(draws)
    used = np.flatnonzero(np.abs(gap) > 0)
    mu = math.sqrt(gap[used] @ np.linalg.solve(cov[np.ix_(used, used)], gap[used]))
    claim = target.claim(False, 1)
    assert 0.85 * claim.gdp_mu < mu < 1.1 * claim.gdp_mu


@pytest.mark.slow
def test_the_unit_level_audit_catches_halved_noise() -> None:
    """The default design and learner at ε = 4 (criterion 4's budget) from 1 000 trials: the
    claimed μ is 0.93 and σ/2 adds as much again, so the GDP bound clears the claim by 1.40–1.52×
    (seeds 1–3 and 2020). The default run (ε = 1, 20 000 trials, docs/units.md) catches σ/2 too,
    but takes about 2 minutes of CPU per run: too long for the suite."""
    honest = audit("onpairmf-units", epsilon=4.0, trials=1000, seed=2020, jobs=1)
    assert not honest.violated and honest.claim_is_meaningful
    assert honest.gdp_mu_lower_bound <= honest.claimed_gdp_mu
    broken = audit(
        "onpairmf-units", epsilon=4.0, trials=1000, seed=2020, noise_multiplier=0.5, jobs=1
    )
    assert broken.violated and broken.gdp_violated
    assert broken.gdp_mu_lower_bound > 1.25 * broken.claimed_gdp_mu
    assert "VIOLATION" in broken.summary()
