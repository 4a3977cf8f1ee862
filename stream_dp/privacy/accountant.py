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

from stream_dp.privacy._chunks import CHUNK, Chunk
from stream_dp.privacy.conversions import Conversion, epsilon_from_rho, rho_from_epsilon
from stream_dp.privacy.events import (
    ApproxDPEvent,
    Event,
    GaussianEvent,
    LaplaceEvent,
    event_from_dict,
    gaussian_rho,
)
from stream_dp.privacy.journal import Journal, JournalError

__all__ = [
    "BudgetExhausted",
    "JournalError",
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
_FOLD_EVERY = 1024  # pending costs folded into the exact partials in batches of at most this
_APPROX = _MECH_CODES["gaussian-approx"]
_KIND_CODES = {GaussianEvent: _GAUSSIAN, LaplaceEvent: 1, ApproxDPEvent: _APPROX}
_NAN = math.nan
_NO_CHARGE = -math.inf  # below every step: "nothing charged yet" for the order check


def _make_event(step: int, code: int, sens: float, scale: float, eps: float, delta: float):
    if code == _GAUSSIAN:
        return GaussianEvent(step=step, sensitivity=sens, sigma=scale)
    if code == 1:
        return LaplaceEvent(step=step, sensitivity=sens, scale=scale)
    return ApproxDPEvent(step=step, sensitivity=sens, scale=scale, epsilon=eps, delta=delta)


class _Chunks(list):
    """The sealed chunks, in memory (the journal, :mod:`.journal`, is the on-disk variant)."""

    def resident_nbytes(self) -> int:
        return sum(c.nbytes for c in self)


class _Ledger:
    """Chunked columnar storage of charges: ~16 bytes per Gaussian charge once sealed.

    A long stream releases at every step, so the ledger is the one structure that grows with
    the stream. Charges go to an *open chunk* of typed arrays (step, mechanism, sensitivity,
    scale; ε and δ only for (ε, δ) events); every :data:`~._chunks.CHUNK` charges it is sealed
    into exact-size NumPy arrays with compact, lossless encodings (:mod:`._chunks`), so growth
    never reallocates or copies the past and resident memory tracks the real bytes. Events are
    rebuilt on demand by :attr:`ledger`. Charges arrive in non-decreasing step order (a step may
    carry several mechanisms), which lets a replayed charge be found by bisection over the
    chunks' step ranges instead of a per-charge dictionary.
    """

    _kinds: tuple[type, ...] = ()
    _kind = ""  # the "kind" of to_dict()
    #: False when the charges were made with a guessable (reproducible) seed: the arithmetic is
    #: the same, but nothing the ledger pays for is private (see ``stream_dp.privacy.secrets``).
    private: bool = True

    def __init__(self) -> None:
        self._store: _Chunks | Journal = _Chunks()  # sealed chunks, oldest first
        self._firsts: list[int] = []  # first and last step of each sealed chunk
        self._lasts: list[int] = []
        self._n_sealed = 0
        self._last: float | int = _NO_CHARGE  # the last charged step (steps never decrease)
        self._open()
        # Shewchuk partials of the exact sum of the ledger's costs: fsum(partials) equals
        # fsum(costs of every event) bit for bit, at O(1) amortised cost per charge. This is not
        # a second counter: it is rebuilt from the ledger on load and checked by verify().
        self._exact: list[float] = []
        # Costs charged by charge_gaussian and not yet folded into the partials (at most
        # _FOLD_EVERY, in charge order; every reader of the partials folds them first), and
        # their plain float sum, which only the fast budget test reads.
        self._pending: list[float] = []
        self._pending_sum = 0.0
        self._dpartials: list[float] = []  # the same for the δ of (ε, δ) events

    @property
    def _partials(self) -> list[float]:
        if self._pending:
            self._fold()
        return self._exact

    def _fold(self) -> None:
        grow, exact = self._grow, self._exact
        for cost in self._pending:
            grow(exact, cost)
        self._pending = []
        self._pending_sum = 0.0

    def _open(self) -> None:
        self._steps = array("q")
        self._mech = array("b")
        self._sens = array("d")
        self._scale = array("d")
        self._sp_idx = array("q")  # (ε, δ) events only: index in the open chunk, ε, δ
        self._sp_eps = array("d")
        self._sp_delta = array("d")

    def _seal(self) -> None:
        chunk = Chunk.seal(self._steps, self._mech, self._sens, self._scale, self._sp_idx,
                           self._sp_eps, self._sp_delta)  # fmt: skip
        self._store.append(chunk)  # the journal writes it before the open chunk is dropped
        self._firsts.append(chunk.first)
        self._lasts.append(chunk.last)
        self._n_sealed += chunk.n
        self._open()

    def _open_rows(self):
        sparse = {i: (self._sp_eps[k], self._sp_delta[k]) for k, i in enumerate(self._sp_idx)}
        nan = (_NAN, _NAN)
        for i, (step, code, sens, scale) in enumerate(
            zip(self._steps, self._mech, self._sens, self._scale, strict=True)
        ):
            yield (step, code, sens, scale, *sparse.get(i, nan))

    def _rows(self):
        """Every charge as ``(step, code, sensitivity, scale, ε, δ)``, in charge order."""
        for chunk in self._store:
            yield from chunk.rows()
        yield from self._open_rows()

    @property
    def ledger(self) -> tuple[Event, ...]:
        """Every charge, in the order it was made (rebuilt as event objects: O(n))."""
        return tuple(_make_event(*r) for r in self._rows())

    def __len__(self) -> int:
        return self._n_sealed + len(self._steps)

    def _cost(self, event: Event) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def _row_cost(self, code: int, sens: float, scale: float, eps: float, delta: float) -> float:
        return self._cost(_make_event(0, code, sens, scale, eps, delta))

    def _total(self, extra: Iterable[float] = ()) -> float:
        return math.fsum([*self._partials, *extra])

    @staticmethod
    def _grow(partials: list[float], x: float) -> None:
        # Shewchuk's grow-expansion (the algorithm behind math.fsum), kept incrementally.
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

    def _accumulate(self, x: float) -> None:
        self._grow(self._partials, x)

    def verify(self) -> bool:
        """Recompute the totals from the ledger entries and compare (they must be identical)."""
        events = self.ledger
        deltas = [e.delta for e in events if isinstance(e, ApproxDPEvent)]
        return math.fsum(self._cost(e) for e in events) == self._total() and math.fsum(
            deltas
        ) == math.fsum(self._dpartials)

    def _budget(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def can_afford(self, cost: float) -> bool:
        return self._total([cost]) <= self._budget()

    def charged(self, step: int, mechanism: str) -> Event | None:
        """The event charged for ``(step, mechanism)``, if any."""
        code = _MECH_CODES.get(mechanism)
        if not step <= self._last:
            return None
        steps = self._steps
        if steps and step >= steps[0]:
            i = bisect.bisect_left(steps, step)
            while i < len(steps) and steps[i] == step:
                if self._mech[i] == code:
                    return _make_event(*self._open_row(i))
                i += 1
        # Sealed chunks whose step range holds the step (several when it spans a boundary).
        firsts, lasts = self._firsts, self._lasts
        k = bisect.bisect_left(lasts, step)
        while k < len(lasts) and firsts[k] <= step:
            chunk = self._store[k]
            hits = chunk.find(step)
            if hits:
                mechs = chunk.mechs()
                for i in hits:
                    if mechs[i] == code:
                        return _make_event(*chunk.row(i))
            k += 1
        return None

    def _open_row(self, i: int) -> tuple:
        eps = delta = _NAN
        if self._mech[i] == _APPROX:
            k = bisect.bisect_left(self._sp_idx, i)
            eps, delta = self._sp_eps[k], self._sp_delta[k]
        return self._steps[i], self._mech[i], self._sens[i], self._scale[i], eps, delta

    def charge(self, event: Event) -> Event:
        """Record one release; idempotent for an identical replay of the same step."""
        if not isinstance(event, self._kinds):
            raise TypeError(f"{type(self).__name__} cannot compose {type(event).__name__}")
        last = self._last
        if event.step <= last:
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
        step = int(event.step)
        if isinstance(event, ApproxDPEvent):
            self._sp_idx.append(len(self._steps))
            self._sp_eps.append(float(event.epsilon))
            self._sp_delta.append(float(event.delta))
            self._grow(self._dpartials, float(event.delta))
        self._steps.append(step)
        self._mech.append(_MECH_CODES[event.mechanism])
        self._sens.append(float(event.sensitivity))
        scale = event.sigma if isinstance(event, GaussianEvent) else event.scale
        self._scale.append(float(scale))
        self._last = step
        self._accumulate(self._cost(event))
        if len(self._steps) == CHUNK:
            self._seal()

    def nbytes(self) -> int:
        """Memory held by the ledger's columns (sealed chunks in memory and the open chunk)."""
        cols = (self._steps, self._mech, self._sens, self._scale, self._sp_idx, self._sp_eps,
                self._sp_delta)  # fmt: skip
        return self._store.resident_nbytes() + sum(c.itemsize * len(c) for c in cols)

    def _open_columns(self) -> dict[str, np.ndarray]:
        n = len(self._steps)
        eps, delta = np.full(n, np.nan), np.full(n, np.nan)
        idx = np.frombuffer(self._sp_idx, dtype=np.int64)
        eps[idx] = np.frombuffer(self._sp_eps, dtype=np.float64)
        delta[idx] = np.frombuffer(self._sp_delta, dtype=np.float64)
        return {
            "step": np.frombuffer(self._steps, dtype=np.int64).copy(),
            "mechanism": np.frombuffer(self._mech, dtype=np.int8).copy(),
            "sensitivity": np.frombuffer(self._sens, dtype=np.float64).copy(),
            "scale": np.frombuffer(self._scale, dtype=np.float64).copy(),
            "epsilon": eps,
            "delta": delta,
        }

    def _columns(self) -> dict:
        parts = [chunk.columns() for chunk in self._store] + [self._open_columns()]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[-1]}

    # -- the journal ------------------------------------------------------------------------
    @property
    def journal(self) -> Journal | None:
        """The on-disk journal of sealed chunks, if :meth:`open_journal` was called."""
        return self._store if isinstance(self._store, Journal) else None

    def open_journal(self, path) -> None:
        """Keep sealed chunks in an append-only file instead of memory (:mod:`.journal`).

        Chunks already sealed are written first; the file must not exist (restoring from a
        checkpoint reopens an existing journal through :func:`accountant_from_dict`). From then
        on :meth:`to_dict` stores the journal's reference and the open chunk only, and memory
        stays at one open chunk (~200 kB) plus 16 bytes per sealed chunk, whatever the length
        of the stream.
        """
        if self.journal is not None:
            raise JournalError(f"this ledger already has a journal ({self.journal.path})")
        journal = Journal.create(path, self._kind)
        for chunk in self._store:
            journal.append(chunk)
        self._store = journal

    def close(self) -> None:
        """Flush and unlock the journal (no-op without one); the ledger stays readable."""
        if self.journal is not None:
            self.journal.close()

    def _restore_journal(self, ref: dict) -> None:
        restoring = Journal.restore(ref, self._kind)
        row_cost, grow = self._row_cost, self._grow
        while True:
            try:
                chunk = next(restoring)
            except StopIteration as done:
                self._store = done.value
                return
            if chunk.first < self._last:
                raise JournalError(f"ledger journal {ref['path']} is out of step order")
            for _step, code, sens, scale, eps, delta in chunk.rows():
                grow(self._partials, row_cost(code, sens, scale, eps, delta))
                if code == _APPROX:
                    grow(self._dpartials, delta)
            self._firsts.append(chunk.first)
            self._lasts.append(chunk.last)
            self._n_sealed += chunk.n
            self._last = chunk.last

    def _state(self, **params) -> dict:
        """``to_dict()``: the whole ledger, or with a journal its reference and the open chunk.

        A journaled ledger's kind is ``"journal:<kind>"``, so a build that does not know
        journals refuses it instead of loading the open chunk as if it were the whole ledger.
        """
        if not self.private:
            params["private"] = False
        if self.journal is not None:
            ref = self.journal.reference()
            return {"kind": f"journal:{self._kind}", **params, "journal": ref,
                    "columns": self._open_columns()}  # fmt: skip
        return {"kind": self._kind, **params, "columns": self._columns()}

    # -- loading --------------------------------------------------------------------------
    def _load(self, d: dict) -> None:
        if "columns" in d:
            self._extend(d["columns"])
        else:  # the list-of-dicts form (older checkpoints, hand-written ledgers)
            for e in d.get("events", []):
                event = event_from_dict(e)
                if not isinstance(event, self._kinds):
                    raise ValueError(f"{type(self).__name__} cannot hold {event}")
                if event.step <= self._last and (
                    event.step < self._last or self.charged(event.step, event.mechanism)
                ):
                    raise ValueError(f"stored ledger is out of step order or repeats {event}")
                self._append(event)

    def _extend(self, c: dict) -> None:
        """Append stored columns (the checkpoint format) after checking them like charges."""
        raw_steps = np.asarray(c["step"])
        if raw_steps.size and raw_steps.dtype.kind not in "iu":
            if not np.array_equal(raw_steps, np.trunc(raw_steps)):
                raise ValueError("stored ledger has non-integer steps")
        steps = raw_steps.astype(np.int64)
        raw_mech = np.asarray(c["mechanism"])
        sens = np.asarray(c["sensitivity"], dtype=np.float64)
        scale = np.asarray(c["scale"], dtype=np.float64)
        eps = np.asarray(c["epsilon"], dtype=np.float64)
        delta = np.asarray(c["delta"], dtype=np.float64)
        n = len(steps)
        if not all(len(a) == n for a in (raw_mech, sens, scale, eps, delta)):
            raise ValueError("stored ledger columns differ in length")
        if not n:
            return
        allowed = [_KIND_CODES[k] for k in self._kinds]
        if not np.isin(raw_mech, allowed).all():
            raise ValueError(f"stored ledger holds mechanisms {type(self).__name__} cannot hold")
        mech = raw_mech.astype(np.int8)
        # The events' own checks (GaussianEvent/LaplaceEvent.__post_init__), vectorised.
        plain = mech != _APPROX
        ok = (sens >= 0) & np.isfinite(sens) & (scale > 0)
        if not ok[plain].all():
            raise ValueError("stored ledger holds an invalid sensitivity or scale")
        # Step order and one charge per (step, mechanism), within and against what is held.
        if (np.diff(steps) < 0).any() or steps[0] < self._last:
            raise ValueError("stored ledger is out of step order")
        order = np.lexsort((mech, steps))
        if ((np.diff(steps[order]) == 0) & (np.diff(mech[order]) == 0)).any():
            raise ValueError("stored ledger charges one (step, mechanism) twice")
        for i in np.flatnonzero(steps == self._last):
            if self.charged(int(steps[i]), _MECH_NAMES[int(mech[i])]) is not None:
                raise ValueError("stored ledger charges one (step, mechanism) twice")
        # Costs in charge order, so the partials are those of charging the events one by one.
        approx = np.flatnonzero(mech == _APPROX)
        row_cost, grow, partials = self._row_cost, self._grow, self._partials
        for code, s, b, e, dl in zip(mech.tolist(), sens.tolist(), scale.tolist(), eps.tolist(),
                                     delta.tolist(), strict=True):  # fmt: skip
            grow(partials, row_cost(code, s, b, e, dl))
        for dl in delta[approx].tolist():
            grow(self._dpartials, dl)
        # Fill the open chunk and seal it as often as needed.
        i = 0
        while i < n:
            base = len(self._steps)
            j = min(n, i + CHUNK - base)
            self._steps.frombytes(steps[i:j].tobytes())
            self._mech.frombytes(mech[i:j].tobytes())
            self._sens.frombytes(sens[i:j].tobytes())
            self._scale.frombytes(scale[i:j].tobytes())
            a = approx[(approx >= i) & (approx < j)]
            self._sp_idx.frombytes((a - i + base).astype(np.int64).tobytes())
            self._sp_eps.frombytes(eps[a].tobytes())
            self._sp_delta.frombytes(delta[a].tobytes())
            i = j
            if len(self._steps) == CHUNK:
                self._seal()
        self._last = int(steps[-1])


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
    _kind = "zcdp"

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
        if (
            type(step) is not int
            or step <= self._last
            or not (0.0 <= sensitivity < math.inf and sigma > 0.0)
        ):
            self.charge(GaussianEvent(step=step, sensitivity=sensitivity, sigma=sigma))
            return
        cost = gaussian_rho(sensitivity, sigma)
        exact = self._exact
        budget = self.rho_budget
        # The last partial is the folded sum to within an ulp and the pending sum is within
        # 1024 ulps of exact, so far below the budget the exact test (an fsum over all
        # partials) cannot fail; near it, the exact test decides.
        top = exact[-1] if exact else 0.0
        if not (top + self._pending_sum + cost <= budget * _CLEARLY_BELOW) and not (
            math.fsum([*self._partials, cost]) <= budget
        ):
            self.charge(GaussianEvent(step=step, sensitivity=sensitivity, sigma=sigma))
            return
        steps = self._steps
        steps.append(step)
        self._mech.append(_GAUSSIAN)
        self._sens.append(sensitivity)
        self._scale.append(sigma)
        self._last = step
        pending = self._pending
        pending.append(cost)
        self._pending_sum += cost
        if len(pending) >= _FOLD_EVERY:
            self._fold()
        if len(steps) == CHUNK:
            self._seal()

    def _row_cost(self, code: int, sens: float, scale: float, eps: float, delta: float) -> float:
        if code == _GAUSSIAN:
            return gaussian_rho(sens, scale)
        return super()._row_cost(code, sens, scale, eps, delta)

    def rho_spent(self) -> float:
        """Σρ over the ledger (math.fsum: correctly rounded)."""
        return self._total()

    def remaining_rho(self) -> float:
        return max(self.rho_budget - self.rho_spent(), 0.0)

    def spent(self) -> tuple[float, float]:
        """The (ε, δ) guarantee of everything released so far."""
        return epsilon_from_rho(self.rho_spent(), self.delta, self.conversion), self.delta

    def to_dict(self) -> dict:
        return self._state(epsilon=self.epsilon, delta=self.delta, conversion=self.conversion)

    def __repr__(self) -> str:
        eps, _ = self.spent()
        flag = "" if self.private else ", NOT PRIVATE: reproducible seed"
        return (
            f"ZCDPAccountant(ε={self.epsilon}, δ={self.delta}, ρ budget={self.rho_budget:.4g}, "
            f"ρ spent={self.rho_spent():.4g}, ε spent={eps:.4g}, charges={len(self)}{flag})"
        )


class PureDPAccountant(_Ledger):
    """A pure ε-DP ledger (Laplace releases); composition adds ε."""

    _kinds = (LaplaceEvent,)
    _kind = "pure"

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
        return self._state(epsilon=self.epsilon)

    def __repr__(self) -> str:
        return f"PureDPAccountant(ε={self.epsilon}, ε spent={self._total():.4g})"


class ApproxDPAccountant(_Ledger):
    """An (ε, δ) ledger with basic composition, for releases calibrated directly to (ε, δ)."""

    _kinds = (ApproxDPEvent,)
    _kind = "approx"

    def __init__(self, epsilon: float, delta: float) -> None:
        super().__init__()
        self.epsilon = float(epsilon)
        self.delta = float(delta)

    def _cost(self, event: Event) -> float:
        return event.epsilon

    def _budget(self) -> float:
        return self.epsilon

    def charge(self, event: Event) -> Event:
        deltas = math.fsum([*self._dpartials, event.delta])
        if deltas > self.delta and self.charged(event.step, event.mechanism) is None:
            raise BudgetExhausted(f"δ budget {self.delta} would be exceeded ({deltas})")
        return super().charge(event)

    def spent(self) -> tuple[float, float]:
        return self._total(), math.fsum(self._dpartials)

    def to_dict(self) -> dict:
        return self._state(epsilon=self.epsilon, delta=self.delta)

    def __repr__(self) -> str:
        e, d = self.spent()
        return f"ApproxDPAccountant(ε={self.epsilon}, δ={self.delta}, spent=({e:.4g}, {d:.3g}))"


def accountant_from_dict(d: dict) -> ZCDPAccountant | PureDPAccountant | ApproxDPAccountant:
    """Rebuild an accountant, with its whole ledger, from ``to_dict()`` output.

    A journaled ledger (kind ``"journal:..."``) reopens its journal at ``d["journal"]["path"]``
    and checks it against the reference (see :mod:`stream_dp.privacy.journal`).
    """
    kind = d.get("kind")
    journaled = isinstance(kind, str) and kind.startswith("journal:")
    if journaled:
        kind = kind.removeprefix("journal:")
    acc: ZCDPAccountant | PureDPAccountant | ApproxDPAccountant
    if kind == "zcdp":
        acc = ZCDPAccountant(d["epsilon"], d["delta"], d["conversion"])
    elif kind == "pure":
        acc = PureDPAccountant(d["epsilon"])
    elif kind == "approx":
        acc = ApproxDPAccountant(d["epsilon"], d["delta"])
    else:
        raise ValueError(f"unknown accountant kind {d.get('kind')!r}")
    acc.private = d.get("private", True) is not False
    try:
        if journaled:
            acc._restore_journal(d["journal"])
        acc._load(d)
        if acc._total() > acc._budget():
            raise ValueError("the stored ledger exceeds its own budget: refusing to load it")
    except BaseException:
        acc.close()
        raise
    return acc
