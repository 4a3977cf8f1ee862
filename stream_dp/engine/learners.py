"""The learners the engine runs, and their ``[model]`` sections, generated from the learners.

One parameter list: a learner's ``__init__`` is the only place its parameters, their types and
their defaults are written. The engine's ``[model]`` section for ``algorithm = "X"`` is a pydantic
model generated from ``X.__init__`` — the same names, types and defaults — plus only what the
engine itself requires of a model it publishes:

- a private run: ``epsilon`` is a finite number > 0 (a learner may accept ``epsilon=None`` for
  noise-free experiments; the engine never publishes those);
- a declared schema (``features``, a list of unique, non-empty names);
- a model id usable as a Kafka key, a transactional id and a file name;
- a fixed ``seed`` only with ``reproducible = true``;
- ``delta`` at most 1/n for a horizon of n records, :data:`MAX_DELTA_UNBOUNDED` without one;
- values of their declared types only: ``epsilon = "4.0"`` is refused, not converted;
- bounded memory: where a learner's default buffer keeps every record (``"all"``, the papers'
  setting), the engine's default is 256 records.

Range and choice checks (``task``, ``buffer``, ``step_size`` …) stay in the learner's constructor,
which refuses with a message naming the parameter; :func:`stream_dp.engine.config.load_config`
constructs the learner once so those refusals are configuration errors too. Parameters that take
objects (a noise source) are not configurable from a file, and ``keep_history`` (every release
kept in memory) has no place in a process that runs for months.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

__all__ = [
    "DEFAULT_ALGORITHM",
    "ENGINE_ALGORITHMS",
    "MAX_DELTA_UNBOUNDED",
    "MAX_METRIC_WORK",
    "LearnerSection",
    "learner_class",
    "model_section",
]

ENGINE_ALGORITHMS = ("OnPairStrC", "OnPairC", "OnPairMF")
"""The private online learners the engine can run (``[model] algorithm``)."""

DEFAULT_ALGORITHM = "OnPairStrC"
"""The learner of a ``[model]`` section that names none."""

MAX_DELTA_UNBOUNDED = 1e-5
"""The largest δ the engine accepts for a stream without a ``horizon``: δ is the probability
that the guarantee fails outright and must stay below 1/n for n records (``docs/privacy.md``,
"ε and δ"); with n unknown, a stream is taken to be at least 10⁵ records long. With a horizon
n the bound is 1/n."""

_NOT_CONFIGURABLE = frozenset({"keep_history"})
_PLAIN = (str, int, float, bool, type(None))


def learner_class(algorithm: str) -> type:
    """The learner class named ``algorithm`` (one of :data:`ENGINE_ALGORITHMS`)."""
    if algorithm not in ENGINE_ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ENGINE_ALGORITHMS}")
    from stream_dp import online

    return getattr(online, algorithm)


MAX_METRIC_WORK = 2**27
"""The most work per record the engine accepts of a metric model, in units of ``d²·(d + B)``
for d features and a buffer (OnPairMF: window) of B records: one d × d eigendecomposition for
the projection onto the PSD cone (~d³) and the gradient of B pairs (~B·d²). At the bound
(d = 240 with B = 2,090, d = 400 with B = 439, d = 511 with B = 1) a record costs about 0.1 s
(OnPairStrC) to 0.25 s (OnPairMF) of CPU with one BLAS thread on a 2-core VM
(``docs/performance.md``, "Metric models in the engine")."""


def metric_work(d: int, buffer: int) -> int:
    """The work per record of a metric model, as :data:`MAX_METRIC_WORK` counts it.

    Examples
    --------
    >>> metric_work(240, 256) <= MAX_METRIC_WORK < metric_work(512, 256)
    True
    """
    return d * d * (d + buffer)


class LearnerSection(BaseModel):
    """What every ``[model]`` section shares: the engine's own requirements of a model."""

    # strict: a value of the wrong type is refused, never converted (``epsilon = "4.0"``).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @field_validator("features", check_fields=False)
    @classmethod
    def _check_features(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("features must name at least one feature")
        if len(set(value)) != len(value):
            dup = sorted({f for f in value if value.count(f) > 1})
            raise ValueError(f"features must be unique; repeated: {dup[:5]}")
        for name in value:
            if not name:
                raise ValueError("feature names must be non-empty")
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"feature name {name!r} is not valid Unicode text") from None
        return value

    @model_validator(mode="after")
    def _delta_below_one_over_n(self) -> LearnerSection:
        delta, horizon = getattr(self, "delta", None), getattr(self, "horizon", None)
        if delta is None or not delta > 0:
            return self  # the learner refuses it, naming the range
        if horizon is not None and horizon >= 1:
            if delta > 1.0 / horizon:
                raise ValueError(
                    f"delta = {delta:g} is above 1/horizon = {1.0 / horizon:.3g}: the guarantee "
                    f"could fail outright for one of the {horizon} records; take delta << 1/n"
                )
        elif delta > MAX_DELTA_UNBOUNDED:
            raise ValueError(
                f"delta = {delta:g} is above {MAX_DELTA_UNBOUNDED:g}, the engine's bound for a "
                "stream without a horizon (taken to be at least 1e5 records): take delta << 1/n, "
                "or set horizon = n"
            )
        return self

    @model_validator(mode="after")
    def _seed_needs_reproducible(self) -> LearnerSection:
        if getattr(self, "seed", None) is not None and not getattr(self, "reproducible", False):
            raise ValueError(
                "a fixed seed makes the noise guessable and the run NOT private; remove seed "
                "(the secret is drawn from the OS), or set reproducible = true to declare the "
                "run non-private"
            )
        return self

    def learner_class(self) -> type:
        """The learner class this section describes."""
        return learner_class(self.algorithm)

    def learner_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the learner this section describes."""
        kw = self.model_dump(exclude={"algorithm"})
        if kw.get("features") is not None:
            kw["features"] = tuple(kw["features"])
        return kw

    def build(self):
        """A new learner with these parameters (a fresh secret unless reproducible)."""
        return self.learner_class()(**self.learner_kwargs())

    def variant_name(self) -> str:
        """The class name of the learner for this task (as written in its release messages)."""
        return self.learner_class()._variants[self.task].__name__


def _engine_field(name: str, default: Any) -> tuple[Any, Any] | None:
    """The engine's own type and constraints for ``name``, or None to derive them."""
    if name == "epsilon":
        return float, Field(
            default if default is not None else 1.0,
            gt=0,
            allow_inf_nan=False,
            description="The run's total ε (with delta): the engine publishes private models only.",
        )
    if name == "features":
        return list[str] | None, Field(
            None,
            description="The schema: feature names in model order. Required by the engine (the "
            "privacy analysis treats the schema as public, so it cannot come from the data). "
            "Unknown features in a record are ignored and counted, missing ones are 0.",
        )
    if name == "buffer" and default == "all":
        return str | int, Field(
            256,
            description="Pairing buffer. The engine runs for months, so its default is bounded "
            "(256 past records, FIFO); 'all' keeps every record (memory grows without bound).",
        )
    if name == "model_id":
        return str, Field(default, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    if name == "seed":
        return int | None, Field(
            None,
            ge=0,
            description="Noise secret. Leave unset: drawn from the OS (128 bits) on the first "
            "start and kept in the checkpoint. A fixed seed makes every release reproducible, "
            "hence NOT private; it needs reproducible = true.",
        )
    if name == "reproducible":
        return bool, Field(
            False,
            description="Declare the run non-private (a fixed, guessable seed): every release "
            "message then says private = false.",
        )
    return None


def _plain(hint: Any) -> Any:
    """``hint`` restricted to what a TOML file can hold, or None if nothing is left."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    kept = tuple(a for a in args if a in _PLAIN)
    if not kept or kept == (type(None),):
        return None
    return functools.reduce(lambda a, b: a | b, kept) if len(kept) > 1 else kept[0]


@functools.cache
def model_section(algorithm: str) -> type[LearnerSection]:
    """The pydantic model of ``[model]`` for ``algorithm``, generated from its ``__init__``.

    Examples
    --------
    >>> section = model_section("OnPairMF")
    >>> m = section(features=["a", "b"], epsilon=2.0, horizon=1000)
    >>> m.noise, m.horizon, m.model_id
    ('blt', 1000, 'onpairmf')
    >>> sorted(set(model_section("OnPairStrC").model_fields) - set(section.model_fields))[:3]
    ['alpha', 'anytime_p', 'predict_with']
    """
    cls = learner_class(algorithm)
    hints = typing.get_type_hints(cls.__init__)
    fields: dict[str, Any] = {"algorithm": (Literal[algorithm], algorithm)}
    for name, param in inspect.signature(cls).parameters.items():
        if name in _NOT_CONFIGURABLE or param.kind is not param.POSITIONAL_OR_KEYWORD:
            continue
        spec = _engine_field(name, param.default)
        if spec is None:
            hint = _plain(hints.get(name, Any))
            if hint is None:
                continue  # takes an object (a collaborator): not for a config file
            spec = (hint, param.default)
        fields[name] = spec
    return create_model(f"{algorithm}Section", __base__=LearnerSection, **fields)


def model_sections() -> Any:
    """The type of ``[model]``: one section per algorithm, told apart by ``algorithm``."""
    sections = tuple(model_section(a) for a in ENGINE_ALGORITHMS)
    return typing.Annotated[Union[sections], Field(discriminator="algorithm")]  # noqa: UP007
