"""Certified ℓ2 sensitivity of the internal iterate, for any buffer policy (SPEC §4).

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
only — never on record values — so the noise calibrated to it is data-independent.

:class:`CertifiedSensitivity` tracks ``Δ_t(i)`` per buffer slot, plus one number for every
record that has left the buffer (they all evolve by the same monotone map, so their maximum is
enough). For the ``all`` buffer every member gets the same update, so one number suffices
there too: the tracker costs O(1) per step for ``all`` and O(s) for FIFO and reservoir.

"""

from __future__ import annotations

import math

import numpy as np

from stream_dp._kernels import cert_admit, cert_step, contraction

__all__ = ["CertifiedSensitivity", "contraction"]

_NO_IDS = np.zeros(0, dtype=np.int64)


def _state_property(index: int, doc: str) -> property:
    def get(self) -> float:
        return float(self._st[index])

    def set_(self, value: float) -> None:
        self._st[index] = value

    return property(get, set_, doc=doc)


class CertifiedSensitivity:
    """Tracks the certified bound of SPEC §4 alongside a learner's buffer.

    The recurrence itself lives in :func:`stream_dp._kernels.cert_step` and
    :func:`~stream_dp._kernels.cert_admit`, which the learners' batched plan
    (:func:`~stream_dp._kernels.plan_chunk`) runs too: this class holds the state (four numbers
    and the per-slot bounds) and gives it a per-step interface.

    Parameters
    ----------
    lipschitz, alpha, smoothness
        G, α and L of the (regularised) loss.
    diameter
        diam(C): no two iterates can be further apart.
    shared_members
        True for the ``all`` buffer: every member receives the same partner term, so one
        scalar replaces the per-slot array.

    Examples
    --------
    >>> tr = CertifiedSensitivity(lipschitz=1.0, alpha=0.5, smoothness=1.0, diameter=2.0,
    ...                           shared_members=True)
    >>> tr.step(eta=0.5, n_partners=0, member_ids=None)   # no partner: no gradient, no bound
    0.0
    >>> tr.admit(written=[(0, -1)], new_id=1)
    >>> tr.step(eta=0.5, n_partners=1, member_ids=None)   # new record 2, partner record 1
    1.0

    """

    def __init__(
        self,
        lipschitz: float,
        alpha: float,
        smoothness: float,
        diameter: float,
        shared_members: bool = False,
    ) -> None:
        self.G = float(lipschitz)
        self.alpha = float(alpha)
        self.L = float(smoothness)
        self.diameter = float(diameter)
        self.shared = bool(shared_members)
        self.slot_bound = np.zeros(0)
        # [member_max (used when shared), outside, new_bound, current]
        self._st = np.zeros(4)
        self._consts = np.array([self.G, self.alpha, self.L, self.diameter])

    member_max = _state_property(0, "Bound of every member of a shared (``all``) buffer.")
    outside = _state_property(1, "Largest bound of a record that has left the buffer.")
    new_bound = _state_property(2, "Bound of the newest record (not yet in the buffer).")
    current = _state_property(3, "Δ_t: the bound of the latest iterate.")

    @property
    def constants(self) -> np.ndarray:
        """``(G, α, L, diam)`` as the kernels take them."""
        return self._consts

    def _ensure(self, n_slots: int) -> None:
        if len(self.slot_bound) < n_slots:
            grown = np.zeros(max(n_slots, 2 * len(self.slot_bound)))
            grown[: len(self.slot_bound)] = self.slot_bound
            self.slot_bound = grown

    def step(self, eta: float, n_partners: int, member_ids: np.ndarray | None) -> float:
        """Advance by one gradient step with step size η against ``n_partners`` buffered records.

        ``member_ids`` (the arrival id in each slot) is needed only for a buffer where a record
        can fill several slots. Returns the bound for the iterate after this step, counting the
        new record as a member of nothing yet (call :meth:`admit` next).
        """
        if not self.shared:
            self._ensure(n_partners)
        ids = _NO_IDS if member_ids is None else np.asarray(member_ids, dtype=np.int64)
        return float(
            cert_step(
                self._st, self.slot_bound, self.shared, member_ids is None, self.G, self.alpha,
                self.L, self.diameter, float(eta), int(n_partners), ids,
            )
        )  # fmt: skip

    def _slot_max(self, n: int) -> float:
        return float(self.slot_bound[:n].max()) if n else 0.0

    def admit(
        self, written: list[tuple[int, int]], new_id: int, member_ids: np.ndarray | None = None
    ) -> None:
        """Record where the buffer put the new record (``(slot, previous id)`` pairs)."""
        slots = np.array([s for s, _ in written], dtype=np.int64)
        olds = np.array([o for _, o in written], dtype=np.int64)
        if len(slots) and not self.shared:
            self._ensure(int(slots.max()) + 1)
        ids = _NO_IDS if member_ids is None else np.asarray(member_ids, dtype=np.int64)
        cert_admit(
            self._st, self.slot_bound, self.shared, member_ids is None, slots, olds, ids, len(ids)
        )

    def state_dict(self) -> dict:
        return {
            "slot_bound": self.slot_bound.copy(),
            "member_max": self.member_max,
            "outside": self.outside,
            "new_bound": self.new_bound,
            "current": self.current,
        }

    def load_state_dict(self, s: dict) -> None:
        self.slot_bound = np.asarray(s["slot_bound"], dtype=float).copy()
        self._st = np.array(
            [s["member_max"], s["outside"], s["new_bound"], s["current"]], dtype=float
        )


def _check_finite(*values: float) -> None:
    for v in values:
        if not math.isfinite(v):
            raise ValueError("sensitivity constants must be finite (is the loss smooth?)")
