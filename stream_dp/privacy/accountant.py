"""Accountants read privacy events and compose them: the privacy spent is a sum over the ledger.

Modelled on Google's ``dp_accounting``: events (:mod:`.events`) are parameter records; an
accountant says which kinds it reads (:meth:`Accountant.supports`), what one event costs in its
currency (:meth:`Accountant.cost`: ρ for zCDP, ε for pure DP, ε and δ for basic (ε, δ)
composition), composes events (:meth:`Accountant.compose`, also for the batch form
:class:`~.events.GaussianEvents`) and reports the guarantee (``spent()``). It keeps every event
in its :class:`~.ledger.Ledger` and the exact (Shewchuk) partial sums of their costs, which are
rebuilt from the ledger on load and checked by :meth:`Accountant.verify`. It never refuses a
charge for the budget: enforcing a budget is :class:`stream_dp.privacy.budget.PrivacyBudget`'s
job.

Every released value is composed exactly once, keyed by ``(step, mechanism)``. Composing the same
event again (a replay after a crash re-publishes the identical release, ``docs/privacy.md``,
*Keyed noise and replay*) is free; a *different* event for an already charged step is refused
with :class:`DoubleCharge`, because two independent noisy releases of one iterate cost twice.

Another accounting of the same events is a subclass of :class:`Accountant` that names the kinds
it reads (``events``), the cost of each (``gaussian_cost``, ``laplace_cost``, ``approx_cost``:
costs that add up under composition) and ``spent()``; storage, replays, exact sums and
checkpoints come with the base class.

"""

from __future__ import annotations

import math
from collections.abc import Iterable

from stream_dp.privacy.conversions import (
    CONVERSIONS,
    ZCDP_CONVERSIONS,
    Conversion,
    epsilon_from_rho,
)
from stream_dp.privacy.events import (
    GAUSSIAN_MECHANISMS,
    ApproxDPEvent,
    Event,
    GaussianEvent,
    GaussianEvents,
    LaplaceEvent,
    NeighbouringRelation,
    event_from_dict,
    gaussian_rho,
)
from stream_dp.privacy.exact_sum import grow
from stream_dp.privacy.journal import JournalError
from stream_dp.privacy.ledger import APPROX, GAUSSIAN, GAUSSIAN_CODES, LAPLACE, Ledger

__all__ = [
    "Accountant",
    "ApproxDPAccountant",
    "DoubleCharge",
    "JournalError",
    "PureDPAccountant",
    "ZCDPAccountant",
    "accountant_from_dict",
]

_FOLD_EVERY = 1024  # costs composed are folded into the exact partials in batches of this
_INF = math.inf
_GAUSSIAN_NAMES = frozenset(GAUSSIAN_MECHANISMS)


class DoubleCharge(RuntimeError):
    """A step was charged twice with different events (two independent releases of one step)."""


def _invalid(event) -> ValueError:
    return ValueError(f"not a valid release: {event!r}")


class Accountant:
    """Composition over a ledger; a subclass says which events it reads and what each costs."""

    #: The ledger kind this accountant writes (checkpoints and journals record it).
    kind = ""
    #: The event kinds it reads (:class:`~.events.GaussianEvents` is read as its rows).
    events: tuple[type, ...] = ()
    #: The neighbouring relation every composed event is calibrated for.
    neighbouring_relation = NeighbouringRelation.REPLACE_ONE
    #: False when the charges were made with a guessable (reproducible) seed: the arithmetic is
    #: the same, but nothing the ledger pays for is private (see ``stream_dp.privacy.secrets``).
    private: bool = True

    def __init__(self) -> None:
        #: Every composed event (storage: chunks in memory or in a journal).
        self.storage = Ledger(self.kind)
        # Shewchuk partials of the exact sum of the costs: fsum(partials) equals the fsum of
        # every event's cost bit for bit, at O(1) amortised cost per event. Not a second
        # counter: rebuilt from the ledger on load and checked by verify().
        self._exact: list[float] = []
        # Costs composed and not yet folded into the partials (at most _FOLD_EVERY, in
        # composition order).
        self._pending: list[float] = []
        #: The total to within ~1024 ulps, kept without folding: the top partial at the last
        #: fold plus the pending costs, added as they come (for a budget's fast test far from
        #: its limit).
        self.approximate_total = 0.0
        self._dpartials: list[float] = []  # the same for the δ of (ε, δ) events

    # -- reading events -------------------------------------------------------------------------
    def supports(self, event: Event | GaussianEvents) -> bool:
        """Whether this accountant reads events of ``event``'s kind."""
        kind = GaussianEvent if type(event) is GaussianEvents else type(event)
        return kind in self.events

    def gaussian_cost(self, sensitivity: float, sigma: float) -> float:
        """The cost of a Gaussian release (Δ, σ); a subclass that reads them defines it."""
        raise TypeError(f"{type(self).__name__} cannot compose GaussianEvent")

    def laplace_cost(self, sensitivity: float, scale: float) -> float:
        """The cost of a Laplace release (Δ₁, b); a subclass that reads them defines it."""
        raise TypeError(f"{type(self).__name__} cannot compose LaplaceEvent")

    def approx_cost(self, epsilon: float, delta: float) -> float:
        """The cost of an (ε, δ) release; a subclass that reads them defines it."""
        raise TypeError(f"{type(self).__name__} cannot compose ApproxDPEvent")

    def cost(self, event: Event) -> float:
        """What one event costs in this accountant's currency, its parameters checked first.

        Raises ``TypeError`` for a kind it does not read and ``ValueError`` for parameters that
        describe no release (a negative or infinite sensitivity, σ ≤ 0, an unknown name).
        """
        kind = type(event)
        if kind is GaussianEvent:  # one per record on the per-record path: kept lean
            step, sens, sigma, name = event
            if not (0.0 <= sens < _INF and sigma > 0.0 and name in _GAUSSIAN_NAMES) or (
                type(step) is not int
            ):
                raise _invalid(event)
            return self.gaussian_cost(sens, sigma)
        if kind is LaplaceEvent:
            step, sens, scale, name = event
            if not (0.0 <= sens < _INF and scale > 0.0 and name == "laplace") or (
                type(step) is not int
            ):
                raise _invalid(event)
            return self.laplace_cost(sens, scale)
        if kind is ApproxDPEvent:
            if event.mechanism != "gaussian-approx" or type(event.step) is not int:
                raise _invalid(event)
            return self.approx_cost(event.epsilon, event.delta)
        raise TypeError(f"{type(self).__name__} cannot compose {kind.__name__}")

    def costs(self, batch: GaussianEvents) -> list[float]:
        """The cost of each release of a batch, in order (its parameters checked first)."""
        if GaussianEvent not in self.events:
            raise TypeError(f"{type(self).__name__} cannot compose GaussianEvents")
        sens, sigmas = batch.sensitivities.tolist(), batch.sigmas.tolist()
        steps = batch.steps
        if (
            batch.mechanism not in _GAUSSIAN_NAMES
            or not len(steps) == len(sens) == len(sigmas)
            or not all(0.0 <= s < _INF for s in sens)
            or not all(g > 0.0 for g in sigmas)
            or getattr(steps, "dtype", None) is None
            or steps.dtype.kind not in "iu"
            or (len(steps) > 1 and bool((steps[1:] < steps[:-1]).any()))
        ):
            raise ValueError(f"not a valid batch of releases under {batch.mechanism!r}")
        cost = self.gaussian_cost
        return [cost(s, g) for s, g in zip(sens, sigmas, strict=True)]

    def _row_cost(self, code: int, sens: float, scale: float, eps: float, delta: float) -> float:
        if code in GAUSSIAN_CODES:
            return self.gaussian_cost(sens, scale)
        if code == LAPLACE:
            return self.laplace_cost(sens, scale)
        return self.approx_cost(eps, delta)

    # -- composition ----------------------------------------------------------------------------
    def replayed(self, event: Event) -> Event | None:
        """The identical event already composed for the same step (a replay), else None.

        Raises :class:`DoubleCharge` for a different event at a charged ``(step, mechanism)``
        and ``ValueError`` for a step before the last one.
        """
        last = self.storage.last_step
        if event.step > last:
            return None
        previous = self.storage.charged(event.step, event.mechanism)
        if previous is not None:
            if previous == event and type(previous) is type(event):
                return previous
            raise DoubleCharge(
                f"step {event.step} was already charged with {previous}; refusing {event}"
            )
        if event.step < last:
            raise ValueError(
                f"charges must arrive in step order: step {event.step} after step {last}"
            )
        return None

    def compose(self, event: Event | GaussianEvents) -> Event | GaussianEvents:
        """Compose one release, or a batch (idempotent for an identical replay of a step)."""
        if type(event) is GaussianEvents:
            costs = self.costs(event)
            if len(event.steps) and event.steps[0] > self.storage.last_step:
                self.record(event, costs)
            else:  # a replay among them: one by one, each decided as compose decides it
                for one in event.events():
                    self.compose(one)
            return event
        cost = self.cost(event)
        previous = self.replayed(event)
        if previous is not None:
            return previous
        self.record(event, cost)
        return event

    def record(self, event: Event | GaussianEvents, cost: float | list[float]) -> None:
        """Store an event (a batch: with the list of its costs) that :meth:`cost` has read and
        :meth:`replayed` found new, and add its cost to the exact total; what :meth:`compose`
        does after its checks, and what a budget does once it has accepted a charge."""
        self.storage.append(event)
        pending = self._pending
        if type(cost) is list:
            pending.extend(cost)
            total = self.approximate_total
            for c in cost:
                total += c
            self.approximate_total = total
        else:
            pending.append(cost)
            self.approximate_total += cost
            if type(event) is ApproxDPEvent:
                grow(self._dpartials, float(event.delta))
        if len(pending) >= _FOLD_EVERY:
            self._fold()

    def record_gaussian(self, step: int, sensitivity: float, sigma: float, cost: float) -> None:
        """:meth:`record` of ``GaussianEvent(step, sensitivity, sigma)`` and its ``cost``,
        without the event: the per-record charge of a budget (:meth:`PrivacyBudget.
        charge_gaussian`), whose checks come first."""
        self.storage.append_row(step, GAUSSIAN, sensitivity, sigma)
        pending = self._pending
        pending.append(cost)
        self.approximate_total += cost
        if len(pending) >= _FOLD_EVERY:
            self._fold()

    # -- totals ---------------------------------------------------------------------------------
    @property
    def _partials(self) -> list[float]:
        if self._pending:
            self._fold()
        return self._exact

    def _fold(self) -> None:
        exact = self._exact
        for cost in self._pending:
            grow(exact, cost)
        self._pending = []
        self.approximate_total = exact[-1] if exact else 0.0

    def total(self, extra: Iterable[float] = ()) -> float:
        """The exact (correctly rounded) sum of every cost, plus ``extra`` costs."""
        return math.fsum([*self._partials, *extra])

    def mark(self) -> tuple[int, tuple[float, ...]]:
        """Where the ledger stands now, for :meth:`totals_since`: its rows and the exact partial
        sums of their costs."""
        return len(self.storage), tuple(self._partials)

    def totals_since(self, mark: tuple[int, tuple[float, ...]]) -> tuple[list[int], list[float]]:
        """The step of each row charged since ``mark`` (:meth:`mark`) and the exact total right
        after it: what :meth:`total` returned then, bit for bit (the same partials, grown by the
        same costs in the same order), for a caller that learned a batch and publishes the total
        after each of its steps."""
        rows, partials = mark
        exact = list(partials)
        steps, totals = [], []
        for step, code, sens, scale, eps, delta in self.storage.rows_since(rows):
            grow(exact, self._row_cost(code, sens, scale, eps, delta))
            steps.append(int(step))
            totals.append(math.fsum(exact))
        return steps, totals

    def verify(self) -> bool:
        """Recompute the totals from the ledger entries and compare (they must be identical)."""
        events = self.ledger
        deltas = [e.delta for e in events if isinstance(e, ApproxDPEvent)]
        return math.fsum(self.cost(e) for e in events) == self.total() and math.fsum(
            deltas
        ) == math.fsum(self._dpartials)

    # -- the ledger -----------------------------------------------------------------------------
    @property
    def ledger(self) -> tuple[Event, ...]:
        """Every composed event, in the order it was composed."""
        return self.storage.events

    def __len__(self) -> int:
        return len(self.storage)

    def charged(self, step: int, mechanism: str) -> Event | None:
        """The event composed for ``(step, mechanism)``, if any."""
        return self.storage.charged(step, mechanism)

    def nbytes(self) -> int:
        return self.storage.nbytes()

    # -- checkpoints ----------------------------------------------------------------------------
    def _params(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_dict(self) -> dict:
        params = self._params()
        if not self.private:
            params["private"] = False
        return self.storage.to_dict(**params)

    def _load(self, d: dict) -> None:
        if d.get("journal") is not None:
            for chunk in self.storage.restore_journal(d["journal"]):
                self._add_rows(chunk.rows())
        if "columns" in d:
            cols = self.storage.extend(d["columns"], self.events)
            if cols is not None:
                self._add_columns(cols)
        else:  # the list-of-dicts form (older checkpoints, hand-written ledgers)
            for e in d.get("events", []):
                event = event_from_dict(e)
                if not self.supports(event):
                    raise ValueError(f"{type(self).__name__} cannot hold {event}")
                if self.replayed(event) is not None:
                    raise ValueError(f"stored ledger repeats {event}")
                self.compose(event)

    def _add_rows(self, rows) -> None:
        row_cost, partials = self._row_cost, self._partials
        for _step, code, sens, scale, eps, delta in rows:
            grow(partials, row_cost(code, sens, scale, eps, delta))
            if code == APPROX:
                grow(self._dpartials, delta)
        self.approximate_total = partials[-1] if partials else 0.0

    def _add_columns(self, c: dict) -> None:
        # Costs in composition order, so the partials are those of composing one by one.
        rows = zip(c["mechanism"].tolist(), c["sensitivity"].tolist(), c["scale"].tolist(),
                   c["epsilon"].tolist(), c["delta"].tolist(), strict=True)  # fmt: skip
        self._add_rows((0, *r) for r in rows)


class ZCDPAccountant(Accountant):
    """Composes Gaussian (and Laplace) releases in zero-concentrated DP; reports (ε, δ).

    A Gaussian release costs ``ρ = Δ²/(2σ²)`` (Bun & Steinke 2016, Prop. 1.6), a Laplace one
    ``ε²/2`` with ``ε = Δ₁/b`` (pure ε-DP implies (ε²/2)-zCDP, Prop. 1.4); ρ-zCDP composes
    additively (Lemma 2.3), and ``spent()`` converts the total with ``conversion`` at the
    accountant's δ (:mod:`stream_dp.privacy.conversions`).

    Parameters
    ----------
    delta
        The δ at which :meth:`spent` reports ε.
    conversion
        ``"tight"`` (default), ``"paper"`` or ``"exact"``; see
        :mod:`stream_dp.privacy.conversions`. ``"exact"`` reports the exact Gaussian-DP curve
        of ``μ = √(2Σρ)``, which holds for Gaussian releases only: the accountant then
        refuses Laplace events (a ledger that must mix them keeps ``"tight"``).

    Examples
    --------
    >>> acc = ZCDPAccountant(delta=1e-5)
    >>> _ = acc.compose(GaussianEvent(step=1, sensitivity=0.1, sigma=1.0))
    >>> round(acc.rho_spent(), 12), acc.cost(GaussianEvent(2, 1.0, 2.0))
    (0.005, 0.125)
    >>> eps, delta = acc.spent()
    >>> 0 < eps < 1.0, delta
    (True, 1e-05)

    """

    kind = "zcdp"
    events = (GaussianEvent, LaplaceEvent)
    gaussian_cost = staticmethod(gaussian_rho)

    def __init__(self, delta: float, conversion: Conversion = "tight") -> None:
        super().__init__()
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if conversion not in CONVERSIONS:
            raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
        self.delta = float(delta)
        self.conversion = conversion
        if conversion not in ZCDP_CONVERSIONS:  # the GDP curve: Gaussian releases only
            self.events = (GaussianEvent,)

    def laplace_cost(self, sensitivity: float, scale: float) -> float:
        if LaplaceEvent not in self.events:
            raise TypeError(f"a ledger accounted {self.conversion!r} holds Gaussian events only")
        return (sensitivity / scale) ** 2 / 2.0

    def rho_spent(self) -> float:
        """Σρ over the ledger (math.fsum: correctly rounded)."""
        return self.total()

    def spent(self) -> tuple[float, float]:
        """The (ε, δ) guarantee of everything composed so far."""
        return epsilon_from_rho(self.rho_spent(), self.delta, self.conversion), self.delta

    def _params(self) -> dict:
        return {"delta": self.delta, "conversion": self.conversion}

    def __repr__(self) -> str:
        eps, _ = self.spent()
        flag = "" if self.private else ", NOT PRIVATE: reproducible seed"
        return (
            f"ZCDPAccountant(δ={self.delta}, ρ spent={self.rho_spent():.4g}, ε spent={eps:.4g} "
            f"({self.conversion}), charges={len(self)}{flag})"
        )


class PureDPAccountant(Accountant):
    """Composes pure ε-DP (Laplace) releases: one costs ``ε = Δ₁/b``, and composition adds ε.

    Examples
    --------
    >>> acc = PureDPAccountant()
    >>> _ = acc.compose(LaplaceEvent(step=1, sensitivity=1.0, scale=4.0))
    >>> acc.spent()
    (0.25, 0.0)

    """

    kind = "pure"
    events = (LaplaceEvent,)

    def laplace_cost(self, sensitivity: float, scale: float) -> float:
        return sensitivity / scale

    def epsilon_spent(self) -> float:
        return self.total()

    def spent(self) -> tuple[float, float]:
        return self.total(), 0.0

    def _params(self) -> dict:
        return {}

    def __repr__(self) -> str:
        return f"PureDPAccountant(ε spent={self.total():.4g})"


class ApproxDPAccountant(Accountant):
    """Composes releases calibrated directly to (ε, δ), by basic composition (ε and δ add)."""

    kind = "approx"
    events = (ApproxDPEvent,)

    def approx_cost(self, epsilon: float, delta: float) -> float:
        return epsilon

    def delta_spent(self, extra: Iterable[float] = ()) -> float:
        return math.fsum([*self._dpartials, *extra])

    def spent(self) -> tuple[float, float]:
        return self.total(), self.delta_spent()

    def _params(self) -> dict:
        return {}

    def __repr__(self) -> str:
        e, d = self.spent()
        return f"ApproxDPAccountant(spent=({e:.4g}, {d:.3g}))"


_CLASSES = {"zcdp": ZCDPAccountant, "pure": PureDPAccountant, "approx": ApproxDPAccountant}


def accountant_from_dict(d: dict) -> ZCDPAccountant | PureDPAccountant | ApproxDPAccountant:
    """Rebuild an accountant, with its whole ledger, from ``to_dict()`` output.

    A journaled ledger (kind ``"journal:..."``) reopens its journal at ``d["journal"]["path"]``
    and checks it against the reference (see :mod:`stream_dp.privacy.journal`). Budget fields
    of older checkpoints (``epsilon``) are ignored here: :func:`stream_dp.privacy.budget.
    budget_from_dict` reads them.
    """
    kind = d.get("kind")
    journaled = isinstance(kind, str) and kind.startswith("journal:")
    if journaled:
        kind = kind.removeprefix("journal:")
    if kind not in _CLASSES:
        raise ValueError(f"unknown accountant kind {d.get('kind')!r}")
    if kind == "zcdp":
        acc = ZCDPAccountant(d["delta"], d.get("conversion", "tight"))
    else:
        acc = _CLASSES[kind]()
    acc.private = d.get("private", True) is not False
    try:
        acc._load(d if journaled else {**d, "journal": None})
    except BaseException:
        acc.storage.close()
        raise
    return acc
