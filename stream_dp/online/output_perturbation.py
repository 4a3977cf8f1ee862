"""Output perturbation with a certified sensitivity: the release side of Huai et al. Algorithm 1.

At a release step t the model ``Π_C(w_t + N(0, σ_t² I))`` is published, with

- ``Δ_t`` the certified bound on ``‖w_t − w'_t‖`` over neighbouring streams
  (:mod:`stream_dp.sensitivity`; ``sensitivity="paper"``: Huai et al. Lemma 4's ``8G/(αt)``,
  never below the certified bound),
- ``ρ_k`` the k-th release's share of the zCDP budget (:mod:`stream_dp.privacy.schedules`:
  the horizon split of Algorithm 1, or the anytime schedule),
- ``σ_t = Δ_t/√(2ρ_k)`` (:func:`stream_dp.privacy.mechanisms.release_sigma`), charged to the
  budget as ``Δ_t²/(2σ_t²) = ρ_k`` *before* the release is computed.

Steps ``1..T1`` release data-independent random models (no cost). Noise is
``σ_t·z_t`` with ``z_t`` the keyed standard-normal row of step t (purpose ``"release"``), so a
replayed step re-publishes its release. Derivations: ``docs/privacy.md`` (*Certified
sensitivity*, *Accounting*); the algorithm: ``docs/algorithms.md`` (*OnPairStrC*).

The compiled side (:class:`OutputPerturbationSettings` and its hooks) runs the same rules —
:func:`~stream_dp.sensitivity.cert_step`, :func:`~stream_dp.huai.is_release_step`,
:func:`~stream_dp.privacy.mechanisms.release_sigma` — on noise rows drawn a block at a time, and
reports every release as (step, Δ, σ), charged right after the compiled call.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from stream_dp._jit import jitable
from stream_dp.buffers import Buffer
from stream_dp.huai import huai_sensitivity, is_release_step
from stream_dp.online.mechanism import (
    CompiledMechanism,
    Mechanism,
    compiled_hooks,
    restore_budget,
)
from stream_dp.privacy.budget import BudgetExhausted, BudgetSlice, PrivacyBudget
from stream_dp.privacy.events import GaussianEvent, GaussianEvents, gaussian_rho
from stream_dp.privacy.mechanisms import release_sigma
from stream_dp.privacy.noise import KeyedNoise, rows_per_block
from stream_dp.privacy.schedules import Schedule, schedule_from_dict
from stream_dp.privacy.unit_sensitivity import replaced_events, replaced_events_bound
from stream_dp.sensitivity import CertifiedSensitivity, cert_admit, cert_step

__all__ = ["OutputPerturbation", "OutputPerturbationSettings"]

_new_tuple = tuple.__new__


class OutputPerturbation(Mechanism):
    """Gaussian output perturbation of the iterate at each release step.

    Parameters
    ----------
    budget
        The zCDP budget every release is charged to (or the learner's slice of it).
    schedule
        The share of the budget of the k-th release.
    tracker
        The certified sensitivity of the learner's iterate.
    warmup
        T1: steps that release data-independent models.
    release_every
        Release every k-th step (see :func:`stream_dp.huai.is_release_step`).
    horizon
        The last step (``None``: none); after it the budget is spent.
    paper_sensitivity
        ``(G, α)`` to use Huai et al. Lemma 4's ``8G/(αt)`` (never below the certified bound),
        or None for the certified bound alone.

    """

    name = "output-perturbation"

    def __init__(
        self,
        budget: PrivacyBudget | BudgetSlice,
        schedule: Schedule,
        tracker: CertifiedSensitivity,
        warmup: int,
        release_every: int = 1,
        horizon: int | None = None,
        paper_sensitivity: tuple[float, float] | None = None,
        max_events: int = 1,
    ) -> None:
        self.budget = budget
        self.schedule = schedule
        self.tracker = tracker
        self.warmup = int(warmup)
        self.release_every = int(release_every)
        self.horizon = horizon
        #: The horizon for compiled code and :func:`~stream_dp.huai.is_release_step` (−1: none).
        self.horizon_code = -1 if horizon is None else int(horizon)
        self.paper_sensitivity = paper_sensitivity
        # k > 1 (a unit-level learner): every release is calibrated to k replaced records
        # (replaced_events_bound); the event-level cost of the same charges is kept beside it.
        self.max_events = int(max_events)
        #: ρ of the charges at the unit-level Δ and at one event's Δ (:func:`add_unit_costs`),
        #: updated in place by both steps (the compiled one holds this array).
        self.unit_rhos = np.zeros(2)
        self.n_charged = 0
        self.last_sigma: float | None = None
        self.last_sensitivity: float | None = None
        self.exhausted_why: str | None = None
        self._certain = 0  # further releases certainly affordable (see certain())
        self._ledger_len = 0  # the ledger's length after our last charge

    # -- the plan -------------------------------------------------------------------------------
    def releases_at(self, t: int) -> bool:
        return is_release_step(t, self.warmup, self.release_every, self.horizon_code)

    def can_step(self, t: int) -> bool:
        if self.horizon is not None and t > int(self.horizon):
            self.exhausted_why = f"the horizon n={self.horizon} is reached"
            return False
        return True

    def observe(self, t, eta, n_partners, slots, olds, ids_before, ids_after) -> None:
        tr = self.tracker
        if t <= self.warmup:
            tr.skip()  # a warm-up record has not moved the iterate
        else:
            tr.step(eta, n_partners, None if tr.distinct else ids_before)
        tr.admit(slots, olds, None if tr.distinct else ids_after)

    def sensitivity(self, t: int, tracker: CertifiedSensitivity | None = None) -> float:
        """Δ_t of the iterate just observed for the learner's neighbouring relation: one
        record, or k records of one unit (``min(diam C, k·Δ_t)``)."""
        bound = self.event_sensitivity(t, tracker)
        if self.max_events == 1:
            return bound
        diameter = float((tracker or self.tracker).constants[3])
        return replaced_events_bound(bound, self.max_events, diameter)

    def event_sensitivity(self, t: int, tracker: CertifiedSensitivity | None = None) -> float:
        """Δ_t of one record (the paper's bound, if chosen, never below it)."""
        bound = (tracker or self.tracker).current
        if self.paper_sensitivity is not None:
            G, alpha = self.paper_sensitivity
            return max(huai_sensitivity(G, alpha, t), bound)
        return bound

    def rho(self, k: int) -> float:
        """The budget of the k-th charged release (0 once a horizon's budget is spent)."""
        return self.budget.limit * self.schedule.share(k)

    # -- releasing ------------------------------------------------------------------------------
    def release(self, t: int, w: np.ndarray) -> np.ndarray | None:
        if t <= self.warmup:  # Alg. 1 steps 2–7: the iterate is the data-independent model
            return w.copy()
        rho = self.rho(self.n_charged + 1)
        if rho <= 0.0:
            self._refuse(t, "the horizon's budget is spent")
            return None
        sens = self.sensitivity(t)
        sigma = release_sigma(sens, rho)
        try:
            self.budget.charge(GaussianEvent(t, sens, sigma))
        except BudgetExhausted as exc:
            self._refuse(t, str(exc))
            return None
        self._charged(sens, sigma)
        if self.max_events > 1:
            add_unit_costs(self.unit_rhos, sens, self.event_sensitivity(t), sigma)
        return w + self.noise.gaussian(t, (w.size,), sigma)

    @property
    def rho_unit_spent(self) -> float:
        """ρ of this mechanism's charges, each at the Δ it was calibrated to (k > 1 only)."""
        return float(self.unit_rhos[0])

    @property
    def rho_event_spent(self) -> float:
        """ρ the same charges cost at one event's Δ (both 0 when k = 1: not kept)."""
        return float(self.unit_rhos[1])

    def _charged(self, sens: float, sigma: float, count: int = 1) -> None:
        self.n_charged += count
        self._certain -= count
        self._ledger_len = self.budget.accountant.storage.n_rows
        self.last_sigma, self.last_sensitivity = sigma, sens

    def _refuse(self, t: int, why: str) -> None:
        if self.exhausted_why is None:
            self.exhausted_why = why

    def warmup_model(self, t: int, constraint) -> np.ndarray:
        """The data-independent model of warm-up step t (keyed: a replay draws it again)."""
        return constraint.sample(self.noise.generator(t, "warmup"), self.shape)

    def certain(self, releases: int) -> bool:
        """True when none of the next ``releases`` charges can be refused, whatever its
        sensitivity: a release at share ρ_k costs ρ_k (up to rounding) and shares never
        increase, so ``⌊remaining / (2ρ_k)⌋`` next charges surely fit. The count is kept and
        recomputed when it runs out or when someone else charged the same budget."""
        if self.budget.accountant.storage.n_rows != self._ledger_len:
            self._certain = 0
            self._ledger_len = self.budget.accountant.storage.n_rows
        if self._certain < releases:
            rho = self.rho(self.n_charged + 1)
            self._certain = self.budget.certain_charges(rho)
        return self._certain >= releases

    def affordable(self, t: int, eta: float, n_partners: int, member_ids) -> bool:
        """Whether the release of step t will be paid for, decided exactly before the step: its
        Δ_t comes from a copy of the tracker (what :meth:`observe` will compute), its σ and cost
        from the same rules as :meth:`release`. For the last releases of a budget, where
        :meth:`certain` cannot tell."""
        rho = self.rho(self.n_charged + 1)
        if rho <= 0.0:
            return False
        probe = copy.deepcopy(self.tracker)
        probe.step(eta, n_partners, None if probe.distinct else member_ids)
        bound = self.sensitivity(t, probe)
        return self.budget.can_afford(gaussian_rho(bound, release_sigma(bound, rho)))

    # -- the compiled side --------------------------------------------------------------------
    def compiled(
        self, buffer: Buffer, step_size: Callable[[int], float], rows: int
    ) -> _Compiled | None:
        """Noise rows in blocks (:meth:`KeyedNoise.block`) of the default keyed noise only."""
        if type(self.noise) is not KeyedNoise or rows_per_block(int(np.prod(self.shape))) < 2:
            return None
        return _Compiled(self, buffer, step_size, rows)

    def releases_in(self, t0: int, m: int) -> np.ndarray:
        """The release steps among ``t0 + 1 … t0 + m``."""
        steps = [t for t in range(t0 + 1, t0 + m + 1) if self.releases_at(t)]
        return np.array(steps, dtype=np.int64)

    def rhos(self, count: int) -> np.ndarray:
        """The budgets of the next ``count`` charged releases, in order."""
        k = self.n_charged
        return np.array([self.rho(k + i) for i in range(1, count + 1)])

    # -- reporting and checkpoints ------------------------------------------------------------
    def describe(self) -> str:
        sched = self.schedule
        n = sched.n_releases
        plan = f"{n} charged releases" if n is not None else repr(sched)
        return f"Gaussian output perturbation, {plan}"

    def nbytes(self) -> dict[str, int]:
        ledger = self.budget.accountant.nbytes()
        return {"ledger": ledger, "tracker": self.tracker.slot_bound.nbytes}

    def state_dict(self) -> dict:
        return {
            "budget": self.budget.to_dict(),
            "tracker": self.tracker.state_dict(),
            "n_charged": self.n_charged,
            "schedule": self.schedule.to_dict(),
            "exhausted_why": self.exhausted_why,
        } | (
            {}
            if self.max_events == 1
            else {"rho_event_spent": self.rho_event_spent, "rho_unit_spent": self.rho_unit_spent}
        )

    def load_state_dict(self, state: dict) -> None:
        self.budget = restore_budget(self.budget, state["budget"])
        self.tracker.load_state_dict(state["tracker"])
        self.n_charged = int(state["n_charged"])
        stored = schedule_from_dict(state["schedule"]) if "schedule" in state else None
        if stored is not None and stored.to_dict() != self.schedule.to_dict():
            raise ValueError(f"checkpoint was made with {stored!r}, this learner uses "
                             f"{self.schedule!r}")  # fmt: skip
        self.exhausted_why = state.get("exhausted_why")
        # In place: the compiled step holds the array.
        self.unit_rhos[:] = (state.get("rho_unit_spent", 0.0), state.get("rho_event_spent", 0.0))
        self._certain = 0
        self._ledger_len = -1


@jitable
def add_unit_costs(acc: np.ndarray, sens: float, event: float, sigma: float) -> None:
    """Add one release's ρ at its Δ and at one event's Δ to ``acc`` (in place).

    ``Δ²/(2σ²)`` as products, not :func:`~stream_dp.privacy.events.gaussian_rho`'s powers:
    IEEE products are what both the compiled and the reference step compute bit for bit
    (``x**2`` goes through the C library's ``pow``, which compiled code replaces by ``x*x``).
    These sums only *report* the cost (the event-level ε beside the unit-level one); what is
    charged is the ledger's event, costed by the accountant.

    Examples
    --------
    >>> acc = np.zeros(2)
    >>> add_unit_costs(acc, 0.6, 0.2, 1.0)  # k = 3 events of Δ 0.2
    >>> acc.round(4).tolist()
    [0.18, 0.02]

    """
    two_var = 2.0 * sigma * sigma
    acc[0] += sens * sens / two_var
    acc[1] += event * event / two_var


# -- the compiled side ----------------------------------------------------------------------------
class OutputPerturbationSettings(NamedTuple):
    """What the compiled step needs of :class:`OutputPerturbation` (arrays shared, not copied)."""

    #: The certified tracker (:class:`~stream_dp.sensitivity.CertifiedSensitivity`): its flags,
    #: state, per-slot bounds and constants (G, α, L, diam C).
    shared: bool
    distinct: bool
    tst: np.ndarray
    tsb: np.ndarray
    consts: np.ndarray
    #: Huai et al. Lemma 4's bound ``8G/(αt)`` instead (never below the certified bound).
    paper: bool
    paper_G: float
    paper_alpha: float
    #: k, the events of one unit a release is calibrated to (1: event-level): the release's Δ
    #: is ``min(diam C, k·Δ_t)``
    #: (:func:`~stream_dp.privacy.unit_sensitivity.replaced_events_bound`).
    k: int
    #: The release plan (:func:`~stream_dp.huai.is_release_step`).
    T1: int
    every: int
    horizon: int
    #: The keyed standard-normal rows of the current block (row ``t mod B`` is step t's).
    Z: np.ndarray
    #: The budget ρ_k of each release of the run, in order, and what each release reports.
    rhos: np.ndarray
    out_step: np.ndarray
    out_sens: np.ndarray
    out_sigma: np.ndarray
    #: The mechanism's :attr:`OutputPerturbation.unit_rhos`, added to at each release.
    unit_rhos: np.ndarray
    #: Releases made in the run so far (one value; the run's ``begin`` hook resets it).
    count: np.ndarray


def _begin(s):  # pragma: no cover - compiled
    s.count[0] = 0


def _releases_at(s, t):  # pragma: no cover - compiled
    return is_release_step(t, s.T1, s.every, s.horizon)


def _observe(s, t, eta, n, ids):  # pragma: no cover - compiled
    c = s.consts
    return cert_step(s.tst, s.tsb, s.shared, s.distinct, c[0], c[1], c[2], c[3], eta, n, ids)


def _release(s, t, w, bound):  # pragma: no cover - compiled
    # σ = Δ/√(2ρ_k) for the k-th release, Δ the certified bound (or Lemma 4's, never below).
    r = s.count[0]
    event = bound
    if s.paper:
        event = max(huai_sensitivity(s.paper_G, s.paper_alpha, t), bound)
    sens = replaced_events(event, s.k, s.consts[3])
    sigma = release_sigma(sens, s.rhos[r])
    noise = sigma * s.Z[t % s.Z.shape[0]]
    s.out_step[r] = t
    s.out_sens[r] = sens
    s.out_sigma[r] = sigma
    if s.k > 1:
        add_unit_costs(s.unit_rhos, sens, event, sigma)
    s.count[0] = r + 1
    return w + noise


def _admit(s, slots, olds, ids, n_after):  # pragma: no cover - compiled
    cert_admit(s.tst, s.tsb, s.shared, s.distinct, slots, olds, ids, n_after)


compiled_hooks(
    OutputPerturbationSettings,
    begin=_begin,
    releases_at=_releases_at,
    observe=_observe,
    release=_release,
    admit=_admit,
)


class _Compiled(CompiledMechanism):
    """The Python around :class:`OutputPerturbationSettings`: runs only while every release in
    them is certainly affordable; charges what the compiled code released right after it."""

    def __init__(
        self,
        mech: OutputPerturbation,
        buffer: Buffer,
        step_size: Callable[[int], float],
        rows: int,
    ) -> None:
        self.mech = mech
        self.buffer = buffer
        self.step_size = step_size
        size = int(np.prod(mech.shape))
        self.size = size
        self.per_block = rows_per_block(size)
        self.Z = np.zeros((self.per_block, size))
        self.block = -1  # the block of noise rows Z holds
        self.rhos = np.zeros(rows)
        self.out_step = np.zeros(rows, dtype=np.int64)
        self.out_sens = np.zeros(rows)
        self.out_sigma = np.zeros(rows)
        self.count = np.zeros(1, dtype=np.int64)
        self._held: tuple = ()  # the tracker's arrays the settings hold

    def settings(self) -> OutputPerturbationSettings:
        mech, tr = self.mech, self.mech.tracker
        tr.ensure(self.buffer.capacity or len(self.buffer.Y))
        self._held = (tr.state, tr.slot_bound)
        self.stale = False
        paper = mech.paper_sensitivity
        return OutputPerturbationSettings(
            shared=bool(tr.shared), distinct=bool(tr.distinct), tst=tr.state,
            tsb=tr.slot_bound, consts=tr.constants, paper=paper is not None,
            paper_G=float(paper[0]) if paper else 0.0,
            paper_alpha=float(paper[1]) if paper else 1.0, k=int(mech.max_events),
            T1=int(mech.warmup), every=int(mech.release_every), horizon=mech.horizon_code,
            Z=self.Z, rhos=self.rhos, out_step=self.out_step, out_sens=self.out_sens,
            out_sigma=self.out_sigma, unit_rhos=mech.unit_rhos, count=self.count,
        )  # fmt: skip

    def _check_held(self) -> None:
        tr, held = self.mech.tracker, self._held
        if held and (tr.slot_bound is not held[1] or tr.state is not held[0]):
            self.stale = True  # the reference step grew the tracker, or a checkpoint replaced it

    def _noise_block(self, t0: int) -> None:
        block = (t0 + 1) // self.per_block
        if self.block != block:
            self.Z[:] = self.mech.noise.block(block, self.size, "release")
            self.block = block

    def one(self, t0: int) -> bool:
        # The common case without the general rule (one record per call: inlined): no horizon
        # reached, and no release at this step or one the budget certainly pays for.
        mech = self.mech
        t = t0 + 1
        if mech.horizon is not None and t > mech.horizon:
            return False
        every = mech.release_every
        if (every == 1 and t > mech.warmup) or is_release_step(
            t, mech.warmup, every, mech.horizon_code
        ):  # (a release at every step after the warm-up: is_release_step's answer, inlined)
            if not mech.certain(1):
                return self.steps(t0, 1) == 1
            self.rhos[0] = mech.rho(mech.n_charged + 1)
        tr, held = mech.tracker, self._held
        if held and (tr.slot_bound is not held[1] or tr.state is not held[0]):
            self.stale = True
        if self.block != t // self.per_block:
            self._noise_block(t0)
        return True

    def steps(self, t0: int, m: int) -> int:
        mech = self.mech
        m = min(m, self.per_block - (t0 + 1) % self.per_block)
        if mech.horizon is not None:
            m = min(m, int(mech.horizon) - t0)
        if m <= 0:
            return 0
        count = int(mech.releases_at(t0 + 1)) if m == 1 else len(mech.releases_in(t0, m))
        if count and not mech.certain(count):
            # The budget's last releases: one step at a time, each release decided exactly.
            t = t0 + 1
            m = 1
            count = int(mech.releases_at(t))
            if count:
                buf = self.buffer
                if not mech.affordable(t, self.step_size(t), len(buf), buf.member_ids()):
                    return 0
        self._check_held()
        self._noise_block(t0)
        k = mech.n_charged
        for i in range(count):
            self.rhos[i] = mech.rho(k + 1 + i)
        return m

    def ran(self, t0: int, m: int) -> None:
        """Charge the releases the compiled code made (all certainly affordable: see
        :meth:`OutputPerturbation.certain`): one event, or the run's batch."""
        r = self.count.item(0)  # reset by the next run's begin hook
        if not r:
            return
        mech = self.mech
        if r == 1:  # learn_one's case: scalars, no slices
            sens, sigma = self.out_sens.item(0), self.out_sigma.item(0)
            budget = mech.budget
            if type(budget) is PrivacyBudget:  # one charge per record: no event object built
                budget.charge_gaussian(self.out_step.item(0), sens, sigma)
            else:
                # GaussianEvent(step, Δ, σ) by tuple's own constructor: the namedtuple's
                # Python-level __new__ would cost a fifth of the charge.
                budget.charge(
                    _new_tuple(GaussianEvent, (self.out_step.item(0), sens, sigma, "gaussian"))
                )
        else:
            sens, sigma = self.out_sens.item(r - 1), self.out_sigma.item(r - 1)
            steps, sens_all, sigmas = self.out_step[:r], self.out_sens[:r], self.out_sigma[:r]
            mech.budget.charge(GaussianEvents(steps, sens_all, sigmas))
        mech._charged(sens, sigma, r)
