"""The privacy mechanism of an online learner: what noise enters a step, where, and its cost.

The learner core (:mod:`stream_dp.online.base`) runs the pairwise step — partners, gradient,
projected update, buffer — and asks its mechanism the rest. A mechanism

- says how many warm-up steps release data-independent models (:attr:`Mechanism.warmup`) and at
  which steps a model is released (:meth:`Mechanism.releases_at`);
- follows each step's data-independent facts — step size, partners, where the record was
  buffered — to know the sensitivity of what it releases (:meth:`Mechanism.observe`);
- may add noise to the gradient (:meth:`Mechanism.gradient_noise`: correlated-noise mechanisms)
  and perturbs, charges and returns each released model (:meth:`Mechanism.release`), or refuses
  it when the budget is spent (the learner is then exhausted);
- optionally describes itself to the compiled fast path (:meth:`Mechanism.fast_settings`);
  without that, its learners take the reference step, which is correct but slower.

Adding a mechanism is adding a module with a subclass and registering it with
:func:`register` (``docs/design.md``, *Adding a mechanism*, walks through output perturbation
as the example). Everything a mechanism draws is keyed by the learner's secret through its
:class:`~stream_dp.privacy.noise.KeyedNoise`, so a replayed step reproduces its release.
"""

from __future__ import annotations

import numpy as np

from stream_dp.privacy.noise import KeyedNoise

__all__ = ["Mechanism", "Unperturbed", "mechanism_class", "register", "restore_budget"]

_REGISTRY: dict[str, type[Mechanism]] = {}


def register(cls: type[Mechanism]) -> type[Mechanism]:
    """Class decorator: make a mechanism known by its ``name`` (:func:`mechanism_class`)."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"a mechanism needs a new, non-empty name, got {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def mechanism_class(name: str) -> type[Mechanism]:
    """The registered mechanism called ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown mechanism {name!r}; known: {sorted(_REGISTRY)}") from None


class Mechanism:
    """Base class: the privacy side of an online pairwise learner (see the module docstring).

    A mechanism is built by its learner's constructor from the learner's parameters; it is
    bound to the learner's keyed noise and model shape once the dimension is known.
    """

    #: The registry name.
    name: str = ""
    #: Where the noise enters: ``"output"`` (each release is perturbed and charged),
    #: ``"gradient"`` (every gradient is; the releases are free), ``"none"``.
    kind: str = "output"
    #: False for a mechanism that publishes nothing (the non-private baseline): its learner
    #: serves the iterate itself.
    publishes: bool = True
    #: False when nothing released carries noise (the baseline, a noise-free correlated run).
    private: bool = True
    #: Warm-up steps: their releases are data-independent random models (cost nothing).
    warmup: int = 0
    #: Whether a release is projected onto C by the learner (False: it is in C already).
    project_release: bool = True

    def bind(self, noise: KeyedNoise, shape: tuple[int, ...]) -> None:
        """Attach the learner's keyed noise and the model's shape (once d is known)."""
        self.noise = noise
        self.shape = tuple(shape)

    # -- the plan: data-independent --------------------------------------------------------
    def releases_at(self, t: int) -> bool:
        """Whether step t publishes a model."""
        raise NotImplementedError  # pragma: no cover

    def observe(self, t: int, eta: float, n_partners: int, slots, olds, ids_before, ids_after):
        """Step t took a gradient step of size η against ``n_partners`` buffered records (η = 0:
        a warm-up step) and the record went to ``slots``, which held ``olds``; ``ids_before``
        and ``ids_after`` are the buffer's arrival ids around the write."""

    def can_step(self, t: int) -> bool:
        """False once nothing may be learned any more (the learner is then exhausted)."""
        return True

    # -- noise ------------------------------------------------------------------------------
    def gradient_noise(self, t: int) -> np.ndarray | None:
        """Noise added to step t's gradient (flattened), or None."""
        return None

    def release(self, t: int, w: np.ndarray) -> np.ndarray | None:
        """The model released at step t from the iterate ``w`` (flattened), charged to the
        budget before it is computed; None if refused (the budget is spent)."""
        raise NotImplementedError  # pragma: no cover

    def warmup_model(self, t: int, constraint) -> np.ndarray:
        """The data-independent model a warm-up step ``t <= warmup`` holds (in ``constraint``)."""
        raise NotImplementedError  # pragma: no cover

    def fast_settings(self):
        """What the compiled fast path needs to run this mechanism, or None (reference only)."""
        return None

    # -- reporting and checkpoints ------------------------------------------------------------
    def describe(self) -> str:
        return self.name

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@register
class Unperturbed(Mechanism):
    """No noise and no release: the non-private baseline (PairwiseGIGA) serves its iterate."""

    name = "unperturbed"
    kind = "none"
    publishes = False
    private = False

    def releases_at(self, t: int) -> bool:
        return False

    def release(self, t: int, w: np.ndarray) -> None:  # pragma: no cover - never asked
        return None

    def describe(self) -> str:
        return "no privacy: the iterate itself is served"


def restore_budget(current, state: dict):
    """The budget (or slice) of a checkpoint, refused unless it has ``current``'s limit,
    ε and δ: a learner never resumes someone else's ledger."""
    from stream_dp.privacy.budget import budget_or_slice_from_dict

    budget = budget_or_slice_from_dict(state)
    mine = (current.limit, current.epsilon, current.delta)
    if (budget.limit, budget.epsilon, budget.delta) != mine:
        budget.accountant.storage.close()
        raise ValueError(
            f"checkpoint's budget (ε={budget.epsilon}, δ={budget.delta}) is not this "
            f"learner's (ε={current.epsilon}, δ={current.delta})"
        )
    return budget
