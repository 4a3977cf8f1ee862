"""zCDP ↔ (ε, δ) conversions and ledger composition, cross-checked against Google's dp-accounting.

Our conversions match ``dp_accounting`` (a ``ZCDpEvent`` composed in an
``RdpAccountant`` with a dense grid of orders) to 1e-3 relative in both directions; the OpenDP
reference vector (ρ = 1/32, δ = 1e-3 → ε = 0.6880024555) to 1e-6; and
``exact Gaussian ε ≤ tight ε ≤ paper ε`` on a grid of (ρ, δ).
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp
from scipy import optimize

from stream_dp.privacy import (
    GaussianEvent,
    ZCDPAccountant,
    epsilon_from_rho,
    gaussian_epsilon_exact,
    rho_from_epsilon,
)
from stream_dp.privacy.conversions import gaussian_delta_exact

__all__: list[str] = []

# Dense orders so that dp-accounting's discretisation of the Rényi order is far below the
# 1e-3 tolerance: consecutive orders differ by a factor 1.0104 in (a − 1), and the RDP→(ε, δ)
# objective is flat (first-order zero) at its optimum, so the grid costs ~1e-5 relative at most.
ORDERS = list(1.0 + np.geomspace(1e-3, 1e5, 2000))
RHOS = [1e-4, 1e-3, 0.01, 1 / 32, 0.1, 0.5, 2.0]
DELTAS = [1e-3, 1e-5, 1e-8, 1e-10]
EPSILONS = [0.1, 0.5, 1.0, 3.0, 8.0]


def _dp_accounting_epsilon(rho: float, delta: float) -> float:
    acc = rdp.RdpAccountant(ORDERS)
    acc.compose(dp_accounting.ZCDpEvent(rho))
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("rho", RHOS)
def test_tight_epsilon_matches_dp_accounting(rho: float, delta: float) -> None:
    ours = epsilon_from_rho(rho, delta)
    theirs = _dp_accounting_epsilon(rho, delta)
    assert ours == pytest.approx(theirs, rel=1e-3)
    # dp-accounting minimises the same CKS bound over a finite set of orders, we minimise over
    # all a > 1: ours can only be lower, up to the optimiser's own tolerance.
    assert ours <= theirs * (1.0 + 1e-9)


@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10])
@pytest.mark.parametrize("epsilon", EPSILONS)
def test_rho_from_epsilon_matches_dp_accounting_search(epsilon: float, delta: float) -> None:
    # Invert dp-accounting independently: the ρ at which its ε equals the target (Brent's method
    # in log ρ on a monotone function; bracket [1e-8, 1e3] covers every target of the grid).
    def gap(log_rho: float) -> float:
        return _dp_accounting_epsilon(math.exp(log_rho), delta) - epsilon

    theirs = math.exp(optimize.brentq(gap, math.log(1e-8), math.log(1e3), xtol=1e-10))
    ours = rho_from_epsilon(epsilon, delta)
    assert ours == pytest.approx(theirs, rel=1e-3)
    # A budget is never rounded up: the ρ we hand out really implies (ε, δ).
    assert epsilon_from_rho(ours, delta) <= epsilon


def test_opendp_reference_vector() -> None:
    # OpenDP's zCDP → approx-DP conversion test vector (same CKS 2020 bound).
    assert epsilon_from_rho(1 / 32, 1e-3) == pytest.approx(0.6880024555, abs=1e-6)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("rho", RHOS)
def test_exact_gaussian_below_tight_below_paper(rho: float, delta: float) -> None:
    exact = gaussian_epsilon_exact(rho, delta)
    tight = epsilon_from_rho(rho, delta, "tight")
    paper = epsilon_from_rho(rho, delta, "paper")
    assert 0.0 < exact <= tight <= paper
    # The exact curve really is the Gaussian's: δ(ε_exact) = δ.
    assert gaussian_delta_exact(rho, exact) == pytest.approx(delta, rel=1e-6)


@pytest.mark.parametrize("rho", [1e-3, 0.01, 1 / 32])
def test_exact_gaussian_matches_dp_accounting_pld(rho: float) -> None:
    # The lower end of the sandwich above is itself checked against dp-accounting's privacy-loss
    # distribution accountant for one Gaussian release with noise multiplier σ/Δ = 1/√(2ρ).
    # PLD discretisation is pessimistic: it may only overshoot, by much less than 0.1 %.
    acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.GaussianDpEvent(1.0 / math.sqrt(2.0 * rho)))
    theirs = float(acc.get_epsilon(1e-5))
    ours = gaussian_epsilon_exact(rho, 1e-5)
    assert ours == pytest.approx(theirs, rel=1e-3)
    assert ours <= theirs * (1.0 + 1e-9)


@pytest.mark.parametrize("conversion", ["tight", "paper"])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10])
@pytest.mark.parametrize("epsilon", EPSILONS)
def test_round_trip_is_tight_and_never_rounds_up(
    epsilon: float, delta: float, conversion: str
) -> None:
    rho = rho_from_epsilon(epsilon, delta, conversion)
    back = epsilon_from_rho(rho, delta, conversion)
    assert back <= epsilon
    assert back == pytest.approx(epsilon, rel=1e-9)


def test_paper_rho_is_smaller_than_tight_rho() -> None:
    # The paper's conversion is looser, so for the same (ε, δ) it grants less ρ (more noise).
    for eps in EPSILONS:
        for delta in DELTAS:
            assert rho_from_epsilon(eps, delta, "paper") < rho_from_epsilon(eps, delta, "tight")


def test_epsilon_is_increasing_in_rho() -> None:
    rhos = np.geomspace(1e-6, 10.0, 60)
    for conversion in ("tight", "paper"):
        eps = [epsilon_from_rho(r, 1e-6, conversion) for r in rhos]
        assert np.all(np.diff(eps) > 0)
    assert epsilon_from_rho(0.0, 1e-5) == 0.0


def test_ledger_composition_matches_dp_accounting() -> None:
    # A ledger of Gaussian releases with various sensitivities and σ is composed by
    # dp-accounting as Gaussian events with noise multiplier σ/Δ (RDP α/(2(σ/Δ)²) = ρα).
    rng = np.random.default_rng(5)
    acc = ZCDPAccountant(delta=1e-6)
    theirs = rdp.RdpAccountant(ORDERS)
    for step in range(1, 41):
        sens, sigma = float(rng.uniform(0.05, 1.0)), float(rng.uniform(2.0, 20.0))
        acc.compose(GaussianEvent(step=step, sensitivity=sens, sigma=sigma))
        theirs.compose(dp_accounting.GaussianDpEvent(sigma / sens))
    eps, delta = acc.spent()
    assert delta == 1e-6
    assert eps == pytest.approx(theirs.get_epsilon(1e-6), rel=1e-3)
    assert acc.rho_spent() == pytest.approx(sum(acc.cost(e) for e in acc.ledger), rel=1e-15)


@pytest.mark.parametrize(
    "call",
    [
        lambda: epsilon_from_rho(0.1, 0.0),
        lambda: epsilon_from_rho(0.1, 1.0),
        lambda: epsilon_from_rho(-0.1, 1e-5),
        lambda: epsilon_from_rho(0.1, 1e-5, "loose"),
        lambda: rho_from_epsilon(0.0, 1e-5),
        lambda: rho_from_epsilon(math.inf, 1e-5),
    ],
)
def test_invalid_arguments_raise(call) -> None:
    with pytest.raises(ValueError):
        call()


def test_the_compiled_conversion_gives_the_python_ones_bits() -> None:
    """The engine converts ρ → ε at every release through the compiled root finder when the
    kernels are compiled: it must report the very ε (and give rho_from_epsilon the very budget)
    the Python code would, on any machine that uses it."""
    from stream_dp import _jit
    from stream_dp.privacy import conversions

    if not _jit.NUMBA_INSTALLED:
        pytest.skip("numba is not installed")
    with _jit.use_numba(True):
        compiled = conversions._tight_epsilon_now()
    assert compiled is not conversions._tight_epsilon  # the probe passed: it is in use
    with _jit.use_numba(False):
        assert conversions._tight_epsilon_now() is conversions._tight_epsilon
    rng = np.random.default_rng(20261124)
    rhos = np.concatenate([10.0 ** rng.uniform(-12, 3, 20_000), np.cumsum(np.full(5_000, 1e-5))])
    for delta in (1e-12, 1e-6, 1e-5, 1e-3, 0.5):
        ld = math.log(delta)
        got = [compiled(float(r), ld) for r in rhos]
        want = [conversions._tight_epsilon(float(r), ld) for r in rhos]
        assert got == want
    for delta in (1e-5, 1e-8):
        for epsilon in EPSILONS:
            with _jit.use_numba(True):
                fast = conversions.rho_from_epsilon.__wrapped__(epsilon, delta)
            with _jit.use_numba(False):
                slow = conversions.rho_from_epsilon.__wrapped__(epsilon, delta)
            assert fast == slow
