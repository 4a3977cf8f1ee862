"""Privacy layer: events, ledger accountants, conversions, schedules and keyed noise."""

from __future__ import annotations

from stream_dp.privacy.accountant import (
    ApproxDPAccountant,
    BudgetExhausted,
    DoubleCharge,
    PureDPAccountant,
    ZCDPAccountant,
    accountant_from_dict,
)
from stream_dp.privacy.conversions import (
    epsilon_from_rho,
    gaussian_epsilon_exact,
    rho_from_epsilon,
)
from stream_dp.privacy.events import ApproxDPEvent, GaussianEvent, LaplaceEvent
from stream_dp.privacy.mechanisms import (
    gaussian_sigma_approx_dp,
    gaussian_sigma_zcdp,
    laplace_scale,
)
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.privacy.schedules import AnytimeSchedule, HorizonSchedule, Schedule

__all__ = [
    "AnytimeSchedule",
    "ApproxDPAccountant",
    "ApproxDPEvent",
    "BudgetExhausted",
    "DoubleCharge",
    "GaussianEvent",
    "HorizonSchedule",
    "KeyedNoise",
    "LaplaceEvent",
    "PureDPAccountant",
    "Schedule",
    "ZCDPAccountant",
    "accountant_from_dict",
    "epsilon_from_rho",
    "gaussian_epsilon_exact",
    "gaussian_sigma_approx_dp",
    "gaussian_sigma_zcdp",
    "laplace_scale",
    "rho_from_epsilon",
]
