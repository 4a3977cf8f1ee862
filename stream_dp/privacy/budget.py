"""Privacy budgets: the filter that refuses a release which would overrun the guarantee.

Accounting is not enforcement (``docs/privacy.md``, *Accounting*): an accountant
(:mod:`.accountant`) composes every event it is given; a :class:`PrivacyBudget` decides whether a
charge may be made at all — composing it only if the exact total stays within the limit, and
raising :class:`BudgetExhausted` (ledger untouched) otherwise. A replay of an identical charge is
always accepted: it costs nothing.

The limit is in the accountant's own currency: ρ for zCDP (from the (ε, δ) target by the
chosen conversion, rounded down), ε for pure DP, ε and δ for basic (ε, δ) composition.
"""

from __future__ import annotations

import math

from stream_dp.privacy.accountant import (
    Accountant,
    ApproxDPAccountant,
    PureDPAccountant,
    ZCDPAccountant,
    accountant_from_dict,
)
from stream_dp.privacy.conversions import Conversion, rho_from_epsilon
from stream_dp.privacy.events import ApproxDPEvent, Event, GaussianEvent, GaussianEvents

__all__ = [
    "BudgetExhausted",
    "BudgetSlice",
    "PrivacyBudget",
    "approx_budget",
    "budget_from_dict",
    "budget_or_slice_from_dict",
    "pure_budget",
    "zcdp_budget",
]

# A total this far below the limit is below it whatever the rounding of the running total (a few
# hundred ulps at most): 1e-9 relative is millions of ulps.
_CLEARLY_BELOW = 1.0 - 1e-9
_INF = math.inf


class BudgetExhausted(RuntimeError):
    """A release was refused because it would exceed the privacy budget."""


class PrivacyBudget:
    """An accountant and the limit its total may not exceed.

    Parameters
    ----------
    accountant
        Composes what is charged (:mod:`stream_dp.privacy.accountant`).
    limit
        The most its total may reach (ρ, or ε for the pure and (ε, δ) accountants).
    epsilon, delta
        The (ε, δ) target the limit was derived from (reported in releases and ``describe()``).
    delta_limit
        For an (ε, δ) accountant: the most its δ may reach.

    Examples
    --------
    >>> from stream_dp.privacy.events import GaussianEvent
    >>> budget = zcdp_budget(epsilon=1.0, delta=1e-5)
    >>> _ = budget.charge(GaussianEvent(step=1, sensitivity=1.0, sigma=10.0))
    >>> budget.accountant.rho_spent() < budget.limit
    True
    >>> budget.charge(GaussianEvent(step=2, sensitivity=1.0, sigma=0.01))
    Traceback (most recent call last):
    ...
    stream_dp.privacy.budget.BudgetExhausted: release at step 2 costs 5e+03 but only ...

    """

    def __init__(
        self,
        accountant: Accountant,
        limit: float,
        epsilon: float,
        delta: float = 0.0,
        delta_limit: float | None = None,
    ) -> None:
        if not (limit > 0 and math.isfinite(limit)):
            raise ValueError(f"a budget limit must be positive and finite, got {limit!r}")
        self.accountant = accountant
        self.limit = float(limit)
        self._clearly_below = self.limit * _CLEARLY_BELOW
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.delta_limit = delta_limit

    @property
    def rho_budget(self) -> float:
        """The ρ limit of a zCDP budget."""
        if not isinstance(self.accountant, ZCDPAccountant):
            raise AttributeError("only a zCDP budget has a ρ limit")
        return self.limit

    def remaining(self) -> float:
        """What is left of the limit (never negative)."""
        return max(self.limit - self.accountant.total(), 0.0)

    def can_afford(self, cost: float) -> bool:
        """Whether one more charge of ``cost`` keeps the exact total within the limit."""
        return self.accountant.total([cost]) <= self.limit

    def charge(self, event: Event | GaussianEvents) -> Event | GaussianEvents:
        """Compose ``event`` (or a batch) if the budget allows it — a replay always does; else
        raise :class:`BudgetExhausted` and leave the ledger untouched (a batch is refused
        whole).

        Far below the limit a float test with a 1e-9 margin decides; near it, the exact sum
        does, so a charge is refused exactly when the exact total would pass the limit.
        """
        acc = self.accountant
        if type(event) is GaussianEvents:
            return self._charge_batch(event)
        cost = acc.cost(event)
        if not event.step > acc.storage.last_step:
            previous = acc.replayed(event)
            if previous is not None:
                return previous
        if not acc.approximate_total + cost <= self._clearly_below:
            if not acc.total([cost]) <= self.limit:
                raise BudgetExhausted(
                    f"release at step {event.step} costs {cost:.3g} but only "
                    f"{self.remaining():.3g} of the budget remains"
                )
        if self.delta_limit is not None and type(event) is ApproxDPEvent:
            deltas = acc.delta_spent([event.delta])
            if deltas > self.delta_limit:
                raise BudgetExhausted(f"δ budget {self.delta_limit} would be exceeded ({deltas})")
        acc.record(event, cost)
        return event

    def charge_gaussian(self, step: int, sensitivity: float, sigma: float) -> None:
        """``charge(GaussianEvent(step, sensitivity, sigma))``, for a release at every record:
        the common case (a new step, valid parameters, a zCDP accountant, the budget clearly
        not reached) without building the event; anything else goes through :meth:`charge`,
        which decides it."""
        acc = self.accountant
        if (
            type(step) is int
            and step > acc.storage.last_step
            and 0.0 <= sensitivity < _INF
            and sigma > 0.0
            and type(acc) is ZCDPAccountant  # (a subclass may compose or store otherwise)
        ):
            cost = acc.gaussian_cost(sensitivity, sigma)
            if acc.approximate_total + cost <= self._clearly_below:
                acc.record_gaussian(step, sensitivity, sigma, cost)
                return
        self.charge(GaussianEvent(step, sensitivity, sigma))

    def _charge_batch(self, batch: GaussianEvents) -> GaussianEvents:
        acc = self.accountant
        costs = acc.costs(batch)
        if not costs:
            return batch
        if not batch.steps[0] > acc.storage.last_step:  # a replay among them: one by one
            for event in batch.events():
                self.charge(event)
            return batch
        if not acc.total(costs) <= self.limit:
            raise BudgetExhausted(
                f"releases at steps {batch.steps[0]}…{batch.steps[-1]} cost {sum(costs):.3g} "
                f"but only {self.remaining():.3g} of the budget remains"
            )
        acc.record(batch, costs)
        return batch

    def slice(self, share: float, mechanism: str) -> BudgetSlice:
        """A ``share`` of this budget for the component charging under ``mechanism``."""
        return BudgetSlice(self, share, mechanism)

    def certain_charges(self, cost: float) -> int:
        """How many further charges of at most ``cost`` each surely fit (factor 2 of slack)."""
        if not cost > 0:
            return 0
        return int(self.remaining() / (2.0 * cost))

    def to_dict(self) -> dict:
        return {
            "limit": self.limit,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "delta_limit": self.delta_limit,
            "accountant": self.accountant.to_dict(),
        }

    def __repr__(self) -> str:
        return f"PrivacyBudget(limit={self.limit:.4g}, ε={self.epsilon}, {self.accountant!r})"


class BudgetSlice:
    """A share of a zCDP budget for one component that charges it under its own mechanism name.

    Several components can spend one budget — a model's releases, a private scaler in front of
    it, private operator metrics — each within its share: a charge is refused when it would take
    the component's own total (the costs of the ledger's events under its mechanism name) past
    ``share·limit``, or the whole budget past its limit. The charges go to the one shared
    ledger, so ``accountant.spent()`` is the guarantee of everything together.

    Examples
    --------
    >>> from stream_dp.privacy.events import GaussianEvent
    >>> budget = zcdp_budget(epsilon=4.0, delta=1e-5)
    >>> scaler = budget.slice(0.1, "gaussian-scaler")
    >>> event = scaler.charge(GaussianEvent(1, 1.0, 40.0, "gaussian-scaler"))
    >>> budget.accountant.cost(event) <= scaler.limit
    True
    >>> scaler.charge(GaussianEvent(2, 1.0, 1.0, "gaussian-scaler"))
    Traceback (most recent call last):
    ...
    stream_dp.privacy.budget.BudgetExhausted: release at step 2 costs 0.5 but only ...

    """

    def __init__(self, parent: PrivacyBudget, share: float, mechanism: str) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"a budget share is in (0, 1], got {share!r}")
        if not isinstance(parent.accountant, ZCDPAccountant):
            raise TypeError("only a zCDP budget can be shared between components")
        self.parent = parent
        self.share = float(share)
        self.mechanism = mechanism
        self.limit = parent.limit * self.share
        self.epsilon, self.delta = parent.epsilon, parent.delta
        self._own = ZCDPAccountant(parent.delta)  # this component's costs, for its share only
        for event in parent.accountant.ledger:
            if event.mechanism == mechanism:
                self._own.compose(event)

    @property
    def accountant(self) -> ZCDPAccountant:
        """The shared ledger."""
        return self.parent.accountant

    def remaining(self) -> float:
        return max(min(self.limit - self._own.total(), self.parent.remaining()), 0.0)

    def can_afford(self, cost: float) -> bool:
        return self._own.total([cost]) <= self.limit and self.parent.can_afford(cost)

    def charge(self, event: Event | GaussianEvents) -> Event | GaussianEvents:
        """:meth:`PrivacyBudget.charge` within this component's share (and the whole budget)."""
        if event.mechanism != self.mechanism:
            raise ValueError(f"this share charges {self.mechanism!r}, not {event.mechanism!r}")
        acc = self.accountant
        if type(event) is GaussianEvents:
            costs = acc.costs(event)
            if not costs:
                return event
            if not event.steps[0] > acc.storage.last_step:  # a replay among them
                for one in event.events():
                    self.charge(one)
                return event
            first = event.steps[0]
        else:
            costs = [acc.cost(event)]
            first = event.step
            previous = acc.replayed(event)
            if previous is not None:
                return previous
        if not self._own.total(costs) <= self.limit:
            raise BudgetExhausted(
                f"release at step {first} costs {math.fsum(costs):.3g} but only "
                f"{self.remaining():.3g} of this component's share remains"
            )
        charged = self.parent.charge(event)
        self._own.compose(event)
        return charged

    def certain_charges(self, cost: float) -> int:
        if not cost > 0:
            return 0
        return int(self.remaining() / (2.0 * cost))

    def to_dict(self) -> dict:
        return {"share": self.share, "mechanism": self.mechanism, "parent": self.parent.to_dict()}


def zcdp_budget(epsilon: float, delta: float, conversion: Conversion = "tight") -> PrivacyBudget:
    """A zCDP budget for an (ε, δ) target: ρ from the conversion, rounded down.

    Examples
    --------
    >>> b = zcdp_budget(1.0, 1e-5)
    >>> round(b.limit, 4), b.accountant.delta
    (0.0306, 1e-05)

    """
    _check_target(epsilon, delta)
    rho = rho_from_epsilon(float(epsilon), float(delta), conversion)
    return PrivacyBudget(ZCDPAccountant(delta, conversion), rho, epsilon, delta)


def pure_budget(epsilon: float) -> PrivacyBudget:
    """A pure ε-DP budget (Laplace releases)."""
    _check_target(epsilon, 0.5)
    return PrivacyBudget(PureDPAccountant(), epsilon, epsilon, 0.0)


def approx_budget(epsilon: float, delta: float) -> PrivacyBudget:
    """An (ε, δ) budget under basic composition."""
    _check_target(epsilon, delta)
    return PrivacyBudget(ApproxDPAccountant(), epsilon, epsilon, delta, delta_limit=delta)


def _check_target(epsilon: float, delta: float) -> None:
    if isinstance(epsilon, bool) or not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if isinstance(delta, bool) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def budget_from_dict(d: dict) -> PrivacyBudget:
    """Rebuild a budget and its accountant from ``to_dict()`` output.

    Also reads the older checkpoint form, in which the accountant carried its own (ε, δ)
    budget. A stored ledger above its own limit is refused.
    """
    if "accountant" in d:
        acc = accountant_from_dict(d["accountant"])
        limit, epsilon, delta = d["limit"], d["epsilon"], d["delta"]
        delta_limit = d.get("delta_limit")
    else:
        kind = str(d.get("kind", "")).removeprefix("journal:")
        acc = accountant_from_dict({**d, "delta": d.get("delta", 0.5)} if kind != "zcdp" else d)
        epsilon, delta = d["epsilon"], d.get("delta", 0.0)
        limit = (
            rho_from_epsilon(epsilon, delta, d.get("conversion", "tight"))
            if kind == "zcdp"
            else epsilon
        )
        delta_limit = delta if kind == "approx" else None
    budget = PrivacyBudget(acc, limit, epsilon, delta, delta_limit)
    if acc.total() > limit:
        acc.storage.close()
        raise ValueError("the stored ledger exceeds its own budget: refusing to load it")
    return budget


def budget_or_slice_from_dict(d: dict) -> PrivacyBudget | BudgetSlice:
    """:func:`budget_from_dict`, or a :class:`BudgetSlice` of the budget stored with it."""
    if "parent" in d:
        return budget_from_dict(d["parent"]).slice(d["share"], d["mechanism"])
    return budget_from_dict(d)
