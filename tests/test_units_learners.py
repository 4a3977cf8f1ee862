"""Unit-level learners: dropped events change no release bit; k = 1, b = 1 is event-level.

Issue criteria 1 (a unit's (k+1)-th event, and an event fewer than b steps after its unit's last
admitted one, change no release bit; ``learn_one`` and ``learn_many``; OnPairMF and OnPairStrC)
and 3 (with k = 1 and b = 1, on a stream where every event is its own unit, a unit-level learner
equals today's event-level learner bit for bit: releases and ledger).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from stream_dp import _jit
from stream_dp.online import OnPairC, OnPairMF, OnPairStrC
from stream_dp.records import InvalidRecord

D = 4
NAMES = [f"f{i}" for i in range(D)]
N = 300


def _stream(n: int = N, units: int = 40, seed: int = 0):
    """A skewed keyed stream: unit u has about 1/u of the events, interleaved."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)) / 2.5
    y = (X[:, 0] + 0.3 * rng.normal(size=n)) > 0
    weights = 1.0 / np.arange(1, units + 1)
    keys = rng.choice(units, size=n, p=weights / weights.sum())
    return X, y, [f"u{k}" for k in keys]


def _make(cls, unit: bool, k: int = 1, b: int | None = None, **kw):
    params = dict(task="auc", epsilon=4.0, horizon=N, features=NAMES, seed=11,
                  reproducible=True)  # fmt: skip
    if cls is not OnPairMF:
        params.update(buffer="fifo:8", alpha=1.0, release_every=1, warmup=5)
    if unit:
        params.update(unit_key="uid", max_events_per_unit=k, min_separation=b)
    params.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**params)


def _record(x, uid=None) -> dict:
    out = dict(zip(NAMES, map(float, x), strict=True))
    if uid is not None:
        out["uid"] = uid
    return out


def _ledger(model) -> dict:
    return model.accountant.storage.columns()


def _assert_same_ledger(a, b) -> None:
    ca, cb = _ledger(a), _ledger(b)
    assert ca.keys() == cb.keys()
    for key in ca:
        np.testing.assert_array_equal(ca[key], cb[key], err_msg=key)


def _run_one(model, X, y, keys) -> list[tuple[int, bytes]]:
    """(release step, release bytes) after every record."""
    out = []
    for i in range(len(y)):
        model.learn_one(_record(X[i], None if keys is None else keys[i]), bool(y[i]))
        w = model.private_weights
        out.append((model.release_step, b"" if w is None else w.tobytes()))
    return out


def _final(model) -> tuple:
    w, s = model.private_weights, model.smoothed_weights
    return (model.step, model.release_step, w.tobytes(), None if s is None else s.tobytes())


LEARNERS = [OnPairMF, OnPairStrC, OnPairC]


# -- criterion 3: k = 1, b = 1, one event per unit is the event-level learner ----------------------
@pytest.mark.parametrize("cls", LEARNERS, ids=lambda c: c.__name__)
def test_one_event_per_unit_is_the_event_level_learner_learn_one(cls) -> None:
    X, y, _ = _stream()
    own = [f"e{i}" for i in range(N)]
    event, unit = _make(cls, False), _make(cls, True, k=1, b=1)
    assert _run_one(event, X, y, None) == _run_one(unit, X, y, own)
    _assert_same_ledger(event, unit)
    assert unit.units_dropped == {"max_events": 0, "min_separation": 0, "max_units": 0}
    assert unit.mf.sensitivity == event.mf.sensitivity if cls is OnPairMF else True


@pytest.mark.parametrize("cls", LEARNERS, ids=lambda c: c.__name__)
def test_one_event_per_unit_is_the_event_level_learner_learn_many(cls) -> None:
    X, y, _ = _stream()
    own = [f"e{i}" for i in range(N)]
    event, unit = _make(cls, False), _make(cls, True, k=1, b=1)
    for lo in range(0, N, 70):  # several batches, so runs cross batch boundaries
        event.learn_many(X[lo : lo + 70], y[lo : lo + 70])
        unit.learn_many(X[lo : lo + 70], y[lo : lo + 70], units=own[lo : lo + 70])
        assert _final(event) == _final(unit)
    _assert_same_ledger(event, unit)


# -- criterion 1: dropped events change no release bit -------------------------------------------
def _dropped_mask(cls, X, y, keys, k, b) -> np.ndarray:
    model = _make(cls, True, k=k, b=b)
    dropped = []
    for i in range(len(y)):
        t = model.step
        model.learn_one(_record(X[i], keys[i]), bool(y[i]))
        dropped.append(model.step == t)
    return np.array(dropped)


@pytest.mark.parametrize("cls", [OnPairMF, OnPairStrC], ids=lambda c: c.__name__)
@pytest.mark.parametrize("k, b", [(2, 3), (3, 1), (1, 5)])
def test_dropped_events_change_no_release_bit(cls, k, b) -> None:
    X, y, keys = _stream()
    drop = _dropped_mask(cls, X, y, keys, k, b)
    assert 0 < drop.sum() < len(drop)  # the stream exercises the bound
    # The dropped events' contents replaced by anything else: same releases at every record.
    rng = np.random.default_rng(5)
    X2, y2 = X.copy(), y.copy()
    X2[drop] = rng.normal(size=(int(drop.sum()), D))
    y2[drop] = ~y2[drop]
    a, b_ = _make(cls, True, k=k, b=b), _make(cls, True, k=k, b=b)
    assert _run_one(a, X, y, keys) == _run_one(b_, X2, y2, keys)
    _assert_same_ledger(a, b_)
    # ... and removed altogether: the same release at every step.
    c = _make(cls, True, k=k, b=b)
    kept = np.flatnonzero(~drop)
    got = _run_one(c, X[kept], y[kept], [keys[i] for i in kept])
    assert sorted(set(got)) == sorted(set(_run_one(_make(cls, True, k=k, b=b), X, y, keys)))
    assert c.units_dropped == {"max_events": 0, "min_separation": 0, "max_units": 0}
    _assert_same_ledger(a, c)
    reasons = a.units_dropped
    assert sum(reasons.values()) == drop.sum()
    assert reasons["max_events"] > 0
    assert (reasons["min_separation"] > 0) == (k > 1 and b > 1)  # k = 1: its count drops first


@pytest.mark.parametrize("cls", [OnPairMF, OnPairStrC], ids=lambda c: c.__name__)
def test_learn_many_drops_what_learn_one_drops(cls) -> None:
    X, y, keys = _stream()
    one, many = _make(cls, True, k=2, b=3), _make(cls, True, k=2, b=3)
    _run_one(one, X, y, keys)
    for lo in range(0, N, 64):
        many.learn_many(X[lo : lo + 64], y[lo : lo + 64], units=keys[lo : lo + 64])
    assert _final(one) == _final(many)
    assert one.units_dropped == many.units_dropped
    _assert_same_ledger(one, many)
    # Changing the dropped rows' contents in a batch changes nothing either.
    drop = _dropped_mask(cls, X, y, keys, 2, 3)
    X2 = X.copy()
    X2[drop] *= -3.0
    other = _make(cls, True, k=2, b=3)
    other.learn_many(X2, y, units=keys)
    assert _final(other) == _final(many)


@pytest.mark.parametrize("cls", [OnPairStrC, OnPairC], ids=lambda c: c.__name__)
def test_the_compiled_unit_level_release_is_the_reference_one(cls) -> None:
    """A unit-level output-perturbation learner runs compiled (a unit-level learner at a tenth
    of the event-level speed would be no product) and releases what the reference step does:
    σ from min(diam C, k·Δ_t), the ledger and both ρ's exactly, models to 1e-12."""
    X, y, keys = _stream()
    runs = {}
    for numba in (False, True):
        with _jit.use_numba(numba):
            one, many = _make(cls, True, k=3, b=2), _make(cls, True, k=3, b=2)
            _run_one(one, X, y, keys)
            for lo in range(0, N, 64):
                many.learn_many(X[lo : lo + 64], y[lo : lo + 64], units=keys[lo : lo + 64])
            compiled = _jit.numba_active()  # inside the switch: STREAM_DP_NUMBA=0 may override
        assert (one._fast is not None) == compiled
        runs[numba] = (one, many)
    ref = runs[False][0]
    assert ref.units_dropped["max_events"] > 0 and ref.n_releases > 50
    for model in (*runs[True], runs[False][1]):
        _assert_same_ledger(ref, model)
        assert model.guarantee() == ref.guarantee()
        assert model.step == ref.step and model.release_step == ref.release_step
        np.testing.assert_allclose(model.private_weights, ref.private_weights, rtol=0, atol=1e-12)


# -- the rest of the contract ---------------------------------------------------------------------
def test_event_level_says_so_and_unit_level_states_its_relation() -> None:
    event, unit = _make(OnPairMF, False), _make(OnPairMF, True, k=4, b=None)
    assert "event-level" in event.describe() and event.neighbouring()["level"] == "event"
    assert unit.min_separation_ == unit.window + 1
    rel = unit.neighbouring()
    assert (rel["unit_key"], rel["max_events_per_unit"], rel["min_separation"]) == (
        "uid",
        4,
        unit.window + 1,
    )
    assert "k=4" in unit.describe() and "event-level ε" in unit.describe()
    plan = unit.noise_plan()[0]
    assert plan["sensitivity"] > 2 * plan["event_sensitivity"]  # Δ_4 well above Δ_1
    assert unit.mf.unit.exact  # b > window: the certified Δ is attained
    X, y, keys = _stream()
    _run_one(unit, X, y, keys)
    g = unit.guarantee()
    assert g["level"] == "unit" and 0 < g["epsilon_event"] < g["epsilon"] <= 4.0 + 1e-9
    msg = unit.release_message()
    assert msg["privacy_unit"] == rel and msg["epsilon_event_spent"] == g["epsilon_event"]
    assert "privacy_unit" not in event.release_message()


def test_onpairstrc_release_noise_is_calibrated_to_k_events() -> None:
    event, unit = _make(OnPairStrC, False), _make(OnPairStrC, True, k=3, b=1)
    X, y, _ = _stream()
    own = [f"e{i}" for i in range(N)]
    _run_one(event, X, y, None)
    _run_one(unit, X, y, own)
    ce, cu = _ledger(event), _ledger(unit)
    n = min(len(ce["sensitivity"]), len(cu["sensitivity"]))
    diam = unit.constraint.diameter
    np.testing.assert_array_equal(
        cu["sensitivity"][:n], np.minimum(diam, 3 * ce["sensitivity"][:n])
    )


def test_invalid_unit_keys_are_refused_and_leave_no_trace() -> None:
    model = _make(OnPairMF, True, k=2, b=1)
    X, y, _ = _stream(10)
    model.learn_one(_record(X[0], "a"), True)
    before = model.state_dict()
    for bad in (None, 1.5, True, ["a"]):
        with pytest.raises(InvalidRecord):
            model.learn_one(_record(X[1], bad), True)
    with pytest.raises(InvalidRecord):
        model.learn_one(_record(X[1]), True)  # no unit field
    assert model.step == before["t"] and model.units_dropped == {
        "max_events": 0, "min_separation": 0, "max_units": 0,
    }  # fmt: skip
    # In a batch: the rows before the invalid one are learned, then it raises.
    with pytest.raises(InvalidRecord):
        model.learn_many(X[1:6], y[1:6], units=["b", "c", None, "d", "e"])
    assert model.step == 3


def test_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="unit_key"):
        _make(OnPairMF, False, max_events_per_unit=2)
    with pytest.raises(ValueError, match="declared feature"):
        _make(OnPairMF, True, k=2, unit_key="f0")
    with pytest.raises(ValueError, match="max_events_per_unit"):
        _make(OnPairMF, True, k=0)
    with pytest.raises(ValueError, match="metrics_share"):
        _make(OnPairStrC, True, k=2, metrics_share=0.1)
    with pytest.raises(ValueError, match="units="):
        _make(OnPairMF, True, k=2).learn_many(np.zeros((3, D)), [True, False, True])
    with pytest.raises(ValueError, match="unit-level"):
        _make(OnPairMF, False).learn_many(np.zeros((3, D)), [True, False, True], units="abc")


@pytest.mark.parametrize("cls", [OnPairMF, OnPairStrC], ids=lambda c: c.__name__)
def test_a_restored_checkpoint_continues_with_the_same_units(cls) -> None:
    X, y, keys = _stream()
    whole = _make(cls, True, k=2, b=3)
    full = _run_one(whole, X, y, keys)
    first = _make(cls, True, k=2, b=3)
    _run_one(first, X[:150], y[:150], keys[:150])
    state = first.state_dict()
    resumed = _make(cls, True, k=2, b=3)
    resumed.load_state_dict(state)
    assert _run_one(resumed, X[150:], y[150:], keys[150:]) == full[150:]
    assert resumed.predict_proba_one(_record(X[0], "zz")) == whole.predict_proba_one(_record(X[0]))
    assert resumed.units_dropped == whole.units_dropped
    with pytest.raises(ValueError, match="privacy unit"):
        _make(cls, False).load_state_dict(state)


def test_the_bound_follows_the_secret_and_refuses_another_ones_table() -> None:
    model = _make(OnPairMF, True, k=2, b=1)
    state = model.state_dict()
    state["secret"] = 12345  # the engine's derived secret, set before the first record
    model.load_state_dict(state)
    X, y, _ = _stream(5)
    model.learn_one(_record(X[0], "a"), True)
    state = model.state_dict()
    again = _make(OnPairMF, True, k=2, b=1)
    again.load_state_dict(state)
    assert again.privacy_unit.bound.events_of("a") == 1
    state["secret"] = 999  # its units would all look new: refused
    with pytest.raises(ValueError, match="secret"):
        _make(OnPairMF, True, k=2, b=1).load_state_dict(state)


def test_predictions_ignore_the_unit_field() -> None:
    model = _make(OnPairStrC, True, k=2, b=1)
    X, y, keys = _stream(40)
    _run_one(model, X, y, keys)
    with_unit = model.predict_proba_one(_record(X[0], "zz"))
    assert with_unit == model.predict_proba_one(_record(X[0]))
    assert model.unknown_features == 0


def test_the_unit_field_is_read_in_place_and_never_a_feature() -> None:
    """The learner reads the unit from ``x`` without copying it: the schema's plain-dict path
    takes the schema's keys plus the unit field, and anything else still counts as unknown."""
    from stream_dp.records import FeatureSchema

    schema = FeatureSchema(names=tuple(NAMES))
    schema.ignored = "uid"
    x = _record(np.arange(D) / 4.0)
    keyed = {**x, "uid": "ann"}
    assert (
        schema.to_clipped(keyed, 1.0, learning=True).tolist()
        == schema.to_clipped(x, 1.0, learning=True).tolist()
    )
    assert not schema.last_unknown
    assert schema.to_array({**x, "uid": "ann"}, learning=True).tolist() == list(x.values())
    schema.to_array({**x, "other": 1.0}, learning=True)
    assert schema.last_unknown
    with pytest.raises(ValueError):  # a non-numeric feature is refused, the unit field is not
        schema.to_array({**x, "f0": "ann", "uid": "ann"}, learning=True)
    model = _make(OnPairStrC, True, k=2, b=1)
    record = _record(np.arange(D) / 4.0, "ann")
    model.learn_one(record, True)
    assert record["uid"] == "ann" and model.step == 1 and model.unknown_features == 0
