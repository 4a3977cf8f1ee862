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
A cache of the slots of the last few thousand distinct keys (a fixed size, never checkpointed)
spares a unit with many events the hash and the probe.

"""

from __future__ import annotations

import array
import hashlib
import itertools
import struct

import numpy as np

from connectors.schema import RecordError
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
_RECENT = 4096
_FORMAT = 1
_PERSON = b"stream_dp/units"  # BLAKE2b personalisation of the unit hash


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


def _reference(unit) -> str | bytes:
    """One hashable name per unit: its canonical bytes as a str when they are UTF-8 (surrogates
    allowed, as :func:`unit_bytes` encodes them), else the bytes. ``42``, ``"42"`` and ``b"42"``
    all give ``"42"``, so a unit has a single entry in :class:`ContributionBound`'s cache."""
    if type(unit) is str:
        return unit
    data = unit_bytes(unit)
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data


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
        self._derived()
        self._check = self._hash(b"\x00stream_dp/unit-key-check")
        self._clear(_MIN_CAPACITY)
        self._dropped = [0, 0, 0]
        self.last_step = 0  # the step of the latest admitted event: steps only increase

    def _derived(self) -> None:
        """The keyed hash and the cache: rebuilt, never stored (hash objects do not pickle)."""
        self._copy = hashlib.blake2b(key=self._key, digest_size=16, person=_PERSON).copy
        # A write-back cache of the recently seen units: [last step, count, index of the state
        # word in the table] (the table's state word is stale while a unit is here). A unit with
        # many events pays for BLAKE2b and the probe once per _RECENT distinct units, and its
        # events touch one small list: small ints, updated in place, no packing. The table is
        # written when the cache is full, before it grows, and before anything reads it. Keyed
        # by the unit's one canonical name (_reference): two names of one unit must never hold
        # two states. str and bytes are hashed by Python's seeded SipHash, so keys cannot be
        # chosen to collide in it. Its size does not grow with the units.
        self._cache: dict[str | bytes, list[int]] = {}
        self._cached = self._cache.get

    def __getstate__(self) -> dict:
        self._flush()
        state = dict(self.__dict__)
        for name in ("_copy", "_cache", "_cached"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
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
        # The common case — a unit in the cache, a valid step — in as few operations as possible.
        try:
            cached = self._cached(unit)
        except TypeError:  # unhashable: not a unit key (the cold path says why)
            cached = None
        if cached is not None and self.last_step < step <= MAX_STEP and type(step) is int:
            count = cached[1]
            if count < self.max_events and step - cached[0] >= self.min_separation:
                cached[0] = step
                cached[1] = count + 1
                self.last_step = step
                return True
            return self._drop(count)
        return self._admit_cold(unit, step, cached is None and type(unit) is str)

    def _admit_cold(self, unit, step, new_name: bool = False) -> bool:
        """:meth:`admit` for a unit not in the cache under this name (``new_name``: a str that
        the cache was just asked for), or for an unusual step: check the step, find the unit
        (hash and probe) or insert it, cache it, then decide as :meth:`admit` does."""
        if type(step) is not int or not self.last_step < step <= MAX_STEP:
            step = self._check_step(step)
        ref = unit if type(unit) is str else _reference(unit)  # RecordError: not a unit key
        cache = self._cache
        if new_name or ref not in cache:
            lo, hi = self._hash(ref.encode("utf-8", "surrogatepass") if type(ref) is str else ref)
            j = self._probe(lo, hi)
            if j < 0:  # a new unit: its first event is admitted, unless units are capped
                return self._insert_unit(ref, ~j, lo, hi, step)
            state = self._table[j + 2]
            if len(cache) >= _RECENT:
                self._evict()
            cache[ref] = [state >> _COUNT_BITS, state & _COUNT_MASK, j + 2]
        return self.admit(ref, step)  # cached now, under its canonical name

    def _insert_unit(self, ref: str | bytes, j: int, lo: int, hi: int, step: int) -> bool:
        """A new unit's first event, at the empty slot whose first word is j: admitted."""
        if self.max_units is not None and self._units >= self.max_units:
            self._dropped[2] += 1
            return False
        table = self._table
        table[j] = lo
        table[j + 1] = hi
        table[j + 2] = (step << _COUNT_BITS) | 1
        self._units += 1
        self.last_step = step
        if len(self._cache) >= _RECENT:
            self._evict()
        self._cache[ref] = [step, 1, j + 2]
        if self._units > self._grow_at:
            self._resize(2 * self._capacity)  # moves units; the cache follows them
        return True

    def _check_step(self, step) -> int:
        step = int(step)
        if not self.last_step < step <= MAX_STEP:
            raise ValueError(
                f"step {step} is not after the last admitted step {self.last_step}: the learner "
                "and its contribution bound are out of step"
            )
        return step

    def _drop(self, count: int) -> bool:
        self._dropped[0 if count >= self.max_events else 1] += 1
        return False

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
        self._flush()
        j = self._probe(*self._hash(unit_bytes(unit)))
        return 0 if j < 0 else int(self._table[j + 2] & _COUNT_MASK)

    # -- what it did ----------------------------------------------------------------------------
    @property
    def dropped(self) -> dict[str, int]:
        """Dropped events by reason (:data:`DROP_REASONS`)."""
        return dict(zip(DROP_REASONS, self._dropped, strict=True))

    @property
    def admitted(self) -> int:
        """Events admitted so far: the sum of the units' counts."""
        self._flush()
        return int(np.sum(self._view()[:, 2] & np.uint64(_COUNT_MASK), dtype=np.uint64))

    @property
    def n_units(self) -> int:
        """Units with at least one admitted event."""
        return self._units

    @property
    def nbytes(self) -> int:
        """Bytes of the per-unit table (the only part that grows with the units)."""
        return self._table.buffer_info()[1] * self._table.itemsize

    def describe(self) -> str:
        d = self.dropped
        return (
            f"contribution bound: ≤ {self.max_events} events per unit, ≥ {self.min_separation} "
            f"steps apart; {self.admitted} admitted, {self._units} units, dropped "
            + ", ".join(f"{v} ({k})" for k, v in d.items())
        )

    def __repr__(self) -> str:
        return (
            f"ContributionBound(max_events={self.max_events}, "
            f"min_separation={self.min_separation}, units={self._units})"
        )

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The occupied slots (24 bytes per unit), the counters and a check of the hash key."""
        self._flush()
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
        self.last_step = int(state["last_step"])
        self._dropped = [int(dropped[r]) for r in DROP_REASONS]

    # -- the table ------------------------------------------------------------------------------
    def _hash(self, data: bytes) -> tuple[int, int]:
        h = self._copy()
        h.update(data)
        return _UNPACK(h.digest())

    def _probe(self, lo: int, hi: int) -> int:
        table, mask = self._table, self._mask
        i = lo & mask
        while True:
            j = _WIDTH * i
            if table[j + 2] == 0:
                return ~j
            if table[j] == lo and table[j + 1] == hi:
                return j
            i = (i + 1) & mask

    def _evict(self) -> None:
        """Drop the older half of the cache (first inserted), its states written to the table."""
        self._flush()
        cache = self._cache
        for ref in list(itertools.islice(cache, len(cache) // 2 or 1)):
            del cache[ref]

    def _flush(self) -> None:
        """Write the cached states into the table (the cache keeps them)."""
        cache = self._cache
        if cache:
            rows = np.fromiter(
                itertools.chain.from_iterable(cache.values()), dtype=np.int64, count=3 * len(cache)
            ).reshape(-1, 3)
            packed = (rows[:, 0].astype(np.uint64) << np.uint64(_COUNT_BITS)) | rows[:, 1].astype(
                np.uint64
            )
            np.frombuffer(self._table, dtype=np.uint64)[rows[:, 2]] = packed

    def _clear(self, capacity: int) -> None:
        self._cache.clear()
        self._capacity = capacity
        self._mask = capacity - 1
        self._grow_at = int(_MAX_LOAD * capacity)
        self._table = array.array("Q", bytes(8 * _WIDTH * capacity))
        self._units = 0

    def _view(self) -> np.ndarray:
        return np.frombuffer(self._table, dtype=np.uint64).reshape(-1, _WIDTH)

    def _resize(self, capacity: int) -> None:
        """Rehash into a table of ``capacity`` slots; cached units follow their slots."""
        self._flush()
        view = self._view()
        occupied = np.flatnonzero(view[:, 2] != 0)
        slots = view[occupied].copy()
        cached = dict(self._cache)
        self._clear(capacity)
        moved = self._insert(slots)  # new slot of each old occupied slot, in that order
        if cached:
            entries = list(cached.values())
            old = np.fromiter((e[2] for e in entries), dtype=np.int64, count=len(entries))
            new = moved[np.searchsorted(occupied, old // _WIDTH)] * _WIDTH + 2
            for entry, at in zip(entries, new.tolist(), strict=True):
                entry[2] = at
            self._cache.update(cached)

    def _insert(self, slots: np.ndarray) -> np.ndarray:
        """Place distinct units into the empty table by linear probing, vectorised; returns the
        slot each row of ``slots`` went to.

        Sorted by home slot h, the i-th unit goes to ``max(h_i, p_{i−1} + 1) = i + max_{j≤i}(h_j −
        j)``. Units pushed past the end wrap to the front: they are placed again, first, with home
        0 — which only moves later units further along runs they already belong to — until none
        is past the end (the table is at most 80 % full).
        """
        m = len(slots)
        if m > self._grow_at:
            raise ValueError("more units than the table may hold")
        home = (slots[:, 0] & np.uint64(self._mask)).astype(np.int64)
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
        self._units = m
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
