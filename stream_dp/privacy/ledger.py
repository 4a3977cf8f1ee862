"""The ledger: every charged release, stored. Storage only — no costs, no budget.

A learner that releases at every step charges one event per record for ever, so the ledger is
the one structure that grows with the stream. Charges go to an *open chunk* of typed arrays
(step, mechanism, sensitivity, scale; ε and δ only for (ε, δ) events); every
:data:`~._chunks.CHUNK` charges it is sealed into exact-size NumPy arrays with compact,
lossless encodings (:mod:`._chunks`), kept in memory or in an append-only journal on disk
(:mod:`.journal`). Growth never reallocates or copies the past, and resident memory tracks the
real bytes (~16 bytes per Gaussian charge). Events are rebuilt on demand.

Charges arrive in non-decreasing step order (a step may carry several mechanisms), which lets a
replayed charge be found by bisection over the chunks' step ranges instead of a per-charge
dictionary. What a charge *costs* is the accountant's business (:mod:`.accountant`); whether it
may be made is the budget's (:mod:`.budget`).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterator

import numpy as np

from stream_dp.privacy._chunks import CHUNK, Chunk
from stream_dp.privacy.events import (
    GAUSSIAN_MECHANISMS,
    ApproxDPEvent,
    Event,
    GaussianEvent,
    GaussianEvents,
    LaplaceEvent,
)
from stream_dp.privacy.journal import Journal, JournalError

__all__ = ["Ledger", "MECHANISM_CODES", "Row"]

#: Mechanism names of the events and their codes in the stored columns.
MECHANISM_CODES = {
    "gaussian": 0,
    "laplace": 1,
    "gaussian-approx": 2,
    "gaussian-correlated": 3,
    "gaussian-scaler": 4,
    "gaussian-metrics": 5,
}
_NAMES = {v: k for k, v in MECHANISM_CODES.items()}
GAUSSIAN, LAPLACE, APPROX = 0, 1, 2
#: The codes of every Gaussian mechanism name (their rows are GaussianEvents).
GAUSSIAN_CODES = frozenset(MECHANISM_CODES[name] for name in GAUSSIAN_MECHANISMS)
_KIND_CODES = {
    GaussianEvent: sorted(GAUSSIAN_CODES),
    LaplaceEvent: [LAPLACE],
    ApproxDPEvent: [APPROX],
}
_NAN = math.nan
NO_CHARGE = -math.inf  # below every step: "nothing charged yet" for the order check

#: One stored charge: ``(step, mechanism code, sensitivity, scale, ε, δ)`` (ε, δ: NaN unless
#: an (ε, δ) event).
Row = tuple[int, int, float, float, float, float]


def event_of(step: int, code: int, sens: float, scale: float, eps: float, delta: float) -> Event:
    """The event a stored row records."""
    if code in GAUSSIAN_CODES:
        return GaussianEvent(step=step, sensitivity=sens, sigma=scale, mechanism=_NAMES[code])
    if code == LAPLACE:
        return LaplaceEvent(step=step, sensitivity=sens, scale=scale)
    return ApproxDPEvent(step=step, sensitivity=sens, scale=scale, epsilon=eps, delta=delta)


class _Chunks(list):
    """The sealed chunks, in memory (the journal is the on-disk variant)."""

    def resident_nbytes(self) -> int:
        return sum(c.nbytes for c in self)


class Ledger:
    """Chunked columnar storage of charged events, in charge order.

    Parameters
    ----------
    kind
        The accountant kind that writes it (``"zcdp"``, ``"pure"``, ``"approx"``): a journal
        file records it, so a ledger is never reopened by the wrong accountant.

    Examples
    --------
    >>> ledger = Ledger("zcdp")
    >>> ledger.append(GaussianEvent(step=4, sensitivity=0.5, sigma=2.0))
    >>> len(ledger), ledger.last_step, ledger.charged(4, "gaussian")
    (1, 4, GaussianEvent(step=4, sensitivity=0.5, sigma=2.0, mechanism='gaussian'))

    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._store: _Chunks | Journal = _Chunks()  # sealed chunks, oldest first
        self._firsts: list[int] = []  # first and last step of each sealed chunk
        self._lasts: list[int] = []
        #: The number of rows (``len(self)``), kept as a plain attribute for per-record readers.
        self.n_rows = 0
        self.last_step: float | int = NO_CHARGE  # steps never decrease
        self._open()

    # -- appending ------------------------------------------------------------------------------
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
        self._open()

    def append(self, event: Event | GaussianEvents) -> None:
        """Store one event, or the rows of a batch (steps not below :attr:`last_step`; the
        accountant checks that before)."""
        kind = type(event)
        if kind is GaussianEvent or kind is LaplaceEvent:
            step, sens, scale, name = event
        elif kind is GaussianEvents:
            self._extend_gaussian(event)
            return
        else:
            step, sens, scale, eps, delta, name = event
            self._sp_idx.append(len(self._steps))
            self._sp_eps.append(float(eps))
            self._sp_delta.append(float(delta))
        self.append_row(step, MECHANISM_CODES[name], sens, scale)

    def append_row(self, step: int, code: int, sensitivity: float, scale: float) -> None:
        """Store one row: the step, the mechanism's code (:data:`MECHANISM_CODES`), Δ and the
        noise scale; what :meth:`append` stores of an event, and the per-record charge
        (:meth:`~.accountant.Accountant.record_gaussian`) of a release without one. The caller
        has checked it; an (ε, δ) event's ε and δ are :meth:`append`'s to store first."""
        steps = self._steps
        steps.append(step)
        self._mech.append(code)
        self._sens.append(sensitivity)
        self._scale.append(scale)
        self.last_step = step
        self.n_rows += 1
        if len(steps) == CHUNK:
            self._seal()

    def _extend_gaussian(self, batch: GaussianEvents) -> None:
        code = MECHANISM_CODES[batch.mechanism]
        steps = np.asarray(batch.steps, dtype=np.int64)
        sens = np.asarray(batch.sensitivities, dtype=np.float64)
        sigmas = np.asarray(batch.sigmas, dtype=np.float64)
        n, i = len(steps), 0
        while i < n:  # fill the open chunk and seal it as often as needed
            j = min(n, i + CHUNK - len(self._steps))
            self._steps.frombytes(steps[i:j].tobytes())
            self._mech.frombytes(bytes([code]) * (j - i))
            self._sens.frombytes(sens[i:j].tobytes())
            self._scale.frombytes(sigmas[i:j].tobytes())
            i = j
            if len(self._steps) == CHUNK:
                self._seal()
        if n:
            self.n_rows += n
            self.last_step = int(steps[-1])

    # -- reading --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n_rows

    def __setstate__(self, state: dict) -> None:
        if "n_rows" not in state:  # pickled before n_rows replaced the sealed-row count
            state["n_rows"] = state.pop("_n_sealed") + len(state["_steps"])
        self.__dict__.update(state)

    def _open_rows(self) -> Iterator[Row]:
        sparse = {i: (self._sp_eps[k], self._sp_delta[k]) for k, i in enumerate(self._sp_idx)}
        nan = (_NAN, _NAN)
        for i, (step, code, sens, scale) in enumerate(
            zip(self._steps, self._mech, self._sens, self._scale, strict=True)
        ):
            yield (step, code, sens, scale, *sparse.get(i, nan))

    def rows(self) -> Iterator[Row]:
        """Every charge as a :data:`Row`, in charge order."""
        for chunk in self._store:
            yield from chunk.rows()
        yield from self._open_rows()

    @property
    def events(self) -> tuple[Event, ...]:
        """Every charge, in the order it was made (rebuilt as event objects: O(n))."""
        return tuple(event_of(*r) for r in self.rows())

    def rows_since(self, n: int) -> list[Row]:
        """The rows charged after the first ``n``, in charge order (the newest few are read
        from the chunks that hold them, not from the whole ledger)."""
        n_open = len(self._steps)
        first_open = self.n_rows - n_open
        out: list[Row] = []
        if n < first_open:  # some of them are in sealed chunks: the newest ones that reach n
            found, start, k = [], first_open, len(self._firsts) - 1
            while start > n and k >= 0:
                chunk = self._store[k]
                start -= chunk.n
                found.append((chunk, start))
                k -= 1
            for chunk, begin in reversed(found):
                out.extend(chunk.rows(max(0, n - begin)))
        out.extend(self._open_row(i) for i in range(max(0, n - first_open), n_open))
        return out

    def _open_row(self, i: int) -> Row:
        eps = delta = _NAN
        if self._mech[i] == APPROX:
            k = bisect.bisect_left(self._sp_idx, i)
            eps, delta = self._sp_eps[k], self._sp_delta[k]
        return self._steps[i], self._mech[i], self._sens[i], self._scale[i], eps, delta

    def charged(self, step: int, mechanism: str) -> Event | None:
        """The event charged for ``(step, mechanism)``, if any."""
        code = MECHANISM_CODES.get(mechanism)
        if not step <= self.last_step:
            return None
        steps = self._steps
        if steps and step >= steps[0]:
            i = bisect.bisect_left(steps, step)
            while i < len(steps) and steps[i] == step:
                if self._mech[i] == code:
                    return event_of(*self._open_row(i))
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
                        return event_of(*chunk.row(i))
            k += 1
        return None

    def nbytes(self) -> int:
        """Memory held by the columns (sealed chunks in memory and the open chunk)."""
        cols = (self._steps, self._mech, self._sens, self._scale, self._sp_idx, self._sp_eps,
                self._sp_delta)  # fmt: skip
        return self._store.resident_nbytes() + sum(c.itemsize * len(c) for c in cols)

    def open_columns(self) -> dict[str, np.ndarray]:
        """The open chunk as columns (``step``, ``mechanism``, ``sensitivity``, ``scale``,
        ``epsilon``, ``delta``)."""
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

    def columns(self) -> dict[str, np.ndarray]:
        """Every charge as columns (the checkpoint format)."""
        parts = [chunk.columns() for chunk in self._store] + [self.open_columns()]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[-1]}

    # -- loading stored columns -------------------------------------------------------------
    def extend(self, c: dict, allowed: tuple[type, ...]) -> dict[str, np.ndarray] | None:
        """Append stored columns after checking them as charges would be checked.

        ``allowed`` are the event types the reading accountant composes. Returns the checked
        columns (the accountant recomputes its totals from them), or None when empty.
        """
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
            return None
        codes = [c for k in allowed for c in _KIND_CODES[k]]
        if not np.isin(raw_mech, codes).all():
            raise ValueError("stored ledger holds mechanisms its accountant cannot compose")
        mech = raw_mech.astype(np.int8)
        # The checks of an event's parameters (Accountant.cost), vectorised.
        plain = mech != APPROX
        ok = (sens >= 0) & np.isfinite(sens) & (scale > 0)
        if not ok[plain].all():
            raise ValueError("stored ledger holds an invalid sensitivity or scale")
        # Step order and one charge per (step, mechanism), within and against what is held.
        if (np.diff(steps) < 0).any() or steps[0] < self.last_step:
            raise ValueError("stored ledger is out of step order")
        order = np.lexsort((mech, steps))
        if ((np.diff(steps[order]) == 0) & (np.diff(mech[order]) == 0)).any():
            raise ValueError("stored ledger charges one (step, mechanism) twice")
        for i in np.flatnonzero(steps == self.last_step):
            if self.charged(int(steps[i]), _NAMES[int(mech[i])]) is not None:
                raise ValueError("stored ledger charges one (step, mechanism) twice")
        approx = np.flatnonzero(mech == APPROX)
        i = 0
        while i < n:  # fill the open chunk and seal it as often as needed
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
        self.n_rows += n
        self.last_step = int(steps[-1])
        return {"mechanism": mech, "sensitivity": sens, "scale": scale, "epsilon": eps,
                "delta": delta}  # fmt: skip

    # -- the journal ------------------------------------------------------------------------
    @property
    def journal(self) -> Journal | None:
        """The on-disk journal of sealed chunks, if :meth:`open_journal` was called."""
        return self._store if isinstance(self._store, Journal) else None

    def open_journal(self, path) -> None:
        """Keep sealed chunks in an append-only file instead of memory (:mod:`.journal`).

        Chunks already sealed are written first; the file must not exist (a checkpoint reopens
        an existing journal through :meth:`restore_journal`). From then on :meth:`to_dict`
        stores the journal's reference and the open chunk only, and memory stays at one open
        chunk (~200 kB) plus 16 bytes per sealed chunk, whatever the length of the stream.
        """
        if self.journal is not None:
            raise JournalError(f"this ledger already has a journal ({self.journal.path})")
        journal = Journal.create(path, self.kind)
        for chunk in self._store:
            journal.append(chunk)
        self._store = journal

    def restore_journal(self, ref: dict) -> Iterator[Chunk]:
        """Reopen the journal a checkpoint refers to, yielding its chunks as they are verified
        (the accountant rebuilds its totals from them); the ledger then reads from the file."""
        restoring = Journal.restore(ref, self.kind)
        while True:
            try:
                chunk = next(restoring)
            except StopIteration as done:
                self._store = done.value
                return
            if chunk.first < self.last_step:
                raise JournalError(f"ledger journal {ref['path']} is out of step order")
            yield chunk
            self._firsts.append(chunk.first)
            self._lasts.append(chunk.last)
            self.n_rows += chunk.n
            self.last_step = chunk.last

    def close(self) -> None:
        """Flush and unlock the journal (no-op without one); the ledger stays readable."""
        if self.journal is not None:
            self.journal.close()

    def to_dict(self, **params) -> dict:
        """The checkpoint form: the whole ledger, or with a journal its reference and the open
        chunk. A journaled ledger's kind is ``"journal:<kind>"``, so a build that does not know
        journals refuses it instead of loading the open chunk as if it were the whole ledger."""
        if self.journal is not None:
            ref = self.journal.reference()
            return {"kind": f"journal:{self.kind}", **params, "journal": ref,
                    "columns": self.open_columns()}  # fmt: skip
        return {"kind": self.kind, **params, "columns": self.columns()}
