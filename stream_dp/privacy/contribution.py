"""Contribution bounding: at most k admitted events per privacy unit, at least b steps apart.

A unit-level guarantee needs every unit's influence bounded: a learner admits an event only if
its unit has fewer than ``k`` admitted events and its last admitted event is at least ``b`` steps
back. A dropped event takes no step and touches no buffer, model or noise index: it is counted,
by reason, and never learned from (McMahan et al. 2024 call b the *min-separation*; PipelineDP's
``max_contributions`` and Tumult's ``MaxRowsPerID`` bound contributions the same way).

**The clock.** ``b`` is measured on the learner's *step* clock, which counts admitted events
only — the rows of the gradient stream, which is where the unit-level sensitivity
(:mod:`stream_dp.privacy.unit_sensitivity`) needs two events of a unit to be b apart. Measured on
arrivals instead, dropped events in between would let two admitted events be fewer than b rows
apart. Because a dropped event takes no step, it never shifts another unit's steps.

**Stable truncation.** Whether an event is admitted depends only on its unit key, the step clock
and its unit's own earlier admissions — never on features or labels. Neighbouring streams that
differ in the contents of one unit's events (features and labels, same keys at the same
positions) therefore admit exactly the same events, at the same steps: the relation
"replace up to k admitted events of one unit, indices preserved" of ``docs/units.md``.

**Exact, keyed, compact state.** A unit is stored by a 128-bit keyed hash of its key (BLAKE2b
keyed by a secret, RFC 7693) with its admitted count and last admitted step packed in 64 bits: 24
bytes per slot of an open-addressing table kept between 40 % and 80 % full (30–60 bytes per
unit). Nothing is shared between units: no sketch, no eviction. Two distinct keys share a slot only
if their hashes collide, with probability below ``m²/2¹²⁹`` for m units (≈ 10⁻²¹ at 10⁹ units),
and without the secret an attacker cannot aim a key at another unit's slot (which would spend that
unit's budget). A collision would merge two units, which only drops more events: merging is never
a privacy risk, splitting is. So keys are canonical: ``42``, ``"42"`` and ``b"42"`` are one unit.
With numba, an admission — the keyed hash (:mod:`stream_dp.privacy.blake2b`, hashlib's BLAKE2b bit
for bit), the probe and the update — is one compiled call; without it, hashlib and the same table
code in Python.

"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from connectors.schema import RecordError
from stream_dp._jit import jitable, njit, numba_active
from stream_dp.privacy.blake2b import KEYED_WORDS, digest128, keyed_state
from stream_dp.privacy.secrets import derive_secret, new_secret

__all__ = ["ContributionBound", "DROP_REASONS", "MAX_EVENTS", "MAX_STEP", "unit_bytes"]

#: Why an event was dropped: its unit has k admitted events; its unit's last admitted event is
#: fewer than b steps back; the table holds ``max_units`` units and this is a new one.
DROP_REASONS = ("max_events", "min_separation", "max_units")

# A slot is three uint64: the two halves of the keyed hash, then (last step << 16) | count.
_WIDTH = 3
_COUNT_BITS = 16
_COUNT_MASK = (1 << _COUNT_BITS) - 1
#: The largest k, and the largest step (2⁴⁸ − 1), the packed state holds.
MAX_EVENTS = _COUNT_MASK
MAX_STEP = (1 << (64 - _COUNT_BITS)) - 1
# Grow (double) past this load: 24-byte slots then cost 30–60 bytes per unit.
_MAX_LOAD = 0.8
_MIN_CAPACITY = 1024
_UNPACK = struct.Struct("<QQ").unpack
_UNPACK_SIGNED = struct.Struct("<qq").unpack  # the same words, as the int64 admission reads them
_FORMAT = 1
_PERSON = b"stream_dp/units"  # BLAKE2b personalisation of the unit hash

# The bound's state is one uint64 array, the compiled admission's only array argument (numba
# unboxes each array argument at every call): the counters (int64 through a view), the keyed
# hash's state and scratch, then the table.
_MASK, _MAX_EVENTS, _MIN_SEP, _LAST, _UNITS, _GROW_AT, _MAX_UNITS, _DROPPED = range(8)
_N_COUNTERS = _DROPPED + len(DROP_REASONS)
_KEYED = _N_COUNTERS
_TABLE = _KEYED + KEYED_WORDS
# What one admission did: the two common answers, then the rare ones Python finishes.
_DROP, _ADMIT, _ADMIT_GROW, _BAD_STEP, _EMPTY = range(5)


def unit_bytes(unit) -> bytes:
    """The canonical bytes of a unit key: a str's UTF-8, an int's decimal digits, bytes as is.

    ``42``, ``"42"`` and ``b"42"`` are the same unit: merging two keys that name one person only
    drops more events, while splitting one person over two keys would double their budget.
    Anything else — ``None`` (a missing key), floats, booleans, containers — is not a unit key.

    Examples
    --------
    >>> unit_bytes(42) == unit_bytes("42") == b"42"
    True
    >>> unit_bytes(None)
    Traceback (most recent call last):
    ...
    connectors.schema.RecordError: unit_key: a record without a unit key cannot be learned ...

    """
    t = type(unit)
    if t is str:
        return unit.encode("utf-8", "surrogatepass")
    if t is bytes:
        return unit
    if t is int or isinstance(unit, np.integer):
        return str(int(unit)).encode()
    if isinstance(unit, bytearray | memoryview):
        return bytes(unit)
    if unit is None:
        raise RecordError(
            "unit_key",
            "a record without a unit key cannot be learned under a unit-level guarantee "
            "(its contribution would not be bounded)",
        )
    if isinstance(unit, str):
        return str(unit).encode("utf-8", "surrogatepass")
    if isinstance(unit, int) and not isinstance(unit, bool):
        return str(int(unit)).encode()
    raise RecordError(
        "unit_key",
        f"a unit key is a str, an int or bytes, got {type(unit).__name__} ({unit!r}): a float "
        "or a bool would name a unit ambiguously",
    )


@jitable
def _admit_hashed(lo, hi, step, table, c):
    """Admit or drop one event of the unit whose keyed hash is ``(lo, hi)``, at ``step``.

    ``table`` is the open-addressing table read as int64 (three words a slot: the hash's halves,
    then (last step << 16) | count, below 2⁶³; a zero state word is an empty slot), ``c`` the
    counters (``_MASK`` …); ``lo`` and ``hi`` are the hash's words as int64 too. Returns
    ``_ADMIT``, ``_DROP`` (counted by reason) or ``_ADMIT_GROW`` (admitted, and the table is now
    past its load: the caller grows it). One body for the compiled admission (int64 arrays) and
    for Python (hashlib's hash, then this on memoryviews: plain ints, no NumPy scalars).
    """
    i = lo & c[_MASK]
    while True:
        j = _WIDTH * i
        state = table[j + 2]
        if state == 0:  # a new unit: its first event is admitted, unless units are capped
            if c[_UNITS] >= c[_MAX_UNITS]:
                c[_DROPPED + 2] += 1
                return _DROP
            table[j] = lo
            table[j + 1] = hi
            table[j + 2] = (step << _COUNT_BITS) | 1
            c[_UNITS] += 1
            c[_LAST] = step
            return _ADMIT_GROW if c[_UNITS] > c[_GROW_AT] else _ADMIT
        if table[j] == lo and table[j + 1] == hi:
            count = state & _COUNT_MASK
            if count >= c[_MAX_EVENTS]:
                c[_DROPPED] += 1
                return _DROP
            if step - (state >> _COUNT_BITS) < c[_MIN_SEP]:
                c[_DROPPED + 1] += 1
                return _DROP
            table[j + 2] = (step << _COUNT_BITS) | (count + 1)
            c[_LAST] = step
            return _ADMIT
        i = (i + 1) & c[_MASK]


@njit
def _admit_compiled(data, step, mem):
    """The whole admission in one compiled call: the step's check, the keyed hash, the probe."""
    c = mem[:_N_COUNTERS].view(np.int64)
    if step <= c[_LAST] or step > MAX_STEP:
        return _BAD_STEP
    if len(data) == 0:
        return _EMPTY
    lo, hi = digest128(mem[_KEYED:_TABLE], data)
    return _admit_hashed(np.int64(lo), np.int64(hi), step, mem[_TABLE:].view(np.int64), c)


_ENTRY: list = []  # the compiled admission's entry point, once resolved in this process


def _compiled_entry():
    """:func:`_admit_compiled`'s machine code for (bytes, int, the state array), called without
    numba's dispatcher: it would type the arguments again at every event (a third of a
    microsecond; their types never change — :meth:`ContributionBound.admit` only ever passes
    these)."""
    if not _ENTRY:
        args = (b"x", 1, np.zeros(_TABLE + _WIDTH * 2, dtype=np.uint64))
        _admit_compiled(*args)
        sig = tuple(_admit_compiled.typeof_pyval(a) for a in args)
        _ENTRY.append(_admit_compiled.overloads[sig].entry_point)
    return _ENTRY[0]


class ContributionBound:
    """Stable truncation of a keyed stream: ≤ k admitted events per unit, ≥ b steps apart.

    Parameters
    ----------
    max_events
        k: events admitted per unit, ever (1 … 65 535).
    min_separation
        b: steps between two admitted events of one unit, on the learner's step clock (which
        counts admitted events only). 1 allows consecutive steps.
    secret
        The key of the unit hash: an integer secret (a learner passes its noise secret, from which
        a separate key is derived), or None for 128 fresh bits. A checkpoint can only be loaded
        with the secret it was made with.
    label
        Separates the hash keys of several bounds derived from one secret (e.g. the model id).
    max_units
        Refuse events of *new* units once this many are stored (reason ``"max_units"``); None
        (default) stores every unit. A cap makes a unit's admission depend on how many units
        arrived before it — deterministic in the stream's keys, so still stable for the
        neighbouring relation, but unfair — and bounds the memory an attacker who mints keys can
        take.

    Examples
    --------
    >>> bound = ContributionBound(max_events=2, min_separation=3, secret=7)
    >>> step, learned = 0, []
    >>> for unit in ["ann", "bob", "ann", "ann", "cid", "ann", "ann"]:
    ...     if bound.admit(unit, step + 1):   # the step this event would take
    ...         step += 1
    ...         learned.append(unit)
    >>> learned
    ['ann', 'bob', 'cid', 'ann']
    >>> bound.dropped
    {'max_events': 1, 'min_separation': 2, 'max_units': 0}

    The second "ann" would have taken step 3, two steps after her first (step 1): dropped, as is
    the third (still step 3). The fourth takes step 4; the fifth would be her third event.

    """

    def __init__(
        self,
        max_events: int,
        min_separation: int = 1,
        secret: int | None = None,
        label: str = "units",
        max_units: int | None = None,
    ) -> None:
        self.max_events = _int_in(max_events, "max_events", 1, MAX_EVENTS)
        self.min_separation = _int_in(min_separation, "min_separation", 1, MAX_STEP)
        self.max_units = None if max_units is None else _int_in(max_units, "max_units", 1, 1 << 62)
        self.label = str(label)
        key = derive_secret(new_secret() if secret is None else secret, "unit-key/" + self.label)
        self._key = key.to_bytes(16, "little")
        self._mem = np.zeros(_TABLE, dtype=np.uint64)
        self._views()
        self._c[_MAX_EVENTS] = self.max_events
        self._c[_MIN_SEP] = self.min_separation
        self._c[_MAX_UNITS] = (1 << 62) if self.max_units is None else self.max_units
        self._derived()
        self._check = self._hash(b"\x00stream_dp/unit-key-check")
        self._clear(_MIN_CAPACITY)

    def _derived(self) -> None:
        """The keyed hash and the admission's code: rebuilt, never stored (neither pickles)."""
        self._copy = hashlib.blake2b(key=self._key, digest_size=16, person=_PERSON).copy
        if numba_active():
            self._keyed[:] = keyed_state(self._key, _PERSON)
            self._run = _compiled_entry()
        else:
            self._run = self._admit_python

    def _views(self) -> None:
        """The parts of the state array, as Python code reads them."""
        mem = self._mem
        self._c = mem[:_N_COUNTERS].view(np.int64)
        self._keyed = mem[_KEYED:_TABLE]
        self._table = mem[_TABLE:]
        self._py = (memoryview(self._table.view(np.int64)), memoryview(self._c))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_copy", "_run", "_c", "_keyed", "_table", "_py"):
            del state[name]
        # The hash's scratch holds the last key it hashed: no copy of the bound carries it.
        state["_mem"] = mem = self._mem.copy()
        mem[_KEYED + 8 : _TABLE] = 0
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._views()
        self._derived()

    # -- admission ------------------------------------------------------------------------------
    def admit(self, unit, step: int) -> bool:
        """Admit (True) or drop (False) one event of ``unit`` that would take ``step``.

        ``step`` is the learner's next step (steps taken so far + 1); on admission the learner
        must take it, so steps of admitted events strictly increase (a ValueError otherwise — a
        learner and a bound restored from different checkpoints). A dropped event is counted in
        :attr:`dropped` and changes nothing else. Raises :class:`~connectors.schema.RecordError`
        for a missing or ambiguous key, leaving the state untouched.
        """
        data = unit.encode("utf-8", "surrogatepass") if type(unit) is str else unit_bytes(unit)
        try:
            done = self._run(data, step, self._mem)
        except (TypeError, OverflowError):  # not an int64 step: the checks below say why
            done = _BAD_STEP
        if done == _ADMIT:
            return True
        if done == _DROP:
            return False
        return self._admit_rare(data, step, done)

    def _admit_python(self, data: bytes, step, mem) -> int:
        """:func:`_admit_compiled` without numba: hashlib's hash, then the same table code."""
        if type(step) is not int or not self._py[1][_LAST] < step <= MAX_STEP:
            return _BAD_STEP
        return _admit_hashed(*self._hash(data, _UNPACK_SIGNED), step, *self._py)

    def _admit_rare(self, data: bytes, step, done: int) -> bool:
        """Finish an admission the one-call path did not: grow the table after a new unit, or
        decide in Python an event whose step the compiled call does not take (checked here: a
        ValueError unless it follows the last admitted step) or whose key is empty."""
        if done != _ADMIT_GROW:
            if done == _BAD_STEP:
                step = self._check_step(step)
            done = _admit_hashed(*self._hash(data, _UNPACK_SIGNED), step, *self._py)
        if done == _ADMIT_GROW:
            self._resize(2 * self._capacity)
        return done != _DROP

    def _check_step(self, step) -> int:
        step = int(step)
        if not self.last_step < step <= MAX_STEP:
            raise ValueError(
                f"step {step} is not after the last admitted step {self.last_step}: the learner "
                "and its contribution bound are out of step"
            )
        return step

    def admit_many(self, units, first_step: int) -> np.ndarray:
        """:meth:`admit` for each unit in order; admitted events take ``first_step``,
        ``first_step + 1``, … Returns the boolean mask of admitted events.

        An invalid key raises :class:`~connectors.schema.RecordError` after the events before it
        were decided, as the learners' ``learn_many`` does with an invalid row.

        Examples
        --------
        >>> ContributionBound(1, secret=1).admit_many(["a", "b", "a", 7, "7"], 1).tolist()
        [True, True, False, True, False]

        """
        units = list(units)
        out = np.zeros(len(units), dtype=bool)
        step = int(first_step)
        admit = self.admit
        for i, unit in enumerate(units):
            if admit(unit, step):
                out[i] = True
                step += 1
        return out

    def events_of(self, unit) -> int:
        """The number of admitted events of ``unit`` (0 for a unit never admitted)."""
        j = self._probe(*self._hash(unit_bytes(unit)))
        return 0 if j < 0 else int(self._table[j + 2] & np.uint64(_COUNT_MASK))

    # -- what it did ----------------------------------------------------------------------------
    @property
    def last_step(self) -> int:
        """The step of the latest admitted event (0 before the first): steps only increase."""
        return int(self._c[_LAST])

    @property
    def dropped(self) -> dict[str, int]:
        """Dropped events by reason (:data:`DROP_REASONS`)."""
        counts = self._c[_DROPPED:].tolist()
        return dict(zip(DROP_REASONS, counts, strict=True))

    @property
    def admitted(self) -> int:
        """Events admitted so far: the sum of the units' counts."""
        return int(np.sum(self._view()[:, 2] & np.uint64(_COUNT_MASK), dtype=np.uint64))

    @property
    def n_units(self) -> int:
        """Units with at least one admitted event."""
        return int(self._c[_UNITS])

    @property
    def nbytes(self) -> int:
        """Bytes of the bound's state: the per-unit table (the only part that grows with the
        units) and ~0.5 kB of counters and hash state."""
        return self._mem.nbytes

    def describe(self) -> str:
        d = self.dropped
        return (
            f"contribution bound: ≤ {self.max_events} events per unit, ≥ {self.min_separation} "
            f"steps apart; {self.admitted} admitted, {self.n_units} units, dropped "
            + ", ".join(f"{v} ({k})" for k, v in d.items())
        )

    def __repr__(self) -> str:
        return (
            f"ContributionBound(max_events={self.max_events}, "
            f"min_separation={self.min_separation}, units={self.n_units})"
        )

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The occupied slots (24 bytes per unit), the counters and a check of the hash key."""
        view = self._view()
        occupied = view[:, 2] != 0
        return {
            "format": _FORMAT,
            "max_events": self.max_events,
            "min_separation": self.min_separation,
            "max_units": self.max_units,
            "key_check": [int(v) for v in self._check],
            "last_step": self.last_step,
            "dropped": self.dropped,
            "slots": view[occupied].copy(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` made with the same secret, label, k, b and cap.

        A different key would make every stored unit unreachable — each unit would get a fresh
        budget of k events — so it is refused, as are different bounds.
        """
        if state.get("format") != _FORMAT:
            raise ValueError(f"unknown contribution-bound state format {state.get('format')!r}")
        if [int(v) for v in state["key_check"]] != list(self._check):
            raise ValueError(
                "the checkpoint's unit table was made with another secret or label: its units "
                "would all look new (and get a fresh budget)"
            )
        mine = (self.max_events, self.min_separation, self.max_units)
        theirs = (state["max_events"], state["min_separation"], state["max_units"])
        if mine != theirs:
            raise ValueError(
                f"the checkpoint bounds units by (k, b, max_units) = {theirs}, this learner by "
                f"{mine}"
            )
        slots = np.asarray(state["slots"], dtype=np.uint64).reshape(-1, _WIDTH)
        counts = slots[:, 2] & np.uint64(_COUNT_MASK)
        steps = slots[:, 2] >> np.uint64(_COUNT_BITS)
        if (
            np.any(counts == 0)
            or np.any(counts > self.max_events)
            or np.any(steps > int(state["last_step"]))
        ):
            raise ValueError("the checkpoint's unit table is inconsistent with its bounds")
        dropped = state["dropped"]
        self._clear(_capacity_for(len(slots)))
        self._insert(slots)
        self._c[_LAST] = int(state["last_step"])
        self._c[_DROPPED:] = [int(dropped[r]) for r in DROP_REASONS]

    # -- the table ------------------------------------------------------------------------------
    def _hash(self, data: bytes, unpack=_UNPACK) -> tuple[int, int]:
        """The keyed hash's two words, unsigned (the table's view) or, with ``_UNPACK_SIGNED``,
        as the int64 admission reads them."""
        h = self._copy()
        h.update(data)
        return unpack(h.digest())

    def _probe(self, lo: int, hi: int) -> int:
        """The first word of the unit's slot, or ``~j`` for the empty slot j where it would go."""
        table, mask = self._table, self._capacity - 1
        i = lo & mask
        while True:
            j = _WIDTH * i
            if table[j + 2] == 0:
                return ~j
            if table[j] == lo and table[j + 1] == hi:
                return j
            i = (i + 1) & mask

    @property
    def _capacity(self) -> int:
        return int(self._c[_MASK]) + 1

    def _clear(self, capacity: int) -> None:
        mem = np.zeros(_TABLE + _WIDTH * capacity, dtype=np.uint64)
        mem[:_TABLE] = self._mem[:_TABLE]
        self._mem = mem
        self._views()
        self._c[_MASK] = capacity - 1
        self._c[_GROW_AT] = int(_MAX_LOAD * capacity)
        self._c[_UNITS] = 0

    def _view(self) -> np.ndarray:
        return self._table.reshape(-1, _WIDTH)

    def _resize(self, capacity: int) -> None:
        """Rehash into a table of ``capacity`` slots."""
        view = self._view()
        slots = view[view[:, 2] != 0].copy()
        self._clear(capacity)
        self._insert(slots)

    def _insert(self, slots: np.ndarray) -> np.ndarray:
        """Place distinct units into the empty table by linear probing, vectorised; returns the
        slot each row of ``slots`` went to.

        Sorted by home slot h, the i-th unit goes to ``max(h_i, p_{i−1} + 1) = i + max_{j≤i}(h_j −
        j)``. Units pushed past the end wrap to the front: they are placed again, first, with home
        0 — which only moves later units further along runs they already belong to — until none
        is past the end (the table is at most 80 % full).
        """
        m = len(slots)
        if m > self._c[_GROW_AT]:
            raise ValueError("more units than the table may hold")
        home = (slots[:, 0] & np.uint64(self._capacity - 1)).astype(np.int64)
        rows = np.argsort(home, kind="stable")  # rows[i]: the input row placed i-th
        home = home[rows]
        while True:
            idx = np.arange(m, dtype=np.int64)
            pos = idx + np.maximum.accumulate(home - idx) if m else idx
            spill = pos >= self._capacity
            if not spill.any():
                break
            first = np.concatenate([np.flatnonzero(spill), np.flatnonzero(~spill)])
            rows = rows[first]
            home = np.where(spill, 0, home)[first]
        self._view()[pos] = slots[rows]
        self._c[_UNITS] = m
        placed = np.empty(m, dtype=np.int64)
        placed[rows] = pos
        return placed


def _capacity_for(units: int) -> int:
    capacity = _MIN_CAPACITY
    while int(_MAX_LOAD * capacity) < units:
        capacity *= 2
    return capacity


def _int_in(v, name: str, low: int, high: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or not low <= v <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {v!r}")
    return int(v)
