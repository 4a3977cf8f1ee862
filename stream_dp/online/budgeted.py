"""What every private online learner says about its budget: the ledger and the release message.

A private learner's mechanism charges a :class:`~stream_dp.privacy.budget.PrivacyBudget` (or,
with ``budget_share < 1`` or ``metrics_share > 0``, its slice of one; the private operator
metrics charge another slice). :class:`BudgetedLearner` exposes that budget, its
ledger and the fields a release is published with, the same way for every mechanism, so the
engine, the demo and a user read them without knowing which learner runs.
"""

from __future__ import annotations

from stream_dp.online.composition import PRIVATE_LEARNER
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
        }
