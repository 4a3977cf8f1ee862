"""Buffers of past records that each new record is paired with.

Which records sit in a buffer depends only on arrival indices and a keyed RNG, never on record
values — otherwise the sensitivity analysis breaks. Buffers preallocate their arrays; a slot is
identified by its row, and ``ids`` holds the arrival step of the record in each slot, which the
certified-sensitivity tracker needs (``docs/privacy.md``, *Certified sensitivity*).

"""

from __future__ import annotations

import warnings

import numpy as np

from stream_dp.privacy.noise import KeyedNoise

__all__ = ["Buffer", "AllBuffer", "FIFOBuffer", "ReservoirBuffer", "make_buffer"]


class Buffer:
    """Base class. ``view()`` returns ``(X, Y)`` for the current members (views, never copies)."""

    #: True when a record can occupy at most one slot.
    distinct: bool = True
    kind: str = ""

    def __init__(self) -> None:
        self.X: np.ndarray | None = None
        self.Y: np.ndarray | None = None
        self.ids: np.ndarray | None = None
        self.n = 0
        self.dim: int | None = None

    @property
    def capacity(self) -> int | None:
        return None

    def __len__(self) -> int:
        return self.n

    def _alloc(self, rows: int, dim: int) -> None:
        self.X = np.zeros((rows, dim))
        self.Y = np.zeros(rows)
        self.ids = np.full(rows, -1, dtype=np.int64)

    def bind(self, dim: int) -> None:
        """Allocate storage once the feature dimension is known."""
        self.dim = dim
        self._alloc(self.capacity or 64, dim)

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        if self.X is None:
            return np.zeros((0, 0)), np.zeros(0)
        return self.X[: self.n], self.Y[: self.n]

    def member_ids(self) -> np.ndarray:
        return self.ids[: self.n] if self.ids is not None else np.zeros(0, dtype=np.int64)

    def plan_writes(
        self, t0: int, m: int, noise: KeyedNoise | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where records ``t0 + 1 … t0 + m`` will be written, without writing them.

        Returns ``(off, slots, nb)``: record ``t0 + 1 + j`` goes to ``slots[off[j]:off[j+1]]``,
        and ``nb[j]`` is the number of members before it arrives (``nb[m]`` after the last).
        A pure function of the indices and the keyed coins — never of record values. Storage
        is grown here if needed (``all``); membership changes only through :meth:`add` or the
        fast path's writes followed by :meth:`advance`.
        """
        raise NotImplementedError  # pragma: no cover

    def advance(self, k: int) -> None:
        """Account for ``k`` records written as :meth:`plan_writes` planned (size, ring head)."""
        raise NotImplementedError  # pragma: no cover

    def add(
        self, x: np.ndarray, y: float, step: int, noise: KeyedNoise | None = None
    ) -> list[tuple[int, int]]:
        """Offer record ``step``; returns the ``(slot, previous id)`` pairs it was written to."""
        _, slots, _ = self.plan_writes(step - 1, 1, noise)
        written = [self._write(int(s), x, y, step) for s in slots]
        self.advance(1)
        return written

    def _write(self, slot: int, x: np.ndarray, y: float, step: int) -> tuple[int, int]:
        old = int(self.ids[slot])
        self.X[slot] = x
        self.Y[slot] = y
        self.ids[slot] = step
        return slot, old

    def state_dict(self) -> dict:
        X, Y = self.view()
        return {
            "kind": self.kind,
            "params": self._params(),
            "dim": self.dim,
            "n": self.n,
            "X": X.copy(),
            "Y": Y.copy(),
            "ids": self.member_ids().copy(),
            "extra": self._extra_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["kind"] != self.kind or state["params"] != self._params():
            raise ValueError(
                f"checkpoint holds a {state['kind']}{state['params']} buffer, "
                f"this learner uses {self.kind}{self._params()}"
            )
        if state["dim"] is None:
            return
        self.bind(int(state["dim"]))
        n = int(state["n"])
        if self.capacity is None and n > len(self.Y):
            self._alloc(max(n, 64), self.dim)
        self.X[:n] = state["X"]
        self.Y[:n] = state["Y"]
        self.ids[:n] = state["ids"]
        self.n = n
        self._load_extra(state.get("extra", {}))

    def _params(self) -> dict:
        return {}

    def _extra_state(self) -> dict:
        return {}

    def _load_extra(self, extra: dict) -> None:
        pass

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.X, self.Y, self.ids) if a is not None)


class AllBuffer(Buffer):
    """Every past record (Huai et al.): ``B_t = {z_1, …, z_{t−1}}``. Memory and step cost O(t·d).

    Storage doubles when full (amortised O(1) appends). A ``ResourceWarning`` is issued once
    when the buffer passes ``warn_above`` records, because an unbounded stream will eventually
    exhaust memory: use :class:`FIFOBuffer` or :class:`ReservoirBuffer` there.
    """

    kind = "all"

    def __init__(self, warn_above: int = 100_000) -> None:
        # (members, unused, storage rows) in one array, shared with the compiled fast path.
        self._ring = np.array([0, 0, 0], dtype=np.int64)
        super().__init__()
        self.warn_above = int(warn_above)
        self._warned = False

    @property
    def n(self) -> int:
        return int(self._ring[0])

    @n.setter
    def n(self, value: int) -> None:
        self._ring[0] = value

    def ring_state(self) -> np.ndarray:
        """``[members, 0, storage rows]``, read and advanced in place by the fast path."""
        return self._ring

    def bind(self, dim: int) -> None:
        self.dim = dim
        self._alloc(64, dim)

    def _alloc(self, rows: int, dim: int) -> None:
        super()._alloc(rows, dim)
        self._ring[2] = rows

    def reserve(self, m: int) -> None:
        """Make room for m more records (storage doubles, as one append at a time would)."""
        need = self.n + m
        if need > len(self.Y):
            cap = len(self.Y)
            while cap < need:
                cap *= 2
            X, Y, ids = self.X, self.Y, self.ids
            self._alloc(cap, self.dim)
            self.X[: self.n], self.Y[: self.n], self.ids[: self.n] = (
                X[: self.n],
                Y[: self.n],
                ids[: self.n],
            )

    def plan_writes(self, t0, m, noise=None):
        self.reserve(m)
        rows = np.arange(self.n, self.n + m + 1, dtype=np.int64)
        return np.arange(m + 1, dtype=np.int64), rows[:m], rows

    def advance(self, k):
        self.n += k
        self.check_size()

    def check_size(self) -> None:
        """Warn once when the buffer passes ``warn_above`` records."""
        if self.n > self.warn_above and not self._warned:
            self._warned = True
            warnings.warn(
                f"the 'all' buffer holds {self.n} records ({self.nbytes() / 1e6:.0f} MB) and "
                "grows with the stream (O(n·d) memory, O(n·d) per step); use a FIFO or "
                "reservoir buffer for unbounded streams",
                ResourceWarning,
                stacklevel=4,
            )

    def _params(self) -> dict:
        return {}


class FIFOBuffer(Buffer):
    """The last ``size`` records, in a preallocated ring. Memory O(s·d), step cost O(s·d)."""

    kind = "fifo"

    def __init__(self, size: int) -> None:
        if int(size) < 1:
            raise ValueError(f"buffer size must be >= 1, got {size!r}")
        # (members, ring head, size) in one array, shared with the compiled fast path.
        self._ring = np.array([0, 0, int(size)], dtype=np.int64)
        super().__init__()
        self.size = int(size)

    @property
    def n(self) -> int:
        return int(self._ring[0])

    @n.setter
    def n(self, value: int) -> None:
        self._ring[0] = value

    @property
    def _next(self) -> int:
        return int(self._ring[1])

    @_next.setter
    def _next(self, value: int) -> None:
        self._ring[1] = value

    @property
    def capacity(self) -> int:
        return self.size

    def ring_state(self) -> np.ndarray:
        """``[members, next slot, size]``, read and advanced in place by the fast path."""
        return self._ring

    def plan_writes(self, t0, m, noise=None):
        j = np.arange(m + 1, dtype=np.int64)
        return j, (self._next + j[:m]) % self.size, np.minimum(self.n + j, self.size)

    def advance(self, k):
        self._next = (self._next + k) % self.size
        self.n = min(self.n + k, self.size)

    def _params(self) -> dict:
        return {"size": self.size}

    def _extra_state(self) -> dict:
        return {"next": self._next}

    def _load_extra(self, extra: dict) -> None:
        self._next = int(extra.get("next", self.n % self.size))


class ReservoirBuffer(Buffer):
    """RS-x of Kar et al. (2013): each of ``size`` slots independently takes the t-th record with
    probability 1/t, so every slot is a uniform draw from the past (with replacement).

    The coin flips come from the learner's keyed generator (purpose ``"buffer"``, counter t):
    data-independent and reproduced exactly on replay. A record may fill several slots, and an
    old record can stay for ever: the certified sensitivity accounts for both.
    """

    kind = "reservoir"
    distinct = False

    def __init__(self, size: int) -> None:
        super().__init__()
        if int(size) < 1:
            raise ValueError(f"buffer size must be >= 1, got {size!r}")
        self.size = int(size)

    @property
    def capacity(self) -> int:
        return self.size

    def plan_writes(self, t0, m, noise=None):
        if noise is None:
            raise ValueError("a reservoir buffer needs the learner's keyed noise for its coins")
        parts, off, n = [], [0], self.n
        for step in range(t0 + 1, t0 + m + 1):
            if n == 0:
                slots = np.arange(self.size)  # the first record fills every slot (prob. 1/1)
            else:
                coins = noise.generator(step, "buffer").random(self.size)
                slots = np.flatnonzero(coins < 1.0 / step)
            parts.append(slots)
            off.append(off[-1] + len(slots))
            n = self.size
        nb = np.full(m + 1, self.size, dtype=np.int64)
        nb[0] = self.n
        slots = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return np.array(off, dtype=np.int64), slots, nb

    def advance(self, k):
        if k > 0:
            self.n = self.size

    def _params(self) -> dict:
        return {"size": self.size}


def make_buffer(spec: str | int | Buffer, warn_above: int = 100_000) -> Buffer:
    """``"all"``, an int (FIFO of that size), ``"fifo:N"``, ``"reservoir:N"`` or a Buffer."""
    if isinstance(spec, Buffer):
        return spec
    if isinstance(spec, bool):
        raise ValueError(f"invalid buffer {spec!r}")
    if isinstance(spec, int | np.integer):
        return FIFOBuffer(int(spec))
    if isinstance(spec, str):
        if spec == "all":
            return AllBuffer(warn_above=warn_above)
        kind, _, size = spec.partition(":")
        if kind == "fifo" and size.isdigit():
            return FIFOBuffer(int(size))
        if kind == "reservoir" and size.isdigit():
            return ReservoirBuffer(int(size))
    raise ValueError(
        f"invalid buffer {spec!r}: use 'all', an int (FIFO size), 'fifo:N' or 'reservoir:N'"
    )
