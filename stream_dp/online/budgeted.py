"""What every private online learner says about its budget: the ledger and the release message.

A private learner's mechanism charges a :class:`~stream_dp.privacy.budget.PrivacyBudget` (or,
with ``budget_share < 1`` or ``metrics_share > 0``, its slice of one; the private operator
metrics charge another slice). :class:`BudgetedLearner` exposes that budget, its
ledger and the fields a release is published with, the same way for every mechanism, so the
engine, the demo and a user read them without knowing which learner runs.
"""

from __future__ import annotations

from stream_dp.online.composition import PRIVATE_LEARNER
from stream_dp.online.units import event_epsilon
from stream_dp.operator_metrics import OperatorMetricsMixin
from stream_dp.privacy.budget import BudgetSlice, PrivacyBudget

__all__ = ["BudgetedLearner"]


class BudgetedLearner(OperatorMetricsMixin):
    """Mixin of the private online learners (with :class:`~stream_dp.online.base.
    PairwiseLearner`): ``budget``, ``accountant``, ``ledger_state`` and ``release_message``, and
    the private operator metrics of ``metrics_share`` (:mod:`stream_dp.operator_metrics`)."""

    def _more_tags(self) -> set[str]:
        return {PRIVATE_LEARNER}

    @property
    def budget(self) -> PrivacyBudget | None:
        """The zCDP budget the releases are charged to (it refuses what would overrun it); with
        ``budget_share < 1`` the learner charges a slice of it. None for a noise-free run."""
        budget = self._state.mechanism.budget
        return budget.parent if isinstance(budget, BudgetSlice) else budget

    @property
    def accountant(self):
        """The ledger of every charge and the (ε, δ) spent: ``accountant.spent()``."""
        budget = self._state.mechanism.budget
        return None if budget is None else budget.accountant

    @staticmethod
    def ledger_state(state: dict) -> dict | None:
        """The ledger's part of a :meth:`state_dict` (where a journal's path is recorded)."""
        budget = state["mechanism"]["budget"]
        return None if budget is None else budget.get("parent", budget)["accountant"]

    def release_message(self) -> dict:
        """The fields of a release: never raw records, gradients or the iterate."""
        w = self._state.ring.latest if self._state.ring is not None else None
        acc = self.accountant
        eps, delta = acc.spent() if acc is not None else (None, None)
        return {
            "model_id": self.model_id,
            "algorithm": type(self).__name__,
            "task": self.task,
            "step": self.release_step,
            "release_index": self.n_releases,
            "weights": [] if w is None else w.ravel().tolist(),
            "shape": [] if w is None else list(w.shape),
            "feature_names": [str(n) for n in (self.feature_names or ())],
            "rho_spent": acc.rho_spent() if acc is not None else 0.0,
            "rho_budget": self.budget.limit if acc is not None else 0.0,
            "epsilon_spent": eps,
            "delta": delta,
            "exhausted": self.exhausted,
            "private": self.private,
        } | self._unit_fields(acc, delta)

    # -- the neighbouring relation --------------------------------------------------------------
    def _own_rhos(self) -> tuple[float, float]:  # pragma: no cover - per mechanism
        """ρ of this learner's own charges at its unit-level Δ, and at the event-level Δ."""
        raise NotImplementedError

    def _event_epsilon(self, acc, delta: float) -> float:
        """The event-level ε of what was spent: the own charges at one event's Δ."""
        unit_rho, event_rho = self._own_rhos()
        rho = max(acc.rho_spent() - unit_rho + event_rho, 0.0)
        return event_epsilon(rho, delta, acc.conversion)

    def _unit_fields(self, acc, delta) -> dict:
        """A unit-level learner's release fields: the relation and the event-level ε."""
        if self._unit is None:
            return {}
        out = {"privacy_unit": self._unit.relation()}
        if acc is not None:
            out["epsilon_event_spent"] = self._event_epsilon(acc, delta)
        return out

    def guarantee(self) -> dict:
        """The neighbouring relation, the (ε, δ) spent for it and, for a unit-level learner,
        the event-level ε of the same noise beside it (``docs/units.md``)."""
        acc = self.accountant
        eps, delta = acc.spent() if acc is not None else (None, None)
        out = {**self.neighbouring(), "epsilon": eps, "delta": delta}
        if self._unit is not None and acc is not None:
            out["epsilon_event"] = self._event_epsilon(acc, delta)
            out["dropped"] = self.units_dropped
        return out

    def _plan_unit(self, event_sensitivity: float, event_rho: float) -> dict:
        """The relation and the event-level Δ and ρ, for a unit-level ``noise_plan`` entry."""
        if self._unit is None:
            return {}
        return {
            "neighbouring": self._unit.relation(),
            "event_sensitivity": event_sensitivity,
            "event_rho": event_rho,
        }

    def _describe_guarantee(self, event_rho: float) -> str:
        """The relation, and for a unit-level learner the event-level ε of its noise."""
        text = self._describe_unit()
        if self._unit is None or self.budget is None:
            return text
        eps = event_epsilon(event_rho, self.delta, self.conversion)
        return (
            f"{text}; unit-level (ε={self.epsilon}, δ={self.delta}), the same noise is "
            f"event-level ε≈{eps:.3g}"
        )
