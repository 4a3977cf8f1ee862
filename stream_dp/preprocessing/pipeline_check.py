"""Warn when a river pipeline feeds a private learner through a non-private stateful step.

A private learner's guarantee covers the records it is given. In ``StandardScaler() | learner``
each record reaches the learner scaled by the mean and variance of *every earlier record* — a
non-private function of the stream — so one record changes how all later records look to the
learner, and the sensitivity the noise is calibrated to no longer bounds its influence. The
learner cannot see its pipeline, but the pipeline's steps are inspectable: :func:`check_pipeline`
walks them, and the learners call it once, on their first record, when a river ``Pipeline``
is the caller (``docs/privacy.md``, *Private preprocessing*).

A step is *stateful* when its class overrides river's no-op ``learn_one``/``learn_many``;
:class:`~stream_dp.preprocessing.PublicScaler` (learns nothing) and stateless river
transformers (``FuncTransformer``, selectors, …) are fine.
:class:`~stream_dp.preprocessing.PrivateScaler` is private, but in a pipeline it charges its own
ledger, apart from the learner's: that is reported too, with the safe form
(:class:`~stream_dp.preprocessing.ScaledLearner`).
"""

from __future__ import annotations

import warnings

from river import base, compose

__all__ = [
    "NonPrivatePreprocessingWarning",
    "check_calling_pipeline",
    "check_pipeline",
    "stateful",
]

#: How many callers up a learner looks for a river pipeline (the pipeline itself, or a
#: ScaledLearner or river wrapper inside it).
_CALLER_DEPTH = 4


class NonPrivatePreprocessingWarning(UserWarning):
    """A private learner follows a step that learns from the stream outside its budget."""


# river's base classes, whose learn_one/learn_many do nothing.
_RIVER_BASES = (
    base.Transformer,
    base.SupervisedTransformer,
    base.MiniBatchTransformer,
    base.MiniBatchSupervisedTransformer,
)


def stateful(step) -> bool:
    """Whether a river transformer learns from the records it sees."""
    cls = type(step)
    if isinstance(step, compose.TransformerUnion):
        return any(stateful(s) for s in step.transformers.values())
    if isinstance(step, compose.Pipeline):
        return any(stateful(s) for s in step.steps.values())
    for name in ("learn_one", "learn_many"):
        own = getattr(cls, name, None)
        if own is None:
            continue
        noop = [getattr(b, name, None) for b in _RIVER_BASES]
        if own not in noop:
            return True
    return False


def _is_private_learner(step) -> bool:
    from stream_dp.online.budgeted import BudgetedLearner
    from stream_dp.preprocessing.scaled_learner import ScaledLearner

    return isinstance(step, BudgetedLearner | ScaledLearner)


def check_pipeline(pipeline, warn: bool = True) -> list[str]:
    """The problems of a river pipeline ending in (or containing) a private learner.

    Parameters
    ----------
    pipeline
        A river ``compose.Pipeline`` (anything else has no steps to check: no problems).
    warn
        Issue each problem as a :class:`NonPrivatePreprocessingWarning`.

    Returns
    -------
    list of str
        One sentence per problem (empty: the pipeline keeps the learners' guarantees).

    Examples
    --------
    >>> from river import preprocessing
    >>> from stream_dp.online import OnPairStrC
    >>> from stream_dp.preprocessing import PublicScaler, check_pipeline
    >>> learner = OnPairStrC(task="auc", epsilon=1.0, horizon=1000, features=["a"])
    >>> check_pipeline(preprocessing.StandardScaler() | learner, warn=False)[0][:60]
    'StandardScaler learns from the stream before OnPairStrCAUC: '
    >>> check_pipeline(PublicScaler(bounds={"a": (0, 1)}) | learner, warn=False)
    []

    """
    if not isinstance(pipeline, compose.Pipeline):
        return []
    from stream_dp.preprocessing.private_scaler import PrivateScaler

    problems: list[str] = []
    before: list = []
    for step in pipeline.steps.values():
        if _is_private_learner(step):
            for prev in before:
                name, learner = type(prev).__name__, type(step).__name__
                if isinstance(prev, PrivateScaler):
                    problems.append(
                        f"{name} before {learner} charges its own ledger, not the learner's: "
                        f"the guarantee is the composition of both (add their ε), and "
                        f"{learner}.accountant shows only its own. Use ScaledLearner(scaler, "
                        "learner) for one budget and one ledger"
                    )
                elif stateful(prev):
                    problems.append(
                        f"{name} learns from the stream before {learner}: each record reaches "
                        f"the learner scaled by statistics of all earlier records, which "
                        f"{learner}'s privacy guarantee does not cover. Use "
                        "stream_dp.preprocessing.PublicScaler (public statistics) or "
                        "ScaledLearner(PrivateScaler(...), learner)"
                    )
        elif isinstance(step, compose.Pipeline):
            problems += check_pipeline(step, warn=False)
        before.append(step)
    if warn:
        for p in problems:
            warnings.warn(p, NonPrivatePreprocessingWarning, stacklevel=2)
    return problems


def check_calling_pipeline(frame) -> list[str]:
    """:func:`check_pipeline` on the river ``Pipeline`` among the callers from ``frame`` up (a
    few frames), if any; what the learners run once, on their first record.

    The learner cannot see the pipeline it sits in, but the pipeline is the ``self`` of its
    caller's frame (``Pipeline.learn_one`` → ``learner.learn_one``): reading it costs one
    frame walk per learner and changes nothing.
    """
    for _ in range(_CALLER_DEPTH):
        if frame is None:
            return []
        owner = frame.f_locals.get("self")
        if isinstance(owner, compose.Pipeline):
            problems = check_pipeline(owner, warn=False)
            for p in problems:
                warnings.warn(p, NonPrivatePreprocessingWarning, stacklevel=_CALLER_DEPTH + 1)
            return problems
        frame = frame.f_back
    return []
