"""The privacy mechanism of an online learner: what noise enters a step, where, and its cost.

The learner core (:mod:`stream_dp.online.base`) runs the pairwise step — partners, gradient,
projected update, buffer — and asks its mechanism the rest. A mechanism

- says how many warm-up steps release data-independent models (:attr:`Mechanism.warmup`) and at
  which steps a model is released (:meth:`Mechanism.releases_at`);
- follows each step's data-independent facts — step size, partners, where the record was
  buffered — to know the sensitivity of what it releases (:meth:`Mechanism.observe`);
- may add noise to the gradient (:meth:`Mechanism.gradient_noise`: correlated-noise mechanisms)
  and perturbs, charges and returns each released model (:meth:`Mechanism.release`), or refuses
  it when the budget is spent (the learner is then exhausted).

That is all the reference step (:mod:`stream_dp.online.reference`) needs. The compiled fast path
(:mod:`stream_dp.online.fast`) runs the same steps for runs of records and needs the same
answers from compiled code: a mechanism that wants it returns its :class:`CompiledMechanism`
from :meth:`Mechanism.compiled` — a *settings record* (a ``NamedTuple`` of the mechanism's
constants and the arrays its compiled hooks work on), whose type selects the *compiled hooks*
registered for it with :func:`compiled_hooks`, and the Python calls around a compiled run
(how many steps it may take, what to charge after it). The fast path knows no mechanism by name:
it calls the hooks on whatever record it is given. Without a compiled side the learner takes
the reference step, which is correct, only slower.

Adding a mechanism is adding a module with a subclass (``docs/design.md``, *Adding a mechanism*,
walks through output perturbation). Everything a mechanism draws is keyed by the learner's secret
through its :class:`~stream_dp.privacy.noise.KeyedNoise`, so a replayed step reproduces its
release.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from stream_dp._jit import NUMBA_INSTALLED, numba
from stream_dp.buffers import Buffer
from stream_dp.privacy.noise import KeyedNoise

__all__ = [
    "CompiledMechanism",
    "Mechanism",
    "Unperturbed",
    "compiled_hooks",
    "hook_admit",
    "hook_begin",
    "hook_gradient_noise",
    "hook_observe",
    "hook_release",
    "hook_releases_at",
    "restore_budget",
]


class Mechanism:
    """Base class: the privacy side of an online pairwise learner (see the module docstring).

    A mechanism is built by its learner's constructor from the learner's parameters; it is
    bound to the learner's keyed noise and model shape once the dimension is known.
    """

    #: The name :meth:`describe` gives by default.
    name: str = ""
    #: False for a mechanism that publishes nothing (the non-private baseline): its learner
    #: serves the iterate itself.
    publishes: bool = True
    #: False when nothing released carries noise (the baseline, a noise-free correlated run).
    private: bool = True
    #: Warm-up steps: their releases are data-independent random models (cost nothing).
    warmup: int = 0
    #: Whether a release is projected onto C by the learner (False: it is in C already).
    project_release: bool = True
    #: The budget the mechanism charges (a ``PrivacyBudget`` or ``BudgetSlice``), if any.
    budget: Any = None
    #: Why learning stopped, once it has (the budget, the horizon), for the learner's warning.
    exhausted_why: str | None = None

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

    # -- the compiled side ------------------------------------------------------------------
    def compiled(
        self, buffer: Buffer, step_size: Callable[[int], float], rows: int
    ) -> CompiledMechanism | None:
        """This mechanism's side of one learner's compiled fast path — the learner's buffer and
        step size rule, runs of at most ``rows`` steps — or None: the reference step takes every
        step."""
        return None

    # -- reporting and checkpoints ------------------------------------------------------------
    def describe(self) -> str:
        return self.name

    def nbytes(self) -> dict[str, int]:
        """Bytes the mechanism holds, by part (its ledger, its sensitivity tracker)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class CompiledMechanism:
    """A mechanism's side of one learner's compiled fast path: the Python around the hooks.

    The fast path puts :meth:`settings` into the struct it hands to compiled code; the compiled
    step calls the hooks registered for that record's type (:func:`compiled_hooks`). Around each
    compiled call it asks :meth:`steps` (or :meth:`one`) how many steps may run, and reports them
    to :meth:`ran`, which charges what they released before anything is served.
    """

    #: Set when an array the settings record holds was replaced since :meth:`settings` was
    #: last called (the fast path then calls it again before the next compiled run).
    stale: bool = False

    def settings(self) -> tuple:
        """The typed settings record (a ``NamedTuple`` with hooks registered for its type)."""
        raise NotImplementedError  # pragma: no cover

    def steps(self, t0: int, m: int) -> int:
        """How many of the steps ``t0 + 1 … t0 + m`` the compiled code may take (0: none,
        the reference step takes the next one), with what they need prepared. Called after
        the warm-up, with ``can_step(t0 + 1)`` granted."""
        raise NotImplementedError  # pragma: no cover

    def one(self, t0: int) -> bool:
        """:meth:`steps` of the next step alone (a mechanism may decide its common case
        faster)."""
        return self.steps(t0, 1) == 1

    def ran(self, t0: int, m: int) -> None:
        """The compiled code took steps ``t0 + 1 … t0 + m``: account for what it released
        (an exception here makes the learner withdraw its latest release and stop)."""


# -- the compiled hooks --------------------------------------------------------------------------
# What the compiled step asks a mechanism, by the type of its settings record. The functions
# below are the names the compiled code calls; :func:`compiled_hooks` gives each a body for one
# record type. They are never called from Python.


def hook_begin(settings):  # pragma: no cover - compiled only
    """A compiled run starts (default: nothing; a mechanism resets what it counts per run)."""
    raise NotImplementedError


def hook_releases_at(settings, t):  # pragma: no cover - compiled only
    """Whether step t publishes a model (default: never)."""
    raise NotImplementedError


def hook_observe(settings, t, eta, n, ids):  # pragma: no cover - compiled only
    """Step t's data-independent facts before its record is written — step size η, the number
    n of partners, the buffer's arrival ids — and the sensitivity of what step t releases
    (default: 0.0, nothing tracked)."""
    raise NotImplementedError


def hook_gradient_noise(settings, t):  # pragma: no cover - compiled only
    """The noise added to step t's gradient, a flat row; an empty row for none (the
    default)."""
    raise NotImplementedError


def hook_release(settings, t, w, sensitivity):  # pragma: no cover - compiled only
    """The model released at step t from the iterate ``w`` (a new array when the learner
    projects releases: it projects it in place; default: a copy of ``w``)."""
    raise NotImplementedError


def hook_admit(settings, slots, olds, ids, n_after):  # pragma: no cover - compiled only
    """Step t's record was written to ``slots`` (which held arrival ids ``olds``); ``ids`` are
    the buffer's arrival ids after the write, ``n_after`` its size (default: nothing)."""
    raise NotImplementedError


_NO_NOISE = np.zeros(0)


def _start(settings):  # pragma: no cover - compiled only
    return None


def _never(settings, t):  # pragma: no cover - compiled only
    return False


def _untracked(settings, t, eta, n, ids):  # pragma: no cover - compiled only
    return 0.0


def _no_noise(settings, t):  # pragma: no cover - compiled only
    return _NO_NOISE


def _iterate(settings, t, w, sensitivity):  # pragma: no cover - compiled only
    return w.copy()


def _nothing(settings, slots, olds, ids, n_after):  # pragma: no cover - compiled only
    return None


_HOOKS: dict[str, tuple[Callable, Callable]] = {
    "begin": (hook_begin, _start),
    "releases_at": (hook_releases_at, _never),
    "observe": (hook_observe, _untracked),
    "gradient_noise": (hook_gradient_noise, _no_noise),
    "release": (hook_release, _iterate),
    "admit": (hook_admit, _nothing),
}


def compiled_hooks(settings: type, **hooks: Callable) -> None:
    """Register the compiled hooks of the settings record type ``settings``.

    Each hook is a plain function written for numba's nopython mode, taking the record first
    (``begin``, ``releases_at``, ``observe``, ``gradient_noise``, ``release``, ``admit``: the
    signatures of :func:`hook_begin` … :func:`hook_admit`); a hook left out keeps its default.
    Without numba nothing is registered (the learners then take the reference step anyway).

    Examples
    --------
    >>> from typing import NamedTuple
    >>> class EveryStep(NamedTuple):
    ...     scale: float
    >>> compiled_hooks(EveryStep, releases_at=lambda settings, t: True)

    """
    unknown = set(hooks) - set(_HOOKS)
    if unknown:
        raise TypeError(f"unknown compiled hooks {sorted(unknown)}; known: {sorted(_HOOKS)}")
    if not (isinstance(settings, type) and issubclass(settings, tuple)):
        raise TypeError(f"a settings record is a NamedTuple type, not {settings!r}")
    if not NUMBA_INSTALLED:
        return
    for name, (stub, default) in _HOOKS.items():
        # The hook's own function is the body numba compiles for this record type, inlined
        # where the compiled step calls it (a call would cost a tenth of a step); not strict:
        # its parameters may be named otherwise than the stub's.
        typer = _typer(settings, hooks.get(name, default))
        numba.extending.overload(stub, inline="always", strict=False)(typer)


def _typer(settings: type, impl: Callable) -> Callable:
    """numba's typing of a hook: ``impl`` for a record of type ``settings``, else not ours."""
    from numba.core import types

    def typer(record, *args):
        if isinstance(record, types.BaseNamedTuple) and record.instance_class is settings:
            return impl
        return None

    return typer


# -- the non-private baseline ------------------------------------------------------------------
class _Unperturbed(NamedTuple):
    """The settings record of :class:`Unperturbed`: nothing is released, nothing tracked."""

    publishes: bool = False


compiled_hooks(_Unperturbed)


class _UnperturbedCompiled(CompiledMechanism):
    def settings(self) -> _Unperturbed:
        return _Unperturbed()

    def steps(self, t0: int, m: int) -> int:
        return m

    def one(self, t0: int) -> bool:
        return True


class Unperturbed(Mechanism):
    """No noise and no release: the non-private baseline (PairwiseGIGA) serves its iterate."""

    name = "unperturbed"
    publishes = False
    private = False

    def releases_at(self, t: int) -> bool:
        return False

    def release(self, t: int, w: np.ndarray) -> None:  # pragma: no cover - never asked
        return None

    def compiled(
        self, buffer: Buffer, step_size: Callable[[int], float], rows: int
    ) -> CompiledMechanism:
        return _UnperturbedCompiled()

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
