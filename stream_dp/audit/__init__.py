"""Empirical differential-privacy audit (``stream-dp audit``).

See :mod:`stream_dp.audit.core` for the canary design and :mod:`stream_dp.audit.stats` for the
Clopper–Pearson lower bound on ε.

Examples
--------
>>> from stream_dp.audit import audit
>>> result = audit("onpairstrc", epsilon=1.0, delta=1e-5, trials=200, dim=4, seed=0)
>>> result.epsilon_lower_bound <= result.claimed_epsilon
True

"""

from __future__ import annotations

from stream_dp.audit.core import (
    ONLINE_ALGORITHMS,
    AuditResult,
    AuditTarget,
    CanaryDesign,
    audit,
    available_algorithms,
    canary_design,
    offline_target,
    online_target,
    run_audit,
)
from stream_dp.audit.stats import (
    clopper_pearson_upper,
    epsilon_from_rates,
    epsilon_lower_bound,
    fit_linear_test,
    select_threshold,
)

__all__ = [
    "ONLINE_ALGORITHMS",
    "AuditResult",
    "AuditTarget",
    "CanaryDesign",
    "audit",
    "available_algorithms",
    "canary_design",
    "clopper_pearson_upper",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "fit_linear_test",
    "offline_target",
    "online_target",
    "run_audit",
    "select_threshold",
]
