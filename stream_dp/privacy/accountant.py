"""Ledger accountants: the privacy spent is a sum over released events, never a counter.

Every released value is charged exactly once, keyed by ``(step, mechanism)``. Charging the same
event again (a replay after a crash re-publishes the identical release, SPEC §8) is free;
charging a *different* event for an already charged step is refused, because two independent
noisy releases of one iterate cost twice. A charge that would overrun the budget is refused
with :class:`BudgetExhausted` and the ledger is left untouched.

"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterable

import numpy as np

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


_MECH_CODES = {"gaussian": 0, "laplace": 1, "gaussian-approx": 2}
_MECH_NAMES = {v: k for k, v in _MECH_CODES.items()}
_GAUSSIAN = _MECH_CODES["gaussian"]
# A sum this far below the budget is below it whatever the rounding of the running total (a few
# ulps at most): 1e-9 relative is millions of ulps.
_CLEARLY_BELOW = 1.0 - 1e-9


class _Ledger:
    """Columnar storage of charges: ~25 bytes per charge instead of a Python object each.

    A long stream releases at every step, so the ledger is the one structure that grows with
    the stream; it is kept as typed arrays (step, mechanism, sensitivity, scale, and for
    (ε, δ) events ε and δ). Events are rebuilt on demand by :attr:`ledger`. Charges arrive in
    non-decreasing step order (a step may carry several mechanisms), which lets a replayed
    charge be found by bisection instead of a per-charge dictionary.
    """

    _kinds: tuple[type, ...] = ()

    def __init__(self) -> None:
        self._steps = array("q")
        self._mech = array("b")
        self._sens = array("d")
        self._scale = array("d")
        self._eps = array("d")  # only ApproxDPEvent
        self._delta = array("d")  # only ApproxDPEvent
        # Shewchuk partials of the exact sum of the ledger's costs: fsum(partials) equals
        # fsum(costs of every event) bit for bit, at O(1) amortised cost per charge. This is not
        # a second counter: it is rebuilt from the ledger on load and checked by verify().
        self._partials: list[float] = []

    def _event(self, i: int) -> Event:
        mech = _MECH_NAMES[self._mech[i]]
        step, sens, scale = int(self._steps[i]), self._sens[i], self._scale[i]
        if mech == "gaussian":
            return GaussianEvent(step=step, sensitivity=sens, sigma=scale)
        if mech == "laplace":
            return LaplaceEvent(step=step, sensitivity=sens, scale=scale)
        return ApproxDPEvent(
            step=step, sensitivity=sens, scale=scale, epsilon=self._eps[i], delta=self._delta[i]
        )

    @property
    def ledger(self) -> tuple[Event, ...]:
        """Every charge, in the order it was made (rebuilt as event objects: O(n))."""
        return tuple(self._event(i) for i in range(len(self._steps)))

    def __len__(self) -> int:
        return len(self._steps)

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
        return math.fsum(self._cost(e) for e in self.ledger) == self._total()

    def _budget(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def can_afford(self, cost: float) -> bool:
        return self._total([cost]) <= self._budget()

    def charged(self, step: int, mechanism: str) -> Event | None:
        """The event charged for ``(step, mechanism)``, if any."""
        code = _MECH_CODES.get(mechanism)
        steps = self._steps
        i = bisect.bisect_left(steps, step)
        while i < len(steps) and steps[i] == step:
            if self._mech[i] == code:
                return self._event(i)
            i += 1
        return None

    def charge(self, event: Event) -> Event:
        """Record one release; idempotent for an identical replay of the same step."""
        if not isinstance(event, self._kinds):
            raise TypeError(f"{type(self).__name__} cannot compose {type(event).__name__}")
        last = self._steps[-1] if self._steps else None
        if last is not None and event.step <= last:
            previous = self.charged(event.step, event.mechanism)
            if previous is not None:
                if previous == event:
                    return previous
                raise DoubleCharge(
                    f"step {event.step} was already charged with {previous}; refusing {event}"
                )
            if event.step < last:
                raise ValueError(
                    f"charges must arrive in step order: step {event.step} after step {last}"
                )
        cost = self._cost(event)
        if not self.can_afford(cost):
            raise BudgetExhausted(
                f"release at step {event.step} costs {cost:.3g} but only "
                f"{max(self._budget() - self._total(), 0.0):.3g} of the budget remains"
            )
        self._append(event)
        return event

    def _append(self, event: Event) -> None:
        self._steps.append(int(event.step))
        self._mech.append(_MECH_CODES[event.mechanism])
        self._sens.append(float(event.sensitivity))
        scale = event.sigma if isinstance(event, GaussianEvent) else event.scale
        self._scale.append(float(scale))
        if isinstance(event, ApproxDPEvent):
            self._eps.append(float(event.epsilon))
            self._delta.append(float(event.delta))
        else:
            self._eps.append(math.nan)
            self._delta.append(math.nan)
        self._accumulate(self._cost(event))

    def nbytes(self) -> int:
        """Memory held by the ledger's columns."""
        cols = (self._steps, self._mech, self._sens, self._scale, self._eps, self._delta)
        return sum(c.itemsize * len(c) for c in cols)

    def _columns(self) -> dict:
        return {
            "step": np.frombuffer(self._steps, dtype=np.int64).copy(),
            "mechanism": np.frombuffer(self._mech, dtype=np.int8).copy(),
            "sensitivity": np.frombuffer(self._sens, dtype=np.float64).copy(),
            "scale": np.frombuffer(self._scale, dtype=np.float64).copy(),
            "epsilon": np.frombuffer(self._eps, dtype=np.float64).copy(),
            "delta": np.frombuffer(self._delta, dtype=np.float64).copy(),
        }

    def _load(self, d: dict) -> None:
        if "columns" in d:
            c = d["columns"]
            n = len(c["step"])
            for i in range(n):
                code = int(c["mechanism"][i])
                mech = _MECH_NAMES[code]
                step, sens, scale = (
                    int(c["step"][i]),
                    float(c["sensitivity"][i]),
                    float(c["scale"][i]),
                )
                if mech == "gaussian":
                    ev: Event = GaussianEvent(step=step, sensitivity=sens, sigma=scale)
                elif mech == "laplace":
                    ev = LaplaceEvent(step=step, sensitivity=sens, scale=scale)
                else:
                    ev = ApproxDPEvent(
                        step=step,
                        sensitivity=sens,
                        scale=scale,
                        epsilon=float(c["epsilon"][i]),
                        delta=float(c["delta"][i]),
                    )
                self._append(ev)
        else:  # the list-of-dicts form (older checkpoints, hand-written ledgers)
            for e in d.get("events", []):
                self._append(event_from_dict(e))


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

    def charge_gaussian(self, step: int, sensitivity: float, sigma: float) -> None:
        """``charge(GaussianEvent(step, sensitivity, sigma))`` without building the event.

        The one-release-per-record path: a new step, valid values and an affordable cost are
        appended directly — the same columns, the same cost ``Δ²/(2σ²)`` and the same
        partials as :meth:`charge`, bit for bit. Anything else (a replay, a step out of order,
        invalid values, a refusal) goes through :meth:`charge`, which decides and raises.

        Examples
        --------
        >>> acc = ZCDPAccountant(epsilon=1.0, delta=1e-5)
        >>> acc.charge_gaussian(1, 0.1, 1.0)
        >>> acc.ledger == (GaussianEvent(step=1, sensitivity=0.1, sigma=1.0),)
        True

        """
        steps = self._steps
        if (
            type(step) is not int
            or (steps and step <= steps[-1])
            or not (0.0 <= sensitivity < math.inf and sigma > 0.0)
        ):
            self.charge(GaussianEvent(step=step, sensitivity=sensitivity, sigma=sigma))
            return
        cost = sensitivity**2 / (2.0 * sigma**2)  # GaussianEvent.rho, the same expression
        partials = self._partials
        budget = self.rho_budget
        # The last partial is the running sum to within an ulp, so far below the budget the
        # exact test (an fsum over the partials) cannot fail; near it, the exact test decides.
        if not (partials and partials[-1] + cost <= budget * _CLEARLY_BELOW) and not (
            math.fsum([*partials, cost]) <= budget
        ):
            self.charge(GaussianEvent(step=step, sensitivity=sensitivity, sigma=sigma))
            return
        steps.append(step)
        self._mech.append(_GAUSSIAN)
        self._sens.append(sensitivity)
        self._scale.append(sigma)
        self._eps.append(math.nan)
        self._delta.append(math.nan)
        self._accumulate(cost)

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
            "columns": self._columns(),
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
        return {"kind": "pure", "epsilon": self.epsilon, "columns": self._columns()}

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
        deltas = math.fsum([*self._delta, event.delta])
        if deltas > self.delta and self.charged(event.step, event.mechanism) is None:
            raise BudgetExhausted(f"δ budget {self.delta} would be exceeded ({deltas})")
        return super().charge(event)

    def spent(self) -> tuple[float, float]:
        return self._total(), math.fsum(self._delta)

    def to_dict(self) -> dict:
        return {
            "kind": "approx",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "columns": self._columns(),
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
    acc._load(d)
    if acc._total() > acc._budget():
        raise ValueError("the stored ledger exceeds its own budget: refusing to load it")
    return acc
