"""The empirical DP audit: its statistics are valid, its canary is tight, and it has power.

What must hold:

1. OnPairStrC (AUC and metric) and the offline output-perturbation algorithms OffPairStrC and
   OffPairC audit below their claims, and the audit predicts that it would catch the same
   configuration with its release noise halved;
2. the test-only variants whose release noise is halved (σ/2) are caught, and those whose noise
   is divided by 4 are caught by the (ε, δ) test itself.

The runs are CI-sized (6000 trials per world instead of the default 200 000): the GDP
test catches σ/2 at that size already; the (ε, δ) test needs the default size for σ/2
(``docs/privacy.md``, *Empirical audit*, has the measured default runs). Statistical tests use
fixed seeds; the tolerances are derived in each test.
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
from scipy import stats

from stream_dp.audit import (
    audit,
    available_algorithms,
    canary_design,
    central_threshold,
    clopper_pearson_upper,
    epsilon_from_rates,
    epsilon_lower_bound,
    fit_linear_test,
    flag_probability,
    gdp_epsilon,
    gdp_mu_from_rates,
    gdp_mu_lower_bound,
    ledger_claim,
    offline_target,
    online_target,
    predicted_power,
    run_audit,
    tail_threshold,
)
from stream_dp.audit.power import gdp_boundary
from stream_dp.audit.targets import _WeakenedNoise, audit_settings
from stream_dp.offline import OffPairStrC
from stream_dp.online import OnPairC, OnPairStrC
from stream_dp.privacy.conversions import gaussian_delta_exact, gaussian_epsilon_exact

EPS, DELTA = 1.0, 1e-5
CI_TRIALS = 6000


# -- statistics ------------------------------------------------------------------------------------
def test_clopper_pearson_zero_events_has_closed_form():
    # P(0 events | p) = (1 − p)^n = 1 − level  ⇔  p = 1 − (1 − level)^(1/n).
    for n in (10, 1000):
        expected = 1.0 - 0.025 ** (1.0 / n)
        assert clopper_pearson_upper(0, n, 0.975) == pytest.approx(expected, rel=1e-9)


def test_clopper_pearson_is_monotone_and_bounded():
    ub = clopper_pearson_upper(np.arange(0, 51), 50, 0.95)
    assert np.all(np.diff(ub) > 0)
    assert np.all(ub >= np.arange(0, 51) / 50) and ub[-1] == 1.0
    with pytest.raises(ValueError):
        clopper_pearson_upper(5, 4, 0.95)


def test_clopper_pearson_covers_the_true_rate():
    # Coverage of the 97.5 % upper bound over 4000 binomial draws: the bound is exact-or-
    # conservative, so the miss rate is ≤ 2.5 %; 4 standard errors (√(.025·.975/4000) ≈ .0025)
    # above that is 3.5 %.
    rng = np.random.default_rng(11)
    for p, n in ((0.01, 500), (0.3, 200)):
        k = rng.binomial(n, p, size=4000)
        misses = np.mean(clopper_pearson_upper(k, n, 0.975) < p)
        assert misses <= 0.035


def test_epsilon_from_rates_matches_the_dp_inequalities():
    # A test with FPR a and FNR b certifies ε ≥ log((1 − δ − b)/a) and log((1 − δ − a)/b).
    assert epsilon_from_rates(0.05, 0.5, 0.0) == pytest.approx(math.log(10.0))
    assert epsilon_from_rates(0.5, 0.05, 0.0) == pytest.approx(math.log(10.0))
    assert epsilon_from_rates(0.5, 0.5, 0.0) == 0.0
    assert epsilon_from_rates(0.05, 0.5, 0.4) == pytest.approx(math.log(2.0))
    # Larger rates can only certify less.
    assert epsilon_from_rates(0.06, 0.5, 1e-5) < epsilon_from_rates(0.05, 0.5, 1e-5)


def _randomized_response_audit(rng, epsilon: float, n: int) -> float:
    """Full (ε, δ) pipeline on ε-randomized response: reports 1 w.p. e^ε/(1+e^ε) with canary."""
    p = math.exp(epsilon) / (1.0 + math.exp(epsilon))
    canary = (rng.random(2 * n) < p).astype(float)
    benign = (rng.random(2 * n) < 1.0 - p).astype(float)
    tau = tail_threshold(canary[:n], benign[:n], n, 0.0)
    fp = int(np.sum(benign[n:] > tau))
    fn = int(np.sum(canary[n:] <= tau))
    return float(epsilon_lower_bound(fp, n, fn, n, 0.0))


def test_lower_bound_is_valid_and_tight_on_a_known_mechanism():
    # Randomized response is exactly ε-DP and its optimal test attains ε. The 95 % bound must
    # stay below ε in ≥ 95 % of audits (binomial(100, .05) exceeds 12 with prob < 0.2 %), and
    # with 20 000 trials per side CP costs < 0.1 in ε: every audit lands in (0.85, 1].
    rng = np.random.default_rng(5)
    bounds = np.array([_randomized_response_audit(rng, 1.0, 20_000) for _ in range(100)])
    assert np.sum(bounds > 1.0) <= 12
    assert np.all(bounds > 0.85)


def test_lower_bound_stays_below_the_exact_gaussian_epsilon():
    # A Gaussian mechanism with μ = Δ/σ = 1 is (ε(δ), δ)-DP with ε(δ) from its exact profile.
    rho = 0.5
    exact = gaussian_epsilon_exact(rho, DELTA)
    rng = np.random.default_rng(8)
    n = 5000
    bounds = []
    for _ in range(20):
        c, b = rng.normal(1.0, 1.0, 2 * n), rng.normal(0.0, 1.0, 2 * n)
        tau = tail_threshold(c[:n], b[:n], n, DELTA)
        bounds.append(epsilon_lower_bound(np.sum(b[n:] > tau), n, np.sum(c[n:] <= tau), n, DELTA))
    assert max(bounds) < exact
    assert min(bounds) > 0.5  # power: log(Φ(μ−t)/Φ(−t)) ≈ 1.9 at t = 2.5, CP keeps > 1.2


def test_linear_test_is_the_likelihood_ratio_for_correlated_releases():
    # Releases with correlated noise (Σ = [[1, .9], [.9, 1]]) and signal only in the first: the
    # likelihood-ratio score separates the worlds by the Mahalanobis distance √(ΔᵀΣ⁻¹Δ) =
    # 0.6/√0.19 = 1.376 in units of its spread; the first release alone gives 0.6. Fitted on
    # 20 000 pilot trials per world, measured on 50 000 fresh ones (standard error ≈ 0.007).
    rng = np.random.default_rng(23)
    root = np.linalg.cholesky(np.array([[1.0, 0.9], [0.9, 1.0]]))

    def world(m, n):
        return np.array([m, 0.0]) + rng.normal(size=(n, 2)) @ root.T

    w = fit_linear_test(world(0.3, 20_000), world(-0.3, 20_000))
    c, b = world(0.3, 50_000) @ w, world(-0.3, 50_000) @ w
    separation = (c.mean() - b.mean()) / np.sqrt(0.5 * (c.var() + b.var()))
    assert separation == pytest.approx(0.6 / math.sqrt(0.19), abs=0.03)


def test_gdp_mu_from_rates_inverts_the_gaussian_trade_off():
    # N(0, 1) vs N(μ, 1) at any threshold t: FPR = Φ(−t), FNR = Φ(t − μ); the GDP curve through
    # that point is exactly μ's, and the same rates in swapped roles give the same μ.
    for mu in (0.1, 0.5, 2.0):
        for t in (-1.0, mu / 2, 2.5):
            fpr, fnr = stats.norm.sf(t), stats.norm.cdf(t - mu)
            assert gdp_mu_from_rates(fpr, fnr) == pytest.approx(mu, abs=1e-9)
            assert gdp_mu_from_rates(fnr, fpr) == pytest.approx(mu, abs=1e-9)
    assert gdp_mu_from_rates(0.6, 0.5) == 0.0  # worse than a coin: nothing


def test_gdp_lower_bound_covers_the_true_mu_and_is_tight():
    # Error counts of the central test on N(0,1) vs N(μ,1): FP, FN ~ Bin(n, Φ(−μ/2)). At
    # confidence 0.8 (each rate at 0.9) the bound may exceed μ in at most 20 % of audits;
    # 4 standard errors (√(.2·.8/4000) ≈ .0063) above that is 22.6 %. It must also be tight:
    # the rates' standard error 0.0070 costs about 2·1.28·0.0070/φ(0.25) ≈ 0.046 in μ.
    rng = np.random.default_rng(13)
    mu, n = 0.5, 5000
    p = stats.norm.cdf(-mu / 2)
    fp, fn = rng.binomial(n, p, size=4000), rng.binomial(n, p, size=4000)
    bounds = gdp_mu_lower_bound(fp, n, fn, n, confidence=0.8)
    assert np.mean(bounds > mu) <= 0.226
    assert 0.42 < np.median(bounds) < mu


def test_gdp_epsilon_is_the_exact_gaussian_profile():
    for mu in (0.25, 0.5, 1.0):
        eps = gdp_epsilon(mu, DELTA)
        assert gaussian_delta_exact(mu * mu / 2, eps) == pytest.approx(DELTA, rel=1e-6)
    assert gdp_epsilon(0.0, DELTA) == 0.0


def test_central_threshold_is_between_the_medians():
    rng = np.random.default_rng(3)
    c, b = rng.normal(1.0, 1.0, 10_001), rng.normal(0.0, 1.0, 10_001)
    assert central_threshold(c, b) == pytest.approx(0.5 * (np.median(c) + np.median(b)))
    assert abs(central_threshold(c, b) - 0.5) < 0.05


def test_flag_probability_matches_simulated_audits():
    # The GDP test with claim μ = 0.25 on a mechanism with true μ = 0.4: 1000 trials per world
    # make this a coin flip, where an error in the binomial sum would show. 200 000 simulated
    # audits: standard error ≤ 0.0012, so 5 of them is 0.006.
    n, level, claim = 1000, 0.975, 0.25
    rate = stats.norm.cdf(-0.4 / 2)
    predicted = flag_probability(rate, rate, n, n, level, gdp_boundary(claim))
    rng = np.random.default_rng(17)
    fp, fn = rng.binomial(n, rate, 200_000), rng.binomial(n, rate, 200_000)
    mu_lb = gdp_mu_from_rates(
        clopper_pearson_upper(fp, n, level), clopper_pearson_upper(fn, n, level)
    )
    assert 0.2 < predicted < 0.8
    assert predicted == pytest.approx(np.mean(mu_lb > claim), abs=0.006)


def test_predicted_power_matches_the_exact_rates_of_gaussian_scores():
    # From Gaussian scores with separation 0.25, the prediction for noise ÷ k must equal the
    # flag probability at the exact rates of separation 0.25·k (sampling error of 100 000
    # scores: rates ±0.0016, about ±0.02 in power where it is steepest).
    rng = np.random.default_rng(19)
    c, b = rng.normal(0.25, 1.0, 100_000), rng.normal(0.0, 1.0, 100_000)
    n, level, claim = 20_000, 0.9975, 0.3
    for k in (1.0, 1.3, 1.6, 2.0):
        rate = stats.norm.cdf(-0.25 * k / 2)
        exact = flag_probability(rate, rate, n, n, level, gdp_boundary(claim))
        assert predicted_power(c, b, k, n, level, claim) == pytest.approx(exact, abs=0.03)


# -- the canary design and the targets ----------------------------------------------------------
@pytest.mark.parametrize("task", ["auc", "metric"])
@pytest.mark.parametrize("cls", [OnPairStrC, OnPairC])
def test_canary_attains_the_certified_sensitivity(task, cls):
    """Without noise the two worlds' models are exactly diam(C) apart — the certified bound —
    at every learned release, whatever the warm-up model: the audit meets the learner at its
    worst case, so any shortfall of noise shows."""
    design = canary_design(task, dim=6, length=5)
    target = online_target(cls.__name__.lower(), design, EPS, DELTA, noise_multiplier=0.0)
    learner = cls(
        release_every=1,
        task=task,
        epsilon=EPS,
        delta=DELTA,
        horizon=5,
        alpha=design.alpha,
        warmup=1,
        features=6,
    )
    diam = learner.constraint.diameter
    for secret in (1, 2, 3):
        with_c = target.observe(True, secret)
        without = target.observe(False, secret + 100)
        # The probe projections differ by exactly diam for OnPairStrC; OnPairC's regulariser
        # pulls towards its random centre w₀ with weight ηα, a few per cent after four steps.
        gap = with_c[1:] - without[1:]
        tolerance = 1e-9 if cls is OnPairStrC else 0.05
        assert np.all(gap >= (1 - tolerance) * diam) and np.all(gap <= diam * (1 + 1e-9))
    for x, y in design.stream(True):
        learner.learn_one(x, y)
    assert learner.last_sensitivity == pytest.approx(diam)


def test_trial_learner_is_the_production_learner():
    """The audit's fast per-trial copy is bit-identical to constructing the learner with
    ``seed=secret``: it audits the real code path, not a re-implementation."""
    design = canary_design("auc", dim=4, length=4)
    target = online_target("onpairstrc", design, EPS, DELTA)
    obs, claim = target.observe(True, 12345), target.claim(True, 12345)
    direct = OnPairStrC(
        task="auc", epsilon=EPS, delta=DELTA, horizon=4, alpha=design.alpha, warmup=1,
        seed=12345, reproducible=True, model_id="audit", track_regret=False, features=4,
        release_every=1,
    )  # fmt: skip
    expected = []
    for x, y in design.stream(True):
        direct.learn_one(x, y)
        expected.append(float(direct.private_weights @ design.probe))
    assert obs.tolist() == expected
    assert (claim.epsilon, claim.delta) == direct.accountant.spent()
    assert claim.epsilon <= EPS


def _onpairmf_target(multiplier: float = 1.0, task: str = "auc"):
    settings = audit_settings("onpairmf")
    design = canary_design(task, **settings.design)
    return online_target("onpairmf", design, EPS, DELTA, multiplier, **settings.params)


def test_weakened_noise_reaches_the_correlated_gradient_noise():
    """OnPairMF's noise (the ``mf`` factorization's rows, linear in the keyed draws) is scaled
    exactly by the multiplier: with one secret, the weakened run's deviation from the noise-free
    run is the honest run's times the multiplier, release by release."""
    free = _onpairmf_target(0.0).observe(True, 5)
    honest = _onpairmf_target(1.0).observe(True, 5) - free
    for m in (0.5, 0.25):
        weakened = _onpairmf_target(m).observe(True, 5) - free
        assert np.abs(honest).min() > 0
        np.testing.assert_allclose(weakened, m * honest, rtol=1e-6, atol=1e-12)


def test_onpairmf_design_reaches_most_of_the_certified_sensitivity():
    """The releases are a linear image (no projection binds) of the one Gaussian mechanism
    ``C·G + σZ``; the canary's μ along the probe, ``‖Σ^{-1/2}(m₁ − m₀)‖`` with the noise-free
    mean difference and the releases' exact covariance, is ≥ 0.75 of the ledger's ``Δ/σ``:
    a σ/2 variant (μ ≥ 1.5·Δ/σ) is far above the claim."""
    target = _onpairmf_target(1.0)
    free = _onpairmf_target(0.0)
    mean_gap = free.observe(True, 1) - free.observe(False, 1)
    # The releases' noise, σ·(M·Z) seen through the averaging, from 300 secrets (a sample
    # covariance of 33 values: μ is overestimated by about 6 %, which the bounds allow for).
    draws = np.array([target.observe(False, s) - free.observe(False, s) for s in range(300)])
    cov = draws.T @ draws / len(draws)
    used = np.flatnonzero(np.abs(mean_gap) > 0)
    mu = math.sqrt(mean_gap[used] @ np.linalg.solve(cov[np.ix_(used, used)], mean_gap[used]))
    claim = target.claim(False, 1)
    assert 0.75 * claim.gdp_mu < mu < 1.0 * claim.gdp_mu


def test_ledger_claim_is_the_composed_gaussian_mu():
    # Online: the zCDP charges Δ²/(2σ²) sum to ρ, and μ = √(Σ Δ²/σ²) = √(2ρ).
    learner = OnPairStrC(task="auc", epsilon=EPS, delta=DELTA, horizon=20, alpha=1.0, warmup=3,
                         release_every=1, features=2, seed=1, reproducible=True)  # fmt: skip
    for i in range(20):
        learner.learn_one([i % 3 / 3, i % 2 / 2], i % 2 == 0)
    claim = ledger_claim(learner.accountant)
    assert len(learner.accountant) > 1
    assert claim.gdp_mu == pytest.approx(math.sqrt(2 * learner.accountant.rho_spent()), rel=1e-12)
    # Offline, classic Gaussian: one (ε, δ) event with its Δ and σ; Laplace (δ = 0): no μ.
    X, y = np.eye(4)[:, :3], np.array([1, -1, 1, -1])
    offline = dict(alpha=1.0, warmup=1, sensitivity="certified")
    model = OffPairStrC(epsilon=EPS, delta=DELTA, **offline).fit(X, y)
    (event,) = model.accountant.ledger
    assert ledger_claim(model.accountant).gdp_mu == pytest.approx(event.sensitivity / event.scale)
    pure = OffPairStrC(epsilon=EPS, delta=0.0, **offline).fit(X, y)
    assert ledger_claim(pure.accountant).gdp_mu is None
    assert ledger_claim(pure.accountant).epsilon == pytest.approx(EPS)


def test_weakened_variant_is_unreachable_from_production():
    # No learner parameter weakens the noise without making the learner non-private (a noise
    # source other than the default marks every release "private": false), and the test-only
    # variant says so in its report.
    with pytest.raises(TypeError):
        OnPairStrC(noise_multiplier=0.25)
    weakened = functools.partial(_WeakenedNoise, multiplier=0.25)
    learner = OnPairStrC(task="auc", horizon=100, features=2, noise_source=weakened)
    assert learner.seed is None and not learner.private
    with pytest.raises(ValueError):
        online_target(noise_multiplier=-1.0)
    target = online_target("onpairstrc", canary_design("auc", dim=3), noise_multiplier=0.25)
    result = run_audit(target, trials=40, seed=0, jobs=1)
    assert not result.claim_is_meaningful and "TEST-ONLY" in result.summary()


def test_results_do_not_depend_on_the_number_of_processes():
    target = online_target("onpairstrc", canary_design("auc", dim=4), EPS, DELTA)
    one = run_audit(target, trials=300, seed=4, jobs=1).to_dict()
    two = run_audit(target, trials=300, seed=4, jobs=2).to_dict()
    for key in ("seconds", "jobs"):
        one.pop(key), two.pop(key)
    assert one == two


# -- acceptance: CI-sized audits -------------------------------------------------------------------
def _audits(algorithm: str, task: str = "auc", multipliers=(1.0, 0.5, 0.25)):
    return {
        m: audit(algorithm, task=task, trials=CI_TRIALS, seed=2020, noise_multiplier=m)
        for m in multipliers
    }


def _check_honest(result, min_power: float) -> None:
    assert result.claimed_epsilon <= EPS and result.delta == DELTA
    assert result.claimed_epsilon > 0.99  # the whole budget is spent over the stream
    assert not result.violated and result.claim_is_meaningful
    assert result.epsilon_lower_bound <= result.claimed_epsilon
    assert result.gdp_mu_lower_bound <= result.claimed_gdp_mu
    # The audit can see what it must catch: with its own scores and trials it predicts that a
    # σ/2 variant of this very configuration is flagged.
    assert result.power >= min_power
    assert result.detectable_noise_divisor < 2.0
    print(f"\n{result.algorithm}/{result.task} honest: P(flag σ/2) {result.power:.4f}, "
          f"detectable divisor {result.detectable_noise_divisor:.2f}")  # fmt: skip


def _check_halved_noise_is_caught(result) -> None:
    # Noise ÷ 2 doubles μ (≈ 0.49 for the online learners, ≈ 0.41 for the classic offline
    # calibration); the ledger is unaware.
    assert result.claimed_epsilon == pytest.approx(EPS, abs=1e-6)
    assert result.violated and result.gdp_violated
    assert result.gdp_mu_lower_bound > 1.25 * result.claimed_gdp_mu
    assert result.gdp_epsilon_lower_bound > result.claimed_epsilon
    print(f"\n{result.algorithm}/{result.task} σ/2: μ ≥ {result.gdp_mu_lower_bound:.3f} = "
          f"{result.gdp_mu_lower_bound / result.claimed_gdp_mu:.2f} × the claimed "
          f"{result.claimed_gdp_mu:.3f}")  # fmt: skip
    assert "VIOLATION" in result.summary() and "TEST-ONLY" in result.summary()


@pytest.fixture(scope="module")
def onpairstrc_auc_audits():
    return _audits("onpairstrc")


@pytest.mark.slow
def test_onpairstrc_auc_audit_is_below_the_claim_with_power(onpairstrc_auc_audits):
    _check_honest(onpairstrc_auc_audits[1.0], min_power=0.99)


@pytest.mark.slow
def test_onpairstrc_auc_audit_catches_halved_noise(onpairstrc_auc_audits):
    _check_halved_noise_is_caught(onpairstrc_auc_audits[0.5])


@pytest.mark.slow
def test_onpairstrc_auc_epsilon_test_catches_quartered_noise(onpairstrc_auc_audits):
    # Noise ÷ 4: μ ≈ 0.99; with 5400 counted trials per world the (ε, δ) bound itself is
    # ≈ 1.6 (1.59 and 1.65 for seeds 1 and 2), above the claimed ε = 1.
    broken = onpairstrc_auc_audits[0.25]
    assert broken.epsilon_violated and broken.epsilon_lower_bound > 1.2


@pytest.mark.slow
def test_onpairstrc_metric_audit():
    # The metric design (d = 5 by default) is less efficient than the AUC one (the PSD
    # projection drops part of the signal: μ ≈ 0.21 of 0.25), so its power at this size is
    # lower but still decisive.
    results = _audits("onpairstrc", task="metric", multipliers=(1.0, 0.5))
    assert results[1.0].task == "metric"
    _check_honest(results[1.0], min_power=0.9)
    _check_halved_noise_is_caught(results[0.5])


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["offpairstrc", "offpairc"])
def test_offline_output_perturbation_audit(algorithm):
    assert algorithm in available_algorithms()
    # (The (ε, δ) test's catch of quartered noise is checked once, on OnPairStrC above.)
    results = _audits(algorithm, multipliers=(1.0, 0.5))
    assert results[1.0].claimed_epsilon == EPS  # classic calibration: the (ε, δ) event itself
    _check_honest(results[1.0], min_power=0.99)
    _check_halved_noise_is_caught(results[0.5])


def test_pure_dp_audit_has_no_gdp_test():
    # δ = 0: Laplace noise, a pure ε-DP ledger: no Gaussian charges, so no GDP test and no
    # predicted power — the (ε, δ) test alone, at the full confidence.
    result = audit("offpairstrc", delta=0.0, trials=400, dim=4, seed=1, jobs=1)
    assert result.claimed_gdp_mu is None and result.gdp_mu_lower_bound is None
    assert result.power is None and "not predicted" in result.summary()
    assert not result.violated


def test_offline_target_rejects_unknown_algorithms():
    with pytest.raises(ValueError, match="available"):
        offline_target("nope")


# -- command line ------------------------------------------------------------------------------
def test_cli_json(capsys):
    from stream_dp.cli import main

    rc = main(["audit", "--trials", "400", "--dim", "4", "--json", "--quiet", "--seed", "1",
               "--jobs", "1"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["algorithm"] == "onpairstrc" and out["trials"] == 400
    assert out["epsilon_lower_bound"] <= out["claimed_epsilon"] <= EPS
    assert out["gdp_mu_lower_bound"] <= out["claimed_gdp_mu"]
    assert 0.0 <= out["power"] <= 1.0 and out["confidence"] == 0.99
    assert {"test", "design", "false_positives", "false_negatives", "violated"} <= set(out)


@pytest.mark.slow
def test_cli_reports_a_violation_with_exit_code_1(capsys):
    # The exit code and the report of a caught variant; the power to catch σ/2 is checked on
    # the library above. Noise ÷ 4 (μ ≈ 0.99 against the claimed 0.25) at 600 trials: the GDP
    # bound clears the claim by about 5 of its standard errors.
    from stream_dp.cli import main

    rc = main(["audit", "--trials", "600", "--noise-multiplier", "0.25", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "VIOLATION" in out and "TEST-ONLY" in out and "P(flag" in out


def test_cli_rejects_bad_arguments(capsys):
    from stream_dp.cli import main

    assert main(["audit", "--algorithm", "nope", "--quiet"]) == 2
    assert "available" in capsys.readouterr().err
    assert main(["audit", "--jobs", "0", "--quiet"]) == 2
    assert "jobs" in capsys.readouterr().err
