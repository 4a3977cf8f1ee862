"""Correlated gradient noise: one Gaussian mechanism for the whole stream, every release free.

The learner adds ``σ·(M·Z)_t`` to the gradient of every step t, where ``A = B·C`` factorizes
the prefix-sum workload and ``M = C⁻¹`` (:mod:`stream_dp.privacy.correlated_noise`: BLT, the
binary tree, or independent noise). Up to post-processing this publishes ``C·G + σZ`` — a
single Gaussian mechanism, also for gradients that depend on earlier outputs (Denisov et al.,
NeurIPS 2022, Thm. 2.1) — whose sensitivity ``Δ = sup ‖C(G − G′)‖_F`` over neighbouring streams
comes from the factorization and the buffer's pairwise influence pattern
(:mod:`stream_dp.privacy.influence`, :mod:`stream_dp.privacy.mf`). Its cost ``Δ²/(2σ²)`` is
charged once, before the first noisy gradient exists; every iterate, and the polynomial-decay
average of the iterates released at every step (Shamir and Zhang, ICML 2013), are
post-processing and free. Derivation: ``docs/privacy.md`` (*Correlated noise*).

Noise rows are computed a block at a time (they never depend on data) into one array that both
the reference step (a row per step) and the compiled fast path (a run of rows, through
:class:`CorrelatedNoiseSettings`) read, so both add the same rows. The recurrence state at the
next step to learn goes into checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from stream_dp._jit import jitable
from stream_dp.buffers import Buffer
from stream_dp.online.mechanism import (
    CompiledMechanism,
    Mechanism,
    compiled_hooks,
    restore_budget,
)
from stream_dp.privacy.budget import BudgetExhausted, BudgetSlice, PrivacyBudget
from stream_dp.privacy.correlated_noise import block_rows
from stream_dp.privacy.mf import MFMechanism
from stream_dp.privacy.noise import KeyedNoise

__all__ = [
    "CorrelatedNoiseMechanism",
    "CorrelatedNoiseSettings",
    "average_update",
    "check_budget_params",
]


def check_budget_params(epsilon: float | None, delta: float) -> None:
    """The (ε, δ) of a learner whose stream is one correlated-noise mechanism: ε a positive
    finite number (None: no noise, not private), δ in (0, 1).

    Examples
    --------
    >>> check_budget_params(None, 1e-5)
    >>> check_budget_params(0.0, 1e-5)
    Traceback (most recent call last):
    ...
    ValueError: epsilon must be a positive finite number or None, got 0.0

    """
    eps = epsilon
    if eps is not None and not (
        isinstance(eps, int | float) and not isinstance(eps, bool) and eps > 0
        and math.isfinite(eps)
    ):  # fmt: skip
        raise ValueError(f"epsilon must be a positive finite number or None, got {eps!r}")
    if not (isinstance(delta, float | int) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


@jitable
def average_update(avg, w, t, kappa):
    """``w̄_t = w̄_{t−1} + (κ + 1)/(t + κ)·(w_t − w̄_{t−1})`` in place (κ ≥ 0; κ = 0 is the plain
    running mean): the polynomial-decay average of Shamir and Zhang (ICML 2013), which weighs
    step t like ``t^κ`` and so forgets the early, far-from-optimal iterates.

    Examples
    --------
    >>> import numpy as np
    >>> avg = np.zeros(1)
    >>> for t, w in enumerate([1.0, 2.0, 3.0], start=1):
    ...     average_update(avg, np.array([w]), t, 0.0)
    >>> float(avg[0])
    2.0

    """
    rate = (kappa + 1.0) / (t + kappa)
    for i in range(avg.shape[0]):
        avg[i] = avg[i] + rate * (w[i] - avg[i])


class CorrelatedNoiseMechanism(Mechanism):
    """Correlated Gaussian noise on the gradients; the release is the iterates' average.

    Parameters
    ----------
    mf
        Δ, σ and the factorization of the stream (:class:`stream_dp.privacy.mf.MFMechanism`);
        σ = 0 for a noise-free run.
    budget
        The zCDP budget the stream's one charge goes to (or the learner's slice of it); None
        for a noise-free run.
    averaging
        κ of the released polynomial-decay average; None releases the last iterate.
    horizon
        The last step; None for an unbounded stream (BLT only: Δ covers any length).

    """

    name = "correlated-noise"
    warmup = 0
    project_release = False  # an average of points of the convex set C is in C

    def __init__(
        self,
        mf: MFMechanism,
        budget: PrivacyBudget | BudgetSlice | None,
        averaging: float | None = 1.0,
        horizon: int | None = None,
    ) -> None:
        if mf.private and budget is None:
            raise ValueError("correlated noise with σ > 0 is charged to a budget")
        self.mf = mf
        self.budget = budget
        self.averaging = averaging
        self.horizon = horizon
        self.private = mf.private
        self.charged = False
        self.exhausted_why: str | None = None
        self.t = 0  # steps taken (the noise row of step t + 1 is the next one used)

    @property
    def n_charged(self) -> int:
        return int(self.charged)

    def bind(self, noise: KeyedNoise, shape: tuple[int, ...]) -> None:
        super().bind(noise, shape)
        size = int(np.prod(self.shape))
        if size != self.mf.size:
            raise ValueError(f"the mechanism was sized for {self.mf.size} values, not {size}")
        self.stream = self.mf.noise(noise)
        rows = block_rows(size) if self.private else 0
        if self.horizon is not None:
            rows = min(rows, int(self.horizon))
        self.block = np.zeros((rows, size))  # σ·(M·Z)_t for t = block_first … (+ block_count)
        self.block_first = 1
        self.block_count = 0
        self.average = np.zeros(size)

    # -- the plan -----------------------------------------------------------------------------
    def releases_at(self, t: int) -> bool:
        return True  # every release is post-processing of the one charged mechanism

    def can_step(self, t: int) -> bool:
        """Step t may be learned: within the horizon and, for the first one, the stream's one
        charge accepted before any noisy gradient exists."""
        if self.horizon is not None and t > int(self.horizon):
            self.exhausted_why = f"the horizon n={self.horizon} is reached"
            return False
        if self.private and not self.charged:
            try:
                self.budget.charge(self.mf.event(t))
            except BudgetExhausted as exc:
                self.exhausted_why = str(exc)
                return False
            self.charged = True
        return True

    # -- noise --------------------------------------------------------------------------------
    def ensure_block(self, t: int) -> int:
        """Make the block hold the row of step t (rows are computed in step order); the number
        of rows from t to the block's end."""
        if not self.charged:  # can_step charges before step 1; nothing noisy exists before
            raise RuntimeError("correlated noise is read before the stream's charge was made")
        end = self.block_first + self.block_count
        if not self.block_first <= t < end:
            if t != self.stream.position:
                raise RuntimeError(
                    f"correlated noise is read in step order: step {t} after "
                    f"{self.stream.position - 1}"
                )
            count = len(self.block)
            if self.horizon is not None:
                count = min(count, int(self.horizon) - t + 1)
            self.block[:count] = self.stream.next_rows(count)
            self.block[:count] *= self.mf.sigma
            self.block_first, self.block_count = t, count
            end = t + count
        return end - t

    def gradient_noise(self, t: int) -> np.ndarray | None:
        if not self.private:
            return None
        self.ensure_block(t)
        return self.block[t - self.block_first]

    def release(self, t: int, w: np.ndarray) -> np.ndarray:
        self.t = t
        if self.averaging is None:
            return w.copy()
        average_update(self.average, w, t, float(self.averaging))
        return self.average.copy()

    def ran(self, t: int) -> None:
        """The compiled code took the steps up to t (it updated :attr:`average` in place)."""
        self.t = t

    def compiled(
        self, buffer: Buffer, step_size: Callable[[int], float], rows: int
    ) -> _Compiled | None:
        """The compiled code reads the rows of :attr:`block`; the learner's keyed noise only."""
        return _Compiled(self) if type(self.noise) is KeyedNoise else None

    # -- reporting and checkpoints ------------------------------------------------------------
    def describe(self) -> str:
        mf = self.mf
        if not self.private:
            return f"no noise (not private); {mf.factorization.name} factorization unused"
        return (
            f"correlated Gaussian gradient noise ({mf.factorization.name}): "
            f"Δ={mf.sensitivity:.4g}, σ={mf.sigma:.4g}, one charge ρ={mf.charged_rho:.4g} for "
            "the whole stream"
        )

    def nbytes(self) -> dict[str, int]:
        return {} if self.budget is None else {"ledger": self.budget.accountant.nbytes()}

    def state_dict(self) -> dict:
        bound = hasattr(self, "stream")
        return {
            "budget": None if self.budget is None else self.budget.to_dict(),
            "charged": self.charged,
            "t": self.t,
            "average": self.average.copy() if bound else None,
            # The recurrence state at the next step to learn (the block is recomputed).
            "noise": self.stream.state_dict(at=self.t + 1) if bound and self.private else None,
            "exhausted_why": self.exhausted_why,
        }

    def load_state_dict(self, state: dict) -> None:
        if (state["budget"] is None) != (self.budget is None):
            raise ValueError("the checkpoint's privacy setting (ε) is not this learner's")
        if self.budget is not None:
            self.budget = restore_budget(self.budget, state["budget"])
        self.charged = bool(state["charged"])
        if self.charged and self.private:
            # The noise to come is this mechanism's: the charge on the ledger must be its own
            # (Δ, σ), or the stream would pay for one mechanism and run another.
            mine = self.mf.event(1)
            paid = [e for e in self.budget.accountant.ledger if e.mechanism == mine.mechanism]
            if [(e.sensitivity, e.sigma) for e in paid[:1]] != [(mine.sensitivity, mine.sigma)]:
                raise ValueError(
                    f"the checkpoint's charge {paid[:1]} is not this learner's mechanism "
                    f"(Δ={mine.sensitivity}, σ={mine.sigma}): its parameters differ"
                )
        self.t = int(state["t"])
        self.exhausted_why = state.get("exhausted_why")
        if hasattr(self, "stream"):
            if state["average"] is not None:
                self.average[:] = np.asarray(state["average"], dtype=float).reshape(-1)
            if state["noise"] is not None:
                self.stream.load_state_dict(state["noise"])
            self.block_first, self.block_count = self.stream.position, 0


# -- the compiled side ----------------------------------------------------------------------------
class CorrelatedNoiseSettings(NamedTuple):
    """What the compiled step needs of :class:`CorrelatedNoiseMechanism` (arrays shared)."""

    #: ``σ·(M·Z)_t`` for the steps ``first[0] …`` (no rows: a noise-free run).
    rows: np.ndarray
    first: np.ndarray
    #: The released average (updated in place) and its κ; κ < 0 releases the last iterate.
    average: np.ndarray
    kappa: float
    #: An empty row: the gradient noise of a noise-free run.
    none: np.ndarray


def _gradient_noise(s, t):  # pragma: no cover - compiled
    if s.rows.shape[0] > 0:
        return s.rows[t - s.first[0]]
    return s.none


def _release(s, t, w, sensitivity):  # pragma: no cover - compiled
    if s.kappa >= 0.0:
        average_update(s.average, w, t, s.kappa)
        return s.average
    return w


compiled_hooks(
    CorrelatedNoiseSettings,
    releases_at=lambda s, t: True,
    gradient_noise=_gradient_noise,
    release=_release,
)


class _Compiled(CompiledMechanism):
    """Runs within the horizon and the block of noise rows computed for them."""

    def __init__(self, mech: CorrelatedNoiseMechanism) -> None:
        self.mech = mech
        self.first = np.ones(1, dtype=np.int64)
        self._first = 1  # first[0], as last written
        self._held: tuple = ()  # the mechanism's arrays the settings hold

    def settings(self) -> CorrelatedNoiseSettings:
        mech = self.mech
        kappa = -1.0 if mech.averaging is None else float(mech.averaging)
        self._held = (mech.block, mech.average)
        self.stale = False
        return CorrelatedNoiseSettings(mech.block, self.first, mech.average, kappa, np.zeros(0))

    def one(self, t0: int) -> bool:
        # steps(t0, 1)'s common case without its calls (one record per call): the next step's
        # row is in the block at hand and the horizon is not reached.
        mech = self.mech
        t = t0 + 1
        first = mech.block_first
        if not (
            mech.private
            and first <= t < first + mech.block_count
            and (mech.horizon is None or t <= mech.horizon)
        ):
            return self.steps(t0, 1) == 1
        held = self._held
        if held and (mech.block is not held[0] or mech.average is not held[1]):
            self.stale = True  # rebound, or replaced
        if self._first != first:
            self.first[0] = self._first = first
        return True

    def steps(self, t0: int, m: int) -> int:
        mech = self.mech
        held = self._held
        if held and (mech.block is not held[0] or mech.average is not held[1]):
            self.stale = True  # rebound, or replaced
        if mech.horizon is not None:
            m = min(m, int(mech.horizon) - t0)
        if mech.private and m > 0:
            m = min(m, mech.ensure_block(t0 + 1))
        self.first[0] = self._first = mech.block_first
        return max(m, 0)

    def ran(self, t0: int, m: int) -> None:
        self.mech.ran(t0 + m)
