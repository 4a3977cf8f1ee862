"""Empirical differential-privacy audit (``stream-dp audit``).

:mod:`stream_dp.audit.design` builds the neighbouring streams, :mod:`stream_dp.audit.targets`
runs the production learners on them, :mod:`stream_dp.audit.stats` turns a test's error counts
into lower bounds on ε and on the Gaussian-DP μ, :mod:`stream_dp.audit.power` predicts what the
audit can catch, and :mod:`stream_dp.audit.core` runs it all.

Examples
--------
>>> from stream_dp.audit import audit
>>> result = audit("onpairstrc", epsilon=1.0, delta=1e-5, trials=400, dim=4, seed=0, jobs=1)
>>> result.epsilon_lower_bound <= result.claimed_epsilon
True

"""

from __future__ import annotations

from stream_dp.audit.core import AuditResult, audit, run_audit
from stream_dp.audit.design import CanaryDesign, canary_design
from stream_dp.audit.power import (
    detectable_noise_divisor,
    flag_probability,
    predicted_power,
)
from stream_dp.audit.stats import (
    central_threshold,
    clopper_pearson_upper,
    epsilon_from_rates,
    epsilon_lower_bound,
    fit_linear_test,
    gdp_epsilon,
    gdp_mu_from_rates,
    gdp_mu_lower_bound,
    tail_threshold,
)
from stream_dp.audit.targets import (
    AUDIT_SETTINGS,
    ONLINE_ALGORITHMS,
    ONLINE_LEARNERS,
    AuditSettings,
    AuditTarget,
    LedgerClaim,
    audit_settings,
    available_algorithms,
    ledger_claim,
    make_target,
    offline_target,
    online_target,
)

__all__ = [
    "ONLINE_ALGORITHMS",
    "ONLINE_LEARNERS",
    "AUDIT_SETTINGS",
    "AuditResult",
    "AuditSettings",
    "AuditTarget",
    "CanaryDesign",
    "LedgerClaim",
    "audit",
    "audit_settings",
    "available_algorithms",
    "canary_design",
    "central_threshold",
    "clopper_pearson_upper",
    "detectable_noise_divisor",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "fit_linear_test",
    "flag_probability",
    "gdp_epsilon",
    "gdp_mu_from_rates",
    "gdp_mu_lower_bound",
    "ledger_claim",
    "make_target",
    "offline_target",
    "online_target",
    "predicted_power",
    "run_audit",
    "tail_threshold",
]
