"""Ledger accountants: the privacy spent is a sum over released events, never a counter.

Every released value is charged exactly once, keyed by ``(step, mechanism)``. Charging the same
event again (a replay after a crash re-publishes the identical release, SPEC §8) is free;
charging a *different* event for an already charged step is refused, because two independent
noisy releases of one iterate cost twice. A charge that would overrun the budget is refused
with :class:`BudgetExhausted` and the ledger is left untouched.

"""

from __future__ import annotations

import math
from collections.abc import Iterable

from stream_dp.privacy.conversions import Conversion, epsilon_from_rho, rho_from_epsilon
from stream_dp.privacy.events import (
    ApproxDPEvent,
    Event,
    GaussianEvent,
    LaplaceEvent,
    event_from_dict,
)

__all__ = [
    "BudgetExhausted",
    "DoubleCharge",
    "ZCDPAccountant",
    "PureDPAccountant",
    "ApproxDPAccountant",
    "accountant_from_dict",
]


class BudgetExhausted(RuntimeError):
    """A release was refused because it would exceed the privacy budget."""


class DoubleCharge(RuntimeError):
    """A step was charged twice with different events (two independent releases of one step)."""


class _Ledger:
    _kinds: tuple[type, ...] = ()

    def __init__(self) -> None:
        self._ledger: list[Event] = []
        self._index: dict[tuple[int, str], Event] = {}
        # Shewchuk partials of the exact sum of the ledger's costs: fsum(partials) equals
        # fsum(costs of every event) bit for bit, at O(1) amortised cost per charge. This is not
        # a second counter: it is rebuilt from the ledger on load and checked by verify().
        self._partials: list[float] = []

    @property
    def ledger(self) -> tuple[Event, ...]:
        """Every charge, in the order it was made."""
        return tuple(self._ledger)

    def __len__(self) -> int:
        return len(self._ledger)

    def _cost(self, event: Event) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def _total(self, extra: Iterable[float] = ()) -> float:
        return math.fsum([*self._partials, *extra])

    def _accumulate(self, x: float) -> None:
        # Shewchuk's grow-expansion (the algorithm behind math.fsum), kept incrementally.
        partials = self._partials
        i = 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]

    def verify(self) -> bool:
        """Recompute the total from the ledger entries and compare (it must be identical)."""
        return math.fsum(self._cost(e) for e in self._ledger) == self._total()

    def _budget(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def can_afford(self, cost: float) -> bool:
        return self._total([cost]) <= self._budget()

    def charge(self, event: Event) -> Event:
        """Record one release; idempotent for an identical replay of the same step."""
        if not isinstance(event, self._kinds):
            raise TypeError(f"{type(self).__name__} cannot compose {type(event).__name__}")
        key = (event.step, event.mechanism)
        previous = self._index.get(key)
        if previous is not None:
            if previous == event:
                return previous
            raise DoubleCharge(
                f"step {event.step} was already charged with {previous}; refusing {event}"
            )
        if not self.can_afford(self._cost(event)):
            raise BudgetExhausted(
                f"release at step {event.step} costs {self._cost(event):.3g} but only "
                f"{max(self._budget() - self._total(), 0.0):.3g} of the budget remains"
            )
        self._ledger.append(event)
        self._index[key] = event
        self._accumulate(self._cost(event))
        return event

    def charged(self, step: int, mechanism: str) -> Event | None:
        return self._index.get((step, mechanism))

    def _events_to_list(self) -> list[dict]:
        return [e.to_dict() for e in self._ledger]

    def _load_events(self, events: list[dict]) -> None:
        for d in events:
            ev = event_from_dict(d)
            self._ledger.append(ev)
            self._index[(ev.step, ev.mechanism)] = ev
            self._accumulate(self._cost(ev))


class ZCDPAccountant(_Ledger):
    """A ρ-zCDP ledger with an (ε, δ) budget.

    Parameters
    ----------
    epsilon, delta
        The (ε, δ) budget. ``rho_budget`` is derived with ``conversion``.
    conversion
        ``"tight"`` (default) or ``"paper"``; see :mod:`stream_dp.privacy.conversions`.

    Examples
    --------
    >>> from stream_dp.privacy import GaussianEvent
    >>> acc = ZCDPAccountant(epsilon=1.0, delta=1e-5)
    >>> _ = acc.charge(GaussianEvent(step=1, sensitivity=0.1, sigma=1.0))
    >>> round(acc.rho_spent(), 12)
    0.005
    >>> eps, delta = acc.spent()
    >>> 0 < eps < 1.0, delta
    (True, 1e-05)

    """

    _kinds = (GaussianEvent, LaplaceEvent)

    def __init__(self, epsilon: float, delta: float, conversion: Conversion = "tight") -> None:
        super().__init__()
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.conversion = conversion
        self.rho_budget = rho_from_epsilon(self.epsilon, self.delta, conversion)

    def _cost(self, event: Event) -> float:
        return event.rho

    def _budget(self) -> float:
        return self.rho_budget

    def rho_spent(self) -> float:
        """Σρ over the ledger (math.fsum: correctly rounded)."""
        return self._total()

    def remaining_rho(self) -> float:
        return max(self.rho_budget - self.rho_spent(), 0.0)

    def spent(self) -> tuple[float, float]:
        """The (ε, δ) guarantee of everything released so far."""
        return epsilon_from_rho(self.rho_spent(), self.delta, self.conversion), self.delta

    def to_dict(self) -> dict:
        return {
            "kind": "zcdp",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "conversion": self.conversion,
            "events": self._events_to_list(),
        }

    def __repr__(self) -> str:
        eps, _ = self.spent()
        return (
            f"ZCDPAccountant(ε={self.epsilon}, δ={self.delta}, ρ budget={self.rho_budget:.4g}, "
            f"ρ spent={self.rho_spent():.4g}, ε spent={eps:.4g}, charges={len(self)})"
        )


class PureDPAccountant(_Ledger):
    """A pure ε-DP ledger (Laplace releases); composition adds ε."""

    _kinds = (LaplaceEvent,)

    def __init__(self, epsilon: float) -> None:
        super().__init__()
        if not epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
        self.epsilon = float(epsilon)
        self.delta = 0.0

    def _cost(self, event: Event) -> float:
        return event.epsilon

    def _budget(self) -> float:
        return self.epsilon

    def epsilon_spent(self) -> float:
        return self._total()

    def spent(self) -> tuple[float, float]:
        return self._total(), 0.0

    def to_dict(self) -> dict:
        return {"kind": "pure", "epsilon": self.epsilon, "events": self._events_to_list()}

    def __repr__(self) -> str:
        return f"PureDPAccountant(ε={self.epsilon}, ε spent={self._total():.4g})"


class ApproxDPAccountant(_Ledger):
    """An (ε, δ) ledger with basic composition, for releases calibrated directly to (ε, δ)."""

    _kinds = (ApproxDPEvent,)

    def __init__(self, epsilon: float, delta: float) -> None:
        super().__init__()
        self.epsilon = float(epsilon)
        self.delta = float(delta)

    def _cost(self, event: Event) -> float:
        return event.epsilon

    def _budget(self) -> float:
        return self.epsilon

    def charge(self, event: Event) -> Event:
        deltas = math.fsum([e.delta for e in self._ledger] + [event.delta])  # few events offline
        if deltas > self.delta and (event.step, event.mechanism) not in self._index:
            raise BudgetExhausted(f"δ budget {self.delta} would be exceeded ({deltas})")
        return super().charge(event)

    def spent(self) -> tuple[float, float]:
        return self._total(), math.fsum(e.delta for e in self._ledger)

    def to_dict(self) -> dict:
        return {
            "kind": "approx",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "events": self._events_to_list(),
        }

    def __repr__(self) -> str:
        e, d = self.spent()
        return f"ApproxDPAccountant(ε={self.epsilon}, δ={self.delta}, spent=({e:.4g}, {d:.3g}))"


def accountant_from_dict(d: dict) -> ZCDPAccountant | PureDPAccountant | ApproxDPAccountant:
    """Rebuild an accountant, with its whole ledger, from ``to_dict()`` output."""
    kind = d.get("kind")
    acc: ZCDPAccountant | PureDPAccountant | ApproxDPAccountant
    if kind == "zcdp":
        acc = ZCDPAccountant(d["epsilon"], d["delta"], d["conversion"])
    elif kind == "pure":
        acc = PureDPAccountant(d["epsilon"])
    elif kind == "approx":
        acc = ApproxDPAccountant(d["epsilon"], d["delta"])
    else:
        raise ValueError(f"unknown accountant kind {kind!r}")
    acc._load_events(d["events"])
    if acc._total() > acc._budget():
        raise ValueError("the stored ledger exceeds its own budget: refusing to load it")
    return acc
