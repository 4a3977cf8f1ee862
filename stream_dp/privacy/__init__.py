"""Privacy layer: events, the ledger, accountants, budgets, conversions, schedules, keyed noise.

In the shape of Google's ``dp_accounting``: events (:mod:`.events`) are small immutable records
of what was released; the ledger (:mod:`.ledger`) stores them; accountants (:mod:`.accountant`)
only compose them; a budget (:mod:`.budget`) refuses what would overrun the guarantee;
calibration (:mod:`.mechanisms`) turns a sensitivity and a cost into a noise scale.
"""

from __future__ import annotations

from stream_dp.privacy.accountant import (
    ApproxDPAccountant,
    DoubleCharge,
    PureDPAccountant,
    ZCDPAccountant,
    accountant_from_dict,
)
from stream_dp.privacy.budget import (
    BudgetExhausted,
    PrivacyBudget,
    approx_budget,
    budget_from_dict,
    pure_budget,
    zcdp_budget,
)
from stream_dp.privacy.conversions import (
    epsilon_from_rho,
    gaussian_epsilon_exact,
    rho_from_epsilon,
)
from stream_dp.privacy.events import (
    ApproxDPEvent,
    GaussianEvent,
    LaplaceEvent,
    NeighbouringRelation,
)
from stream_dp.privacy.mechanisms import (
    gaussian_sigma_approx_dp,
    gaussian_sigma_zcdp,
    laplace_scale,
    release_sigma,
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
    "NeighbouringRelation",
    "PrivacyBudget",
    "PureDPAccountant",
    "Schedule",
    "ZCDPAccountant",
    "accountant_from_dict",
    "approx_budget",
    "budget_from_dict",
    "epsilon_from_rho",
    "gaussian_epsilon_exact",
    "gaussian_sigma_approx_dp",
    "gaussian_sigma_zcdp",
    "laplace_scale",
    "pure_budget",
    "release_sigma",
    "rho_from_epsilon",
    "zcdp_budget",
]
