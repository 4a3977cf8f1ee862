"""Certified ℓ2 sensitivity of the internal iterate, for any buffer policy.

Two neighbouring streams differ in one record z_i. Let ``Δ_t(i)`` bound ``‖w_t − w'_t‖`` when
record i differs. One projected gradient step on the buffer-averaged loss gives

    Δ_t(i) ≤ min( diam(C),  q_t · Δ_{t−1}(i) + e_t(i) )
    q_t    = max(|1 − η_t α|, |1 − η_t L|)          (contraction of w ↦ w − η∇f(w))
    e_t(i) = 2G·η_t            if i == t            (the new point differs)
           = 2G·η_t·m_t(i)/|B_t|  if z_i fills m_t(i) slots of B_t
           = 0                 otherwise

because Π_C is non-expansive, ``L̂_t`` is α-strongly convex and L-smooth (so the gradient map
is q_t-Lipschitz), and two gradients of one pair differ by at most 2G. The released sensitivity
is ``Δ_t = max_i Δ_t(i)``. The bound depends on step sizes, buffer membership and the constants
only — never on record values — so the noise calibrated to it is data-independent. The
derivation, and how it compares with Huai et al.'s Lemma 4, is in ``docs/privacy.md``
(*Certified sensitivity*).

:class:`CertifiedSensitivity` tracks ``Δ_t(i)`` per buffer slot, plus one number for every
record that has left the buffer (they all evolve by the same monotone map, so their maximum is
enough). For the ``all`` buffer every member gets the same update, so one number suffices
there too: the tracker costs O(1) per step for ``all`` and O(s) for FIFO and reservoir. The
recurrence is written once, as functions the compiled fast path calls too.

"""

from __future__ import annotations

import numpy as np

from stream_dp._jit import compiled_body, jitable

__all__ = [
    "CertifiedSensitivity",
    "cert_admit",
    "cert_step",
    "contraction",
    "decay_bounds",
    "slot_multiplicity",
]

#: Layout of :attr:`CertifiedSensitivity.state`.
MEMBER_MAX, OUTSIDE, NEW_BOUND, CURRENT = 0, 1, 2, 3

_NO_IDS = np.zeros(0, dtype=np.int64)


@jitable
def contraction(eta, alpha, smoothness):
    """``q = max(|1 − ηα|, |1 − ηL|)``: the Lipschitz constant of ``w ↦ w − η∇f(w)``."""
    return max(abs(1.0 - eta * alpha), abs(1.0 - eta * smoothness))


@jitable
def slot_multiplicity(ids, n):
    """For each of the first n slots, how many slots hold the same record (as a float)."""
    v = ids[:n]
    order = np.argsort(v, kind="mergesort")
    sv = v[order]
    new_group = np.empty(n, np.bool_)
    new_group[0] = True
    new_group[1:] = sv[1:] != sv[:-1]
    group = np.cumsum(new_group) - 1
    counts = np.bincount(group)
    out = np.empty(n)
    out[order] = counts[group]
    return out


def decay_bounds(b, q, e, diam):
    """``b ← min(diam, q·b + e)`` in place (n ≥ 1 slots); returns ``max(b)``. Compiled: one
    loop, without temporaries — the same operations element by element, so the same bits."""
    b[:] = np.minimum(diam, q * b + e)
    return b.max()


@compiled_body(decay_bounds)
def _decay_bounds_compiled(b, q, e, diam):
    def impl(b, q, e, diam):
        top = -np.inf
        nan = False
        for i in range(b.shape[0]):
            v = q * b[i] + e
            if diam < v or diam != diam:  # np.minimum(diam, v), NaN propagating
                v = diam
            b[i] = v
            if v > top:
                top = v
            elif v != v:
                nan = True
        return np.nan if nan else top

    return impl


@jitable
def cert_step(st, sb, shared, distinct, G, alpha, L, diam, eta, n, ids):
    """One gradient step of the certified recurrence; returns the bound ``Δ_t``.

    ``st`` is ``[member_max, outside, new_bound, current]`` and ``sb`` the per-slot bounds (see
    :class:`CertifiedSensitivity`, which holds them). ``ids`` (the buffer's arrival ids) is read
    only when a record can fill several slots.
    """
    if n == 0:
        st[2] = 0.0  # no pair, no gradient: the new record has not moved w
        cur = max(st[0] if shared else 0.0, 0.0)
        cur = max(cur, st[1])
        st[3] = cur
        return cur
    q = contraction(eta, alpha, L)
    e = 2.0 * G * eta / n
    st[1] = min(diam, q * st[1])
    if shared:
        st[0] = min(diam, q * st[0] + e)
        members = st[0]
    else:
        b = sb[:n]
        if distinct:
            members = decay_bounds(b, q, e, diam)
        else:  # a record in m slots contributes m partner terms; its slots share one bound
            b[:] = np.minimum(diam, q * b + e * slot_multiplicity(ids, n))
            members = b.max()
    st[2] = min(diam, 2.0 * G * eta)
    cur = max(members, st[1])
    cur = max(cur, st[2])
    st[3] = cur
    return cur


@jitable
def cert_admit(st, sb, shared, distinct, slots, olds, ids, n_after):
    """Record where the buffer put the new record: ``slots`` written, ``olds`` their old ids,
    ``ids`` the buffer's ids after the write (``n_after`` members)."""
    if shared:
        st[0] = max(st[0], st[2])
        return
    if slots.shape[0] == 0:
        st[1] = max(st[1], st[2])  # the record never entered: its bound lives outside
        return
    members = ids[:n_after]
    for i in range(slots.shape[0]):
        slot = slots[i]
        old = olds[i]
        if old >= 0 and (distinct or not np.any(members == old)):
            st[1] = max(st[1], sb[slot])  # the evicted record left the buffer
        sb[slot] = st[2]


class CertifiedSensitivity:
    """The certified bound's state alongside a learner's buffer, with a per-step interface.

    Parameters
    ----------
    lipschitz, alpha, smoothness
        G, α and L of the (regularised) loss.
    diameter
        diam(C): no two iterates can be further apart.
    shared_members
        True for the ``all`` buffer: every member receives the same partner term, so one
        scalar replaces the per-slot array.
    distinct
        False for a buffer where one record can fill several slots (reservoir).

    Attributes
    ----------
    state
        ``[member_max, outside, new_bound, current]``: the bound of every member of a shared
        buffer, the largest bound of a record that has left the buffer, the bound of the newest
        record (not yet admitted), and ``Δ_t``.
    slot_bound
        The bound of the record in each buffer slot.

    Examples
    --------
    >>> tr = CertifiedSensitivity(lipschitz=1.0, alpha=0.5, smoothness=1.0, diameter=2.0,
    ...                           shared_members=True)
    >>> tr.step(eta=0.5, n_partners=0)   # no partner: no gradient, no bound
    0.0
    >>> tr.admit(slots=[0], olds=[-1])
    >>> tr.step(eta=0.5, n_partners=1)   # new record 2, partner record 1
    1.0

    """

    def __init__(
        self,
        lipschitz: float,
        alpha: float,
        smoothness: float,
        diameter: float,
        shared_members: bool = False,
        distinct: bool = True,
    ) -> None:
        self.shared = bool(shared_members)
        self.distinct = bool(distinct)
        #: ``(G, α, L, diam)`` as the recurrence takes them.
        self.constants = np.array(
            [float(lipschitz), float(alpha), float(smoothness), float(diameter)]
        )
        self.state = np.zeros(4)
        self.slot_bound = np.zeros(0)

    @property
    def current(self) -> float:
        """Δ_t: the bound of the latest iterate."""
        return float(self.state[CURRENT])

    def ensure(self, n_slots: int) -> None:
        """Grow the per-slot bounds to at least ``n_slots`` (a growing ``all`` buffer)."""
        if not self.shared and len(self.slot_bound) < n_slots:
            grown = np.zeros(max(n_slots, 2 * len(self.slot_bound)))
            grown[: len(self.slot_bound)] = self.slot_bound
            self.slot_bound = grown

    def step(self, eta: float, n_partners: int, member_ids: np.ndarray | None = None) -> float:
        """One gradient step with step size η against ``n_partners`` buffered records; returns
        the bound of the new iterate (``member_ids``: the buffer's ids, when a record can fill
        several slots). Call :meth:`admit` next."""
        self.ensure(n_partners)
        ids = _NO_IDS if member_ids is None else np.asarray(member_ids, dtype=np.int64)
        G, alpha, L, diam = self.constants.tolist()
        return float(
            cert_step(self.state, self.slot_bound, self.shared, self.distinct, G, alpha, L, diam,
                      float(eta), int(n_partners), ids)
        )  # fmt: skip

    def skip(self) -> None:
        """A step that does not move the iterate by the data (a warm-up step)."""
        self.state[NEW_BOUND] = 0.0

    def admit(self, slots, olds, member_ids: np.ndarray | None = None) -> None:
        """Record where the buffer put the new record: ``slots`` written, ``olds`` the ids they
        held (−1: empty); ``member_ids`` the buffer's ids after the write (a reservoir)."""
        slots = np.asarray(slots, dtype=np.int64)
        olds = np.asarray(olds, dtype=np.int64)
        if len(slots):
            self.ensure(int(slots.max()) + 1)
        ids = _NO_IDS if member_ids is None else np.asarray(member_ids, dtype=np.int64)
        cert_admit(self.state, self.slot_bound, self.shared, self.distinct, slots, olds, ids,
                   len(ids))  # fmt: skip

    def state_dict(self) -> dict:
        return {
            "slot_bound": self.slot_bound.copy(),
            "member_max": float(self.state[MEMBER_MAX]),
            "outside": float(self.state[OUTSIDE]),
            "new_bound": float(self.state[NEW_BOUND]),
            "current": float(self.state[CURRENT]),
        }

    def load_state_dict(self, s: dict) -> None:
        self.slot_bound = np.asarray(s["slot_bound"], dtype=float).copy()
        self.state = np.array(
            [s["member_max"], s["outside"], s["new_bound"], s["current"]], dtype=float
        )
