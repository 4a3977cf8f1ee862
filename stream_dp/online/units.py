"""The privacy unit of an online learner: which field names it, and the bound on its events.

Without ``unit_key`` a learner is *event-level*: neighbouring streams differ in one event, as
everywhere in ``docs/privacy.md``. With ``unit_key`` it is *unit-level*: every record names its
unit (a person, account or device) in the field ``unit_key`` of ``x`` — read, never used as a
feature — and a :class:`~stream_dp.privacy.contribution.ContributionBound` admits at most
``max_events_per_unit`` (k) events of a unit, at least ``min_separation`` (b) steps apart. A
dropped event takes no step and touches no buffer, model or noise index; it is counted by reason
and never learned from. Neighbouring streams then differ in up to k admitted events of one unit,
step indices preserved, and the mechanism is calibrated to that relation's sensitivity
(:mod:`stream_dp.privacy.unit_sensitivity`). ``docs/units.md`` has the guarantee and how to
choose k and b.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from stream_dp.privacy.contribution import ContributionBound
from stream_dp.privacy.conversions import epsilon_from_rho
from stream_dp.privacy.secrets import derive_key

__all__ = ["EVENT_LEVEL", "PrivacyUnit", "check_unit_params", "event_epsilon", "unit_relation"]

#: What an event-level learner's guarantee covers.
EVENT_LEVEL = "event-level: neighbouring streams differ in one event (no unit_key)"


def check_unit_params(unit_key, max_events, min_separation, features, metrics_share=0.0) -> None:
    """Refuse unit parameters that could not bound a unit (a ValueError naming the parameter)."""
    if unit_key is None:
        if max_events != 1 or min_separation is not None:
            raise ValueError(
                "max_events_per_unit and min_separation bound the events of a privacy unit: "
                "give unit_key (the field of x naming the unit) too"
            )
        return
    if not isinstance(unit_key, str) or not unit_key:
        raise ValueError(f"unit_key must be a non-empty field name, got {unit_key!r}")
    if metrics_share:
        raise ValueError(
            "the private operator metrics are calibrated to one event: metrics_share must be 0 "
            "for a unit-level learner"
        )
    if isinstance(features, list | tuple) and unit_key in features:
        raise ValueError(
            f"unit_key {unit_key!r} is a declared feature: the unit is read, never learned from"
        )
    for name, v in (("max_events_per_unit", max_events), ("min_separation", min_separation)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")


def unit_relation(key: str, max_events: int, min_separation: int) -> dict:
    """The neighbouring relation of a unit-level learner, as it is published.

    Examples
    --------
    >>> unit_relation("person", 4, 129)["relation"]
    'up to 4 admitted events of one unit replaced, ≥ 129 steps apart, step indices preserved'

    """
    return {
        "level": "unit",
        "unit_key": key,
        "max_events_per_unit": int(max_events),
        "min_separation": int(min_separation),
        "relation": (
            f"up to {max_events} admitted events of one unit replaced, ≥ {min_separation} steps "
            "apart, step indices preserved"
        ),
    }


class PrivacyUnit:
    """A learner's unit field and contribution bound.

    Parameters
    ----------
    key
        The field of ``x`` that names the unit.
    max_events, min_separation
        k and b of the bound.
    secret, model_id
        The learner's noise secret and model id: the bound's hash key is derived from them for
        the purpose ``"units"`` (:data:`~stream_dp.privacy.secrets.KEY_PURPOSES`), so a
        checkpoint of the learner restores its units.

    Examples
    --------
    >>> unit = PrivacyUnit("person", 2, 1, secret=7, model_id="m")
    >>> unit.split({"person": "ann", "a": 1.0})
    ('ann', {'a': 1.0})
    >>> unit.of({"person": "ann", "a": 1.0})
    'ann'
    >>> [unit.admit("ann", t) for t in (1, 2)], unit.admit("ann", 3), unit.dropped
    ([True, True], False, {'max_events': 1, 'min_separation': 0, 'max_units': 0})

    """

    def __init__(
        self, key: str, max_events: int, min_separation: int, secret: int, model_id: str
    ) -> None:
        self.key = key
        derived = derive_key(secret, "units", model_id)
        self.bound = ContributionBound(
            max_events,
            min_separation,
            secret=int(derived[0]) | (int(derived[1]) << 64),
            label=str(model_id),
        )
        self.admit = self.bound.admit

    @property
    def max_events(self) -> int:
        return self.bound.max_events

    @property
    def min_separation(self) -> int:
        return self.bound.min_separation

    @property
    def dropped(self) -> dict[str, int]:
        """Dropped events by reason (:data:`~stream_dp.privacy.contribution.DROP_REASONS`)."""
        return self.bound.dropped

    def of(self, x) -> object:
        """The unit of record ``x`` (None when missing, which :meth:`admit` refuses as an
        invalid record). ``x`` itself goes on to the learner's schema, which ignores this
        field: no copy per record."""
        if type(x) is dict:
            return x.get(self.key)
        return self.split(x)[0]

    def split(self, x) -> tuple[object, dict]:
        """The unit of record ``x`` and ``x`` without its unit field (a missing unit is None,
        which :meth:`admit` refuses as an invalid record)."""
        if not isinstance(x, Mapping):
            raise ValueError(
                f"a unit-level learner reads the unit from the field {self.key!r} of a dict "
                f"record, got {type(x).__name__}"
            )
        return x.get(self.key), {k: v for k, v in x.items() if k != self.key}

    def split_batch(self, X, units) -> tuple[list, object]:
        """The units of a batch's rows (``units``, or the unit column of a DataFrame) and the
        batch without the unit column."""
        columns = getattr(X, "columns", None)
        has_column = columns is not None and self.key in columns
        if units is None:
            if not has_column:
                raise ValueError(
                    f"learn_many of a unit-level learner needs units=[...] (one per row) or a "
                    f"DataFrame with the unit column {self.key!r}"
                )
            units = X[self.key].tolist()
        units = list(units)
        if len(units) != len(X):
            raise ValueError(f"X has {len(X)} rows but {len(units)} units")
        return units, (X.drop(columns=[self.key]) if has_column else X)

    def relation(self) -> dict:
        """The neighbouring relation, as status files and release messages state it."""
        return unit_relation(self.key, self.max_events, self.min_separation)

    def describe(self) -> str:
        return (
            f"unit-level: the unit is field {self.key!r}; neighbouring streams differ in up to "
            f"k={self.max_events} events of one unit, ≥ b={self.min_separation} steps apart "
            f"(dropped so far: {self.dropped})"
        )

    def state_dict(self) -> dict:
        return {"key": self.key, "bound": self.bound.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state["key"] != self.key:
            raise ValueError(f"checkpoint reads units from {state['key']!r}, not {self.key!r}")
        bound = state["bound"]
        if bound["last_step"] == 0 and len(bound["slots"]) == 0:
            # Nothing admitted yet: an empty table is the same under any key (a learner whose
            # secret is replaced before its first record keeps the bound of its new secret).
            if bound["max_events"] != self.max_events or bound["min_separation"] != (
                self.min_separation
            ):
                raise ValueError("the checkpoint bounds units by another (k, b)")
            return
        self.bound.load_state_dict(bound)


def event_epsilon(rho_event: float, delta: float, conversion: str) -> float:
    """The ε of one event at the learner's noise: ``rho_event`` converted at δ (0 → 0).

    Examples
    --------
    >>> event_epsilon(0.0, 1e-5, "tight")
    0.0

    """
    if not rho_event > 0 or not math.isfinite(rho_event):
        return 0.0
    return float(epsilon_from_rho(rho_event, delta, conversion))
