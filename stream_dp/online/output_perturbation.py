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
"""

from __future__ import annotations

import copy

import numpy as np

from stream_dp.huai import huai_sensitivity, is_release_step
from stream_dp.online.mechanism import Mechanism, register, restore_budget
from stream_dp.privacy.budget import BudgetExhausted, BudgetSlice, PrivacyBudget
from stream_dp.privacy.events import GaussianEvent, GaussianEvents, gaussian_rho
from stream_dp.privacy.mechanisms import release_sigma
from stream_dp.privacy.noise import KeyedNoise, rows_per_block
from stream_dp.privacy.schedules import Schedule, schedule_from_dict
from stream_dp.sensitivity import CertifiedSensitivity

__all__ = ["OutputPerturbation"]


@register
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
    ) -> None:
        self.budget = budget
        self.schedule = schedule
        self.tracker = tracker
        self.warmup = int(warmup)
        self.release_every = int(release_every)
        self.horizon = horizon
        self.paper_sensitivity = paper_sensitivity
        self.n_charged = 0
        self.last_sigma: float | None = None
        self.last_sensitivity: float | None = None
        self.exhausted_why: str | None = None
        self._certain = 0  # further releases certainly affordable (see certain())
        self._ledger_len = 0  # the ledger's length after our last charge

    # -- the plan -------------------------------------------------------------------------------
    @property
    def horizon_code(self) -> int:
        return -1 if self.horizon is None else int(self.horizon)

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
        """Δ_t of the iterate just observed (the paper's bound, if chosen, never below it)."""
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
        return w + self.noise.gaussian(t, (w.size,), sigma)

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

    # -- the fast path ----------------------------------------------------------------------------
    def fast_settings(self):
        """Noise rows in blocks (:meth:`KeyedNoise.block`) and the default keyed noise only."""
        if type(self.noise) is not KeyedNoise or rows_per_block(int(np.prod(self.shape))) < 2:
            return None
        return self

    def releases_in(self, t0: int, m: int) -> np.ndarray:
        """The release steps among ``t0 + 1 … t0 + m``."""
        steps = [t for t in range(t0 + 1, t0 + m + 1) if self.releases_at(t)]
        return np.array(steps, dtype=np.int64)

    def rhos(self, count: int) -> np.ndarray:
        """The budgets of the next ``count`` charged releases, in order."""
        k = self.n_charged
        return np.array([self.rho(k + i) for i in range(1, count + 1)])

    def commit(self, steps: np.ndarray, sens: np.ndarray, sigmas: np.ndarray) -> None:
        """Charge the releases the fast path made (all certainly affordable: see
        :meth:`certain`)."""
        if len(steps) == 1:
            self.commit_one(int(steps[0]), float(sens[0]), float(sigmas[0]))
            return
        self.budget.charge(GaussianEvents(steps, sens, sigmas))
        self._charged(float(sens[-1]), float(sigmas[-1]), len(steps))

    def commit_one(self, step: int, sens: float, sigma: float) -> None:
        """:meth:`commit` of one release."""
        self.budget.charge(GaussianEvent(step, sens, sigma))
        self._charged(sens, sigma)

    # -- reporting and checkpoints ------------------------------------------------------------
    def describe(self) -> str:
        sched = self.schedule
        n = sched.n_releases
        plan = f"{n} charged releases" if n is not None else repr(sched)
        return f"Gaussian output perturbation, {plan}"

    def state_dict(self) -> dict:
        return {
            "budget": self.budget.to_dict(),
            "tracker": self.tracker.state_dict(),
            "n_charged": self.n_charged,
            "schedule": self.schedule.to_dict(),
            "exhausted_why": self.exhausted_why,
        }

    def load_state_dict(self, state: dict) -> None:
        self.budget = restore_budget(self.budget, state["budget"])
        self.tracker.load_state_dict(state["tracker"])
        self.n_charged = int(state["n_charged"])
        stored = schedule_from_dict(state["schedule"]) if "schedule" in state else None
        if stored is not None and stored.to_dict() != self.schedule.to_dict():
            raise ValueError(f"checkpoint was made with {stored!r}, this learner uses "
                             f"{self.schedule!r}")  # fmt: skip
        self.exhausted_why = state.get("exhausted_why")
        self._certain = 0
        self._ledger_len = -1
