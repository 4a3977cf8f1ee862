"""River compositions with a private learner: which are refused, which are warned about.

A private learner's guarantee covers the records it is given. In ``StandardScaler() | learner``
each record reaches the learner scaled by the mean and variance of *every earlier record* — a
non-private function of the stream — so one record changes how all later records look to the
learner, and the sensitivity the noise is calibrated to no longer bounds its influence.
:func:`check_pipeline` walks a river pipeline's steps and names each step before a private
learner that learns from the stream outside its budget (``docs/privacy.md``, *Private
preprocessing*). A metric learner followed by one of river's ``neighbors`` estimators would
predict at about chance: :func:`check_pipeline` refuses that composition with
:class:`UnsupportedComposition`, naming the class to use (``docs/algorithms.md``, *kNN on a
learned metric*). It also refuses any step that learns from the records before a *unit-level*
learner (``unit_key``): such a step's own guarantee, if it has one, is per event, so the
pipeline's per-unit claim would be false (:func:`check_unit_level`; ``docs/privacy.md``,
*Private preprocessing*).

Steps say what they are with river's tags (``_more_tags``): :data:`PRIVATE_LEARNER` for a step
whose guarantee covers its input, :data:`OWN_LEDGER` for a private step that charges a ledger of
its own, :data:`LEARNED_METRIC` for a learner whose transform is its learned metric. A step is
*stateful* when its class overrides river's no-op ``learn_one``/``learn_many``; stateless river
transformers (``FuncTransformer``, selectors, …) are fine.

When checks run. River composes with ``|`` and asks an estimator to compose only when it is the
left operand (or the right one of a function, a list or a dict): the online learners check each
pipeline they compose that way (``learner | KNNClassifier()`` is refused at once). A pipeline
river composes around a learner without asking it (``StandardScaler() | learner``) is checked by
calling :func:`check_pipeline` on it.
"""

from __future__ import annotations

import warnings

from river import base, compose

__all__ = [
    "LEARNED_METRIC",
    "NonPrivatePreprocessingWarning",
    "OWN_LEDGER",
    "PRIVATE_LEARNER",
    "UnsupportedComposition",
    "check_pipeline",
    "check_unit_level",
    "checked",
    "stateful",
]

#: River tag of a step whose privacy guarantee covers the records it is given.
PRIVATE_LEARNER = "private learner"
#: River tag of a private step that charges a ledger of its own (a stand-alone private scaler).
OWN_LEDGER = "own ledger"
#: River tag of a learner whose ``transform_one`` applies its learned (released) metric.
LEARNED_METRIC = "learned metric"


class NonPrivatePreprocessingWarning(UserWarning):
    """A private learner follows a step that learns from the stream outside its budget."""


class UnsupportedComposition(TypeError):
    """A river composition that would run but silently measure nothing, or claim a guarantee
    it does not have (see the message)."""


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


def _tags(step) -> set[str]:
    return step._tags if isinstance(step, base.Estimator) else set()


def _refuse_knn_after(steps: list) -> None:
    for i, step in enumerate(steps):
        if LEARNED_METRIC not in _tags(step):
            continue
        knn = next(
            (s for s in steps[i + 1 :] if type(s).__module__.startswith("river.neighbors")), None
        )
        if knn is not None:
            name = type(step).__name__
            raise UnsupportedComposition(
                f"{name} | {type(knn).__name__}: the kNN would compare queries under the current "
                "release with neighbours stored untransformed (river's Pipeline does not apply a "
                "supervised transformer while learning) or under older releases (the metric "
                "changes with every release), and predict at about chance. Use "
                "stream_dp.online.PrivateMetricKNN(<metric learner>), which measures every "
                "distance with the current release (docs/algorithms.md, *kNN on a learned "
                "metric*)"
            )


def _unit(step):
    """The privacy unit of a unit-level learner step (None: event-level, or not a learner)."""
    return getattr(step, "privacy_unit", None) if PRIVATE_LEARNER in _tags(step) else None


def refuse_before_unit_level(step, learner) -> None:
    """Raise :class:`UnsupportedComposition`: ``step`` learns from the records that reach the
    unit-level ``learner`` after it, and the pipeline's per-unit guarantee would be false.

    A step that learns from the records is calibrated, if at all, to one record (a
    ``PrivateScaler``'s releases: replace-one), while the learner's noise covers up to k
    records of one unit; one unit's k records move the step's releases k times as far as the
    step's charge allows, and every later record reaches the learner through them. Nothing
    adds up to a guarantee per unit, so the composition is refused, not warned about.
    """
    unit = learner.privacy_unit
    name, learner_name = type(step).__name__, type(learner).__name__
    raise UnsupportedComposition(
        f"{name} before {learner_name} (unit-level: unit_key={unit.key!r}, "
        f"k={unit.max_events}): {name} learns from every record and its privacy (if any) is "
        f"per event, while {learner_name}'s guarantee is per unit of up to {unit.max_events} "
        "events, so the composition would claim a per-unit guarantee that does not hold. Scale "
        f"with public statistics (ScaledLearner(PublicScaler(...), {learner_name}(...))) or "
        "drop unit_key (event-level)"
    )


def check_unit_level(pipeline) -> None:
    """Refuse a river pipeline in which a step that learns from the records precedes a
    unit-level learner (:func:`refuse_before_unit_level`); any other pipeline passes.

    Examples
    --------
    >>> from river import preprocessing
    >>> from stream_dp.online import OnPairStrC
    >>> learner = OnPairStrC(task="auc", epsilon=1.0, horizon=1000, features=["a"],
    ...                      unit_key="person")
    >>> try:
    ...     check_unit_level(preprocessing.StandardScaler() | learner)
    ... except UnsupportedComposition as refused:
    ...     print(str(refused)[:58])
    StandardScaler before OnPairStrCAUC (unit-level: unit_key=

    """
    if not isinstance(pipeline, compose.Pipeline):
        return
    steps = list(pipeline.steps.values())
    for i, step in enumerate(steps):
        if isinstance(step, compose.Pipeline):
            check_unit_level(step)
        elif _unit(step) is not None:
            for prev in steps[:i]:
                tags = _tags(prev)
                if OWN_LEDGER in tags or PRIVATE_LEARNER in tags or stateful(prev):
                    refuse_before_unit_level(prev, step)


def check_pipeline(pipeline, warn: bool = True) -> list[str]:
    """The problems of a river pipeline that contains a private learner.

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

    Raises
    ------
    UnsupportedComposition
        A metric learner is followed by one of river's ``neighbors`` estimators, or a step that
        learns from the records precedes a unit-level learner (:func:`check_unit_level`).

    Examples
    --------
    >>> from river import preprocessing
    >>> from stream_dp.online import OnPairStrC
    >>> from stream_dp.preprocessing import PublicScaler
    >>> learner = OnPairStrC(task="auc", epsilon=1.0, horizon=1000, features=["a"])
    >>> check_pipeline(preprocessing.StandardScaler() | learner, warn=False)[0][:60]
    'StandardScaler learns from the stream before OnPairStrCAUC: '
    >>> check_pipeline(PublicScaler(bounds={"a": (0, 1)}) | learner, warn=False)
    []

    """
    if not isinstance(pipeline, compose.Pipeline):
        return []
    steps = list(pipeline.steps.values())
    _refuse_knn_after(steps)
    check_unit_level(pipeline)
    problems: list[str] = []
    for i, step in enumerate(steps):
        if PRIVATE_LEARNER in _tags(step):
            learner = type(step).__name__
            for prev in steps[:i]:
                name, tags = type(prev).__name__, _tags(prev)
                if OWN_LEDGER in tags or PRIVATE_LEARNER in tags:
                    fix = (
                        ". Use ScaledLearner(scaler, learner) for one budget and one ledger"
                        if OWN_LEDGER in tags
                        else ""
                    )
                    problems.append(
                        f"{name} before {learner} charges its own ledger, not the learner's: "
                        f"the guarantee is the composition of both (add their ε), and "
                        f"{learner}.accountant shows only its own{fix}"
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
    if warn:
        for p in problems:
            warnings.warn(p, NonPrivatePreprocessingWarning, stacklevel=2)
    return problems


def checked(pipeline: compose.Pipeline) -> compose.Pipeline:
    """``pipeline`` after :func:`check_pipeline` (warnings point at the composing line)."""
    for p in check_pipeline(pipeline, warn=False):
        warnings.warn(p, NonPrivatePreprocessingWarning, stacklevel=3)
    return pipeline
